"""Property test: random uploaded code never makes `apply` raise and never makes two kernels
diverge (DESIGN §3, §7a).

Method bodies are drawn from a small grammar of the dialect, benign and hostile operations
mixed (big numbers, repetition, reflection, raising BaseExceptions, waits, state that cannot
be pickled). Each example is applied to one kernel through the harness (whose `apply` would
raise if the kernel did), then the log is replayed on a fresh kernel and the state restored
from a checkpoint; traces and state digests must match.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gesmas.server.kernel import Kernel
from kernel_harness import H, replay

NAMES = ["a", "b", "self.x", "self._y"]
ATTRS = ["_task", "gi_frame", "value", "session", "kernel", "append", "format", "__class__"]
EXCS = ["SystemExit", "KeyboardInterrupt", "ValueError", "Interrupted", "GeneratorExit",
        "BaseException", "MemoryError"]

atoms = st.one_of(
    st.integers(-3, 3).map(str),
    st.sampled_from(["10 ** 30", "2 ** 100000", "'x'", "b'y'", "[1, 2]", "(3,)", "{'k': 1}",
                     "None", "float('nan')", "float('inf')", "object()", "self",
                     "context()", "Semaphore(1)", "(i for i in [1])", "lambda: 0",
                     "[0] * 10 ** 8", "'z' * 10 ** 9"]),
    st.sampled_from(NAMES),
)


def _expr(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "**", "//", "%", "<<", "=="]),
                  children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["len", "str", "repr", "hash", "type", "sorted", "list",
                                   "bytes", "abs"]), children).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(children, st.sampled_from(ATTRS)).map(lambda t: f"getattr({t[0]}, {t[1]!r})"),
        children.map(lambda c: f'f"{{{c}!r:>4}}"'),
        children.map(lambda c: f"'{{0.x}}{{0}}'.format({c})"),
        children.map(lambda c: f"[v for v in range(3) if v != {c}]"),
    )


exprs = st.recursive(atoms, _expr, max_leaves=6)

simple = st.one_of(
    st.tuples(st.sampled_from(NAMES), exprs).map(lambda t: f"{t[0]} = {t[1]}"),
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["+=", "*=", "**=", "<<="]), exprs)
      .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
    st.sampled_from(EXCS).map(lambda e: f"raise {e}()"),
    exprs.map(lambda e: f"return {e}"),
    st.sampled_from(["self.sem.release()", "self.sem.acquire(timeout=1)",
                     "self.sem.try_acquire()", "while True:\n    pass",
                     "Semaphore.release = None", "type(self).x = 1", "setattr(self, 'z', a)",
                     "self.x = self"]),
)


def _block(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    def indent(s: str) -> str:
        return "\n".join("    " + line for line in s.splitlines())
    return st.one_of(
        st.tuples(exprs, children).map(lambda t: f"if {t[0]}:\n{indent(t[1])}"),
        st.tuples(st.integers(0, 5), children)
          .map(lambda t: f"for i in range({t[0]}):\n{indent(t[1])}"),
        children.map(lambda c: f"try:\n{indent(c)}\nexcept BaseException:\n    pass"),
        st.lists(children, min_size=1, max_size=3).map("\n".join),
    )


bodies = st.recursive(simple, _block, max_leaves=5)


def source(body: str) -> str:
    lines = "\n".join("        " + line for line in body.splitlines())
    return ("class R:\n    def __init__(self):\n        self.x = 0\n        self._y = 1\n"
            "        self.sem = Semaphore(0)\n"
            "    def m(self, a, b):\n" + lines + "\n")


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(bodies, st.integers(1, 4))
def test_random_code_never_breaks_apply_or_determinism(body, calls):
    h = H()
    s1, s2 = h.open_session(), h.open_session()
    h.register(source(body))
    h.create("R", "r")
    for i in range(calls):
        h.call(s1 if i % 2 else s2, "r", "m", i, "arg", timeout=2.0)
    h.tick(h.ts + 1.5)
    assert h.checkpoint().error is None
    restored = Kernel.restore(h.kernel.checkpoint_blob)
    assert restored.state_digest() == h.kernel.state_digest()
    h.call(s1, "r", "m", 9, "after")
    h.tick(h.ts + 3)
    k, trace = replay(h.log)
    assert trace == h.trace
    assert k.state_digest() == h.kernel.state_digest()
