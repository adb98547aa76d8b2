"""Hostile uploaded code, run through the kernel harness (DESIGN §7a).

Every attack here must end as an error for the call (or the upload) that made it. After each
one the kernel must still serve calls, a replay of the same log on a fresh kernel must give
the same completions and state, and a checkpoint must restore to the same state.
"""
from __future__ import annotations

import pytest

from gesmas.server.kernel import Code, Config, Kernel, Query
from gesmas.server.kernel.codec import CreateObject, Invoke
from kernel_harness import H, replay

PROBE = '''
class Probe:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += 1
        return self.n
'''

QUEUE_PROBE = '''
from collections import deque
class Q:
    def __init__(self):
        self._items = deque()
        self._filled = Semaphore(0)
    def put(self, x):
        self._items.append(x)
        self._filled.release()
    def take(self):
        self._filled.acquire()
        return self._items.popleft()
    def try_take(self):
        if not self._filled.try_acquire():
            return None
        return self._items.popleft()
'''


def healthy(h: H, s: int) -> None:
    """The kernel serves calls; replay and checkpoint/restore agree with it."""
    h.register(PROBE)
    h.create("Probe", "probe-after")
    first = h.value(h.call(s, "probe-after", "bump"))
    assert h.value(h.call(s, "probe-after", "bump")) == first + 1
    k, trace = replay(h.log)
    assert trace == h.trace, "a replay of the same log gave other completions"
    assert k.state_digest() == h.kernel.state_digest()
    assert h.checkpoint().error is None
    restored = Kernel.restore(h.kernel.checkpoint_blob)
    assert restored.state_digest() == h.kernel.state_digest()


def method(body: str, *, prelude: str = "", init: str = "self.x = 0") -> str:
    lines = "\n".join("        " + line for line in body.strip("\n").splitlines())
    return f"{prelude}\nclass A:\n    def __init__(self):\n        {init}\n    def m(self):\n{lines}\n"


def call_m(body: str, *, prelude: str = "", config: Config | None = None):
    """Upload a class whose method `m` has `body`, call it; returns (h, session, error);
    the call's value is `h.last`."""
    h = H(config)
    s = h.open_session()
    reg = h.register(method(body, prelude=prelude))
    assert reg.error is None, reg.error
    created = h.create("A", "a")
    assert created.error is None, created.error
    t = h.call(s, "a", "m")
    h.last = h.results[t].value  # type: ignore[attr-defined]
    return h, s, h.results[t].error


def refused_upload(src: str) -> tuple[H, int, str]:
    h = H()
    s = h.open_session()
    reg = h.register(src)
    assert reg.error is not None and reg.error.code == Code.INVALID_ARGUMENT, reg
    return h, s, reg.error.message


# -- the rows of the issue ------------------------------------------------------------------

@pytest.mark.parametrize("exc", ["SystemExit", "KeyboardInterrupt", "GeneratorExit",
                                 "BaseException", "MemoryError", "RecursionError"])
def test_a_method_raising_any_base_exception_is_the_callers_error(exc):
    h, s, err = call_m(f"raise {exc}('boom')")
    assert err is not None and err.code == Code.APPLICATION and err.type == exc \
        or err.code == Code.RESOURCE_EXHAUSTED and exc == "MemoryError", err
    healthy(h, s)


@pytest.mark.parametrize("exc", ["SystemExit", "KeyboardInterrupt"])
def test_a_class_body_raising_system_exit_is_an_upload_error(exc):
    h, s, msg = refused_upload(f"class B:\n    raise {exc}()\n")
    assert exc in msg
    h2, s2, msg2 = refused_upload(f"raise {exc}()\nclass B:\n    pass\n")
    healthy(h, s)


def test_a_long_expression_that_breaks_the_compiler_is_an_upload_error():
    src = "class B:\n    X = " + "+".join(["1"] * 3000) + "\n"
    h, s, msg = refused_upload(src)
    assert "compile" in msg or "recursion" in msg.lower()
    deep = "class C:\n    X = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
    refused_upload(deep)
    healthy(h, s)


def test_a_three_argument_type_is_refused():
    _, _, err = call_m("self.x = type('B', (object,), {'__reduce__': lambda s: 1})()")
    assert err.code == Code.APPLICATION and "one argument" in err.message


def test_the_functional_enum_api_cannot_inject_special_methods():
    h, s, err = call_m("self.x = Enum('E', {'__reduce_ex__': 1})",
                       prelude="from enum import Enum")
    assert err is not None and "functional Enum API" in err.message
    healthy(h, s)


@pytest.mark.parametrize("body", ["self.x = (x for x in [1, 2])", "self.x = lambda: 1",
                                  "def inner():\n    return 2\nself.x = inner"])
def test_unpicklable_state_drops_only_its_object_at_the_checkpoint(body):
    h, s, err = call_m(body)
    assert err is None
    h.register(QUEUE_PROBE)
    h.create("Q", "q")
    h.call(s, "q", "put", 1)
    c = h.checkpoint()
    assert c.error is None and h.kernel.checkpoint_index == h.index
    t = h.call(s, "a", "m")
    e = h.error(t, Code.NOT_FOUND)
    assert "dropped" in e.message and "'a'" in e.message
    assert h.value(h.call(s, "q", "take")) == 1       # the other object kept its state
    healthy(h, s)


def test_big_integer_arithmetic_is_bounded():
    for body in ["return (10 ** (2 * 10 ** 7)).bit_length()",
                 "return pow(10, 10 ** 8).bit_length()",
                 "return (1 << 10 ** 9).bit_length()",
                 "x = 3\nfor i in range(40):\n    x = x * x\nreturn 1",
                 "x = 7\nx **= 10 ** 8\nreturn 1"]:
        h, s, err = call_m(body)
        assert err is not None and err.code == Code.RESOURCE_EXHAUSTED, (body, err)
    h, s, err = call_m("return math.factorial(10 ** 6)", prelude="import math")
    assert err.code == Code.RESOURCE_EXHAUSTED
    healthy(h, s)


@pytest.mark.parametrize("body", [
    "return len([i * i for i in [0] * 5 * 10 ** 7])",
    "return len('x' * 10 ** 10)",
    "return len(b'x' * 10 ** 10)",
    "return len(bytes(10 ** 10))",
    "return len(bytearray(10 ** 10))",
    "return len(type(b'')(10 ** 10))",
    "return len((1).to_bytes(10 ** 10, 'big'))",
    "return len('ab'.center(10 ** 10))",
    "return len(('x' * 1000).join(['a'] * 100000))",
    "return len('%1000000000d' % 1)",
    "return len(f'{1:>1000000000}')",
    "return len('{:>1000000000}'.format(1))",
    "s = 'x'\nwhile True:\n    s = s + s\n",
    "s = ['x']\nwhile True:\n    s += s\n",
    "self.x = 'y'\nwhile True:\n    self.x += self.x\n",
    "return len([i for i in range(10 ** 9)])",
    "return sum(range(10 ** 9))",
    "return len(list(itertools.repeat(0, 10 ** 9)))",
    "return len(list(itertools.product(range(100), repeat=100)))",
    "return len(list(itertools.permutations(range(5), 10 ** 9)))",
    "return len(list(itertools.accumulate(['x' * 1000] * 4000)))",
])
def test_native_work_is_bounded_by_size_checks_or_the_step_budget(body):
    h, s, err = call_m(body, prelude="import itertools")
    assert err is not None and err.code == Code.RESOURCE_EXHAUSTED, (body, err)
    healthy(h, s)


def test_stand_ins_for_builtin_types_behave_like_them():
    h, s, err = call_m("b = b'ab'\nreturn [isinstance(b, bytes), type(b) is bytes, "
                       "type('x') is str, isinstance('x', (int, str)), str(5), "
                       "bytes([65]), bytearray(2), bytes.fromhex('41'), str.upper('q'), "
                       "issubclass(bytes, bytes), ','.join(['a', 'b']), str.join('-', 'xy')]")
    assert err is None, err
    assert h.last == [True, True, True, True, "5", b"A", b"\x00\x00", b"A", "Q", True,
                      "a,b", "x-y"]


def test_a_big_result_is_refused():
    h, s, err = call_m("return 'x' * 3000000")
    assert err.code == Code.RESOURCE_EXHAUSTED and "returned more than" in err.message
    healthy(h, s)


def test_an_object_over_its_size_limit_takes_no_new_calls_until_deleted():
    h = H(Config(max_object_bytes=100_000))
    s = h.open_session()
    h.register(method("self.x = self.x + 'y' * 60000\nreturn len(self.x)", init="self.x = ''"))
    h.create("A", "a")
    h.value(h.call(s, "a", "m"))
    h.value(h.call(s, "a", "m"))
    assert h.checkpoint().error is None
    restored = Kernel.restore(h.kernel.checkpoint_blob, Config(max_object_bytes=100_000))
    assert restored.state_digest() == h.kernel.state_digest()
    e = h.error(h.call(s, "a", "m"), Code.RESOURCE_EXHAUSTED)
    assert "more than 100000 bytes" in e.message
    from gesmas.server.kernel import DeleteObject
    assert h.run(DeleteObject(ts=h.ts, name="a")).error is None
    h.create("A", "a")
    h.value(h.call(s, "a", "m"))


@pytest.mark.parametrize("body,prelude", [
    ("return typing.sys.modules['os'].getpid()", "import typing"),
    ("return collections._sys", "import collections"),
    ("return enum.bltns.open", "import enum"),
    ("return functools.update_wrapper", "import functools"),
    ("return dataclasses.make_dataclass", "import dataclasses"),
    ("return getattr(collections, '_sys')", "import collections"),
    ("return str(typing.get_origin(typing.Type[int]))", "import typing"),
    ("import os", ""),
    ("import collections.abc", ""),
    ("from typing import sys", ""),
])
def test_allowed_modules_expose_only_their_vetted_public_names(body, prelude):
    h, s, err = call_m(body, prelude=prelude)
    assert err is not None and err.type in ("AttributeError", "ImportError"), err
    healthy(h, s)


@pytest.mark.parametrize("body", [
    "return '{0.__class__.__mro__}'.format(self)",
    "return '{0.x}'.format(self)",
    "return '{0[x]}'.format({'x': 1})",
    "return '{x.__class__}'.format_map({'x': self})",
    "return getattr('{0.__class__}', 'format')(self)",
    "return str.format('{0.__class__}', self)",
])
def test_format_strings_cannot_reach_attributes(body):
    h, s, err = call_m(body)
    assert err is not None and err.code == Code.APPLICATION, (body, err)
    healthy(h, s)


def test_format_without_attribute_fields_still_works():
    h, s, err = call_m("return '{} {x!r} {0:>5}'.format(1, x='y') + f'{self.x!r:>3}'")
    assert err is None, err
    assert h.last == "1 'y'     1  0"


@pytest.mark.parametrize("body", [
    "return context()._task.runner.index",
    "return getattr(context(), '_task')",
    "c = context()\nreturn c._task",
    "q = Semaphore(1)\nreturn q._queue",
    "return Semaphore(1)._value",
    "f = lambda o: o._task\nreturn f(context())",
    "return getattr(context(), 'gi_frame')",
])
def test_underscore_attributes_of_kernel_objects_are_not_reachable(body):
    h, s, err = call_m(body)
    assert err is not None and err.type == "AttributeError", (body, err)
    healthy(h, s)


def test_a_method_called_on_a_foreign_self_cannot_read_its_underscore_attributes():
    src = ("class A:\n    def __init__(self):\n        self._task = 1\n"
           "    def peek(self):\n        return self._task\n"
           "    def m(self):\n        return A.peek(context())\n")
    h = H()
    s = h.open_session()
    h.register(src)
    h.create("A", "a")
    assert h.value(h.call(s, "a", "peek")) == 1
    e = h.error(h.call(s, "a", "m"), Code.APPLICATION)
    assert e.type == "TypeError" and "Context" in e.message


@pytest.mark.parametrize("body", [
    "Semaphore.try_acquire = lambda self: True",
    "setattr(Semaphore, 'try_acquire', lambda self: True)",
    "type(Semaphore(1)).try_acquire = lambda self: True",
    "s = Semaphore(1)\ns.value = 5",
    "context().session = 1",
    "A.m = lambda self: 1",
    "type(self).m = lambda self: 1",
    "collections.deque = list",
    "delattr(Semaphore, 'try_acquire')",
])
def test_primitives_classes_and_modules_cannot_be_patched(body):
    h, s, err = call_m(body, prelude="import collections")
    assert err is not None and err.type in ("TypeError", "AttributeError"), (body, err)
    h.register(QUEUE_PROBE)
    h.create("Q", "q")
    assert h.value(h.call(s, "q", "try_take")) is None      # the primitive is unchanged
    healthy(h, s)


def test_identity_is_not_observable():
    h, s, err = call_m("return repr(object())")
    assert err is None and "0x" not in h.last
    h, s, err = call_m("return repr(self)")
    assert err is None and h.last == "<A object>"
    for body in ["return hash(object())", "return len({object(), object()})",
                 "return hash(self)", "return len({self})"]:
        h, s, err = call_m(body)
        assert err is not None and err.type == "TypeError", (body, err)
    h, s, err = call_m("return repr(lambda: 1) + f'{[len]} {self.m!r}' + str(lambda: 2) + "
                       "str([self.m]) + '%s' % (lambda: 3) + format(lambda: 4)")
    assert err is None and "0x" not in h.last, h.last
    healthy(h, s)


def test_del_and_other_special_methods_are_refused_at_upload():
    for name in ["__del__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
                 "__init_subclass__", "__class_getitem__", "__getattribute__"]:
        refused_upload(f"class B:\n    def {name}(self, *a):\n        return 1\n")


@pytest.mark.parametrize("src", [
    "X = []\nclass B:\n    pass\n",
    "class B:\n    X = {}\n",
    "class B:\n    def m(self, acc=[]):\n        acc.append(1)\n",
    "class B:\n    pass\nDEFAULT = B()\n",
    "S = Semaphore(1)\nclass B:\n    pass\n",
    "def make():\n    box = [0]\n    def f():\n        box[0] += 1\n    return f\ninc = make()\n"
    "class B:\n    pass\n",
    "class B:\n    pass\nclass C:\n    b = B()\n",
    "import functools\nclass B:\n    pass\np = functools.partial(len, x=[])\n",
])
def test_module_and_class_level_state_must_be_immutable(src):
    h, s, msg = refused_upload(src)
    assert "module or class level" in msg or "module" in msg, msg
    healthy(h, s)


def test_global_statements_and_class_attribute_writes_are_refused():
    refused_upload("N = 0\nclass B:\n    def m(self):\n        global N\n        N += 1\n")
    h, s, err = call_m("A.count = 3")
    assert err.type == "TypeError" and "read-only" in err.message
    healthy(h, s)


def test_immutable_module_level_values_are_fine():
    src = ("import enum\nLIMITS = (1, 2, frozenset({3}))\nNAME = 'x'\nMISSING = object()\n"
           "class Color(enum.Enum):\n    RED = 1\n    BLUE = (2, 3)\n"
           "class B:\n    KIND = 'b'\n    def m(self, a=None):\n"
           "        return [LIMITS[0], NAME, Color.BLUE.value[1], self.KIND, a is MISSING]\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None
    h.create("B", "b")
    assert h.value(h.call(s, "b", "m")) == [1, "x", 3, "b", False]


def test_enum_members_cannot_be_given_attributes():
    src = ("import enum\nclass Color(enum.Enum):\n    RED = 1\n"
           "class B:\n    def m(self):\n        Color.RED.extra = 5\n")
    h = H()
    s = h.open_session()
    h.register(src)
    h.create("B", "b")
    h.error(h.call(s, "b", "m"), Code.APPLICATION)


def test_classes_can_only_be_made_while_the_source_loads():
    h, s, err = call_m("class Inner:\n    pass\nreturn 1")
    assert err.type == "TypeError" and "while the source loads" in err.message
    healthy(h, s)


@pytest.mark.parametrize("src", [
    "class B(Semaphore):\n    pass\n",
    "class N(int):\n    def bit_length(self):\n        return 0\n",
    "class L(list):\n    def __len__(self):\n        return 0\n",
    "class D(dict):\n    def items(self):\n        return iter([])\n",
    "import collections\nclass Q(collections.deque):\n    pass\n",
    "class B(type):\n    pass\n",
    "class B(metaclass=type):\n    pass\n",
    "import typing\nclass B(typing.Protocol):\n    pass\n",
])
def test_kernel_classes_and_metaclasses_cannot_be_derived_from(src):
    refused_upload(src)


def test_nan_timeouts_are_refused_and_other_timeouts_still_fire():
    src = ("class W:\n    def __init__(self):\n        self.s = Semaphore(0)\n"
           "    def wait(self, t):\n        return self.s.acquire(timeout=t)\n")
    h = H()
    s = h.open_session()
    h.register(src)
    h.create("W", "w")
    nan = float("nan")
    e = h.error(h.call(s, "w", "wait", nan), Code.APPLICATION)
    assert e.type == "ValueError" and "nan" in e.message
    h.error(h.call(s, "w", "wait", -1.0), Code.APPLICATION)
    t_call = h.call(s, "w", "wait", None, timeout=nan)
    h.error(t_call, Code.INVALID_ARGUMENT)
    forever = h.call(s, "w", "wait", float("inf"))
    due = h.call(s, "w", "wait", 5.0)
    h.tick(h.ts + 6)
    h.error(due, Code.TIMEOUT)
    assert not h.done(forever)
    healthy(h, s)


# -- more of our own ------------------------------------------------------------------------

def test_an_exception_whose_str_raises_or_loops_is_still_reported():
    for body in ["def __str__(self):\n        raise SystemExit()",
                 "def __str__(self):\n        while True:\n            pass",
                 "def __str__(self):\n        return 5"]:
        src = (f"class E(Exception):\n    {body}\n"
               "class A:\n    def m(self):\n        raise E()\n")
        h = H()
        s = h.open_session()
        assert h.register(src).error is None
        h.create("A", "a")
        e = h.error(h.call(s, "a", "m"), Code.APPLICATION)
        assert e.type == "E" and "unprintable" in e.message
        healthy(h, s)


def test_raising_interrupted_or_other_wait_errors_by_hand_is_harmless():
    for exc in ["Interrupted", "Timeout", "SessionEnded", "Aborted"]:
        h, s, err = call_m(f"raise {exc}('by hand')")
        assert err is not None, exc
        healthy(h, s)


def test_constructors_and_session_hooks_that_raise_anything():
    src = ("class A:\n    def __init__(self, how):\n        if how == 'exit':\n"
           "            raise SystemExit()\n        if how == 'int':\n"
           "            raise Interrupted()\n        self.how = how\n"
           "    def touch(self):\n        return 1\n"
           "    def _on_session_end(self, session):\n        raise KeyboardInterrupt()\n")
    h = H()
    s = h.open_session()
    h.register(src)
    for how in ["exit", "int"]:
        assert h.create("A", f"a-{how}", how).error is not None
    assert h.create("A", "a", "ok").error is None
    s2 = h.open_session()
    h.value(h.call(s2, "a", "touch"))
    from gesmas.server.kernel import CloseSession
    assert h.run(CloseSession(ts=h.ts, session=s2)).error is None
    healthy(h, s)


def test_deep_recursion_and_cyclic_results_are_errors():
    h, s, err = call_m("def f(n):\n    return f(n + 1)\nreturn f(0)")
    assert err.type == "RecursionError"
    h, s, err = call_m("x = []\nx.append(x)\nreturn x")
    assert err is not None
    h, s, err = call_m("x = []\nfor i in range(100000):\n    x = [x]\nreturn x")
    assert err is not None
    healthy(h, s)


def test_a_garbage_log_entry_is_skipped():
    h = H()
    s = h.open_session()
    h.index += 1
    assert h.kernel.apply(h.index, b"\x01" + b"L\x01" * 200000 + b"N") == []
    h.index += 1
    assert h.kernel.apply(h.index, b"\xff\x00garbage") == []
    h.index += 1
    assert h.kernel.apply(h.index, b"") == []
    s2 = h.open_session()
    assert s2 > s


def test_a_kernel_bug_fails_only_its_command(monkeypatch):
    h = H()
    s = h.open_session()
    h.register(PROBE)
    h.create("Probe", "p")

    def broken(cmd):
        raise ZeroDivisionError("a bug")
    monkeypatch.setitem(h.kernel._handlers, Invoke, broken)
    e = h.error(h.call(s, "p", "bump"), Code.INTERNAL)
    assert "ZeroDivisionError" in e.message
    monkeypatch.undo()
    assert h.value(h.call(s, "p", "bump")) == 1


def test_the_operator_can_skip_a_poison_entry():
    """Recovery for an entry that kills the process (README "A poison log entry"): every
    replica is started with the same skip list and the entry completes as INTERNAL."""
    h = H()
    s = h.open_session()
    h.register(PROBE)
    h.create("Probe", "p")
    poison = h.index + 1
    t = h.call(s, "p", "bump")
    h.call(s, "p", "bump")
    k, trace = replay(h.log, Kernel(Config(skip_entries=frozenset({poison}))))
    by_tag = {c.tag: c for _, cs in trace for c in cs}
    assert by_tag[t].error.code == Code.INTERNAL and "skipped" in by_tag[t].error.message
    assert [c.value for _, cs in trace[-1:] for c in cs] == [1]


def test_a_huge_source_is_refused():
    refused_upload("class B:\n    pass\n" + "#" * 300_000 + "\n")


def test_standard_objects_are_unaffected_by_a_hostile_neighbour():
    from gesmas.objects import standard_sources
    h = H()
    s = h.open_session()
    for _, src in standard_sources():
        assert h.register(src).error is None
    h.run(CreateObject(ts=h.ts, class_name="Queue", name="jobs"))
    h.register(method("Semaphore.release = lambda self, n=1: None"))
    h.create("A", "a")
    h.error(h.call(s, "a", "m"))
    consumer = h.call(s, "jobs", "consume")
    h.call(s, "jobs", "produce", "item")
    assert h.value(consumer) == "item"
    assert h.run(Query(ts=h.ts, what="digest")).value == h.kernel.state_digest(volatile=False)


@pytest.mark.parametrize("body", [
    "return round(5, -10 ** 7)",
    "a = [0]\nwhile True:\n    a.extend(a)",
    "a = [0]\nwhile True:\n    a[len(a):] = a",
    "d = collections.deque([0])\nwhile True:\n    d.extend(d)",
    "return len(('a' * 4000000).translate({97: 'x' * 4000}))",
    "return len('%(a)1000000000s' % {'a': 1})",
    "return len(list(collections.Counter({'a': 10 ** 12}).elements()))",
])
def test_native_amplifiers_on_subclasses_and_in_place_growth_are_bounded(body):
    h, s, err = call_m(body, prelude="import collections")
    assert err is not None and err.code == Code.RESOURCE_EXHAUSTED, (body, err)
    healthy(h, s)


@pytest.mark.parametrize("loop", [
    "for i in range(1000):\n    sorted(self.big)",
    "for i in range(1000):\n    -1 in self.big",
    "for i in range(1000):\n    list(self.big)",
    "for i in range(1000):\n    self.big[:]",
    "for i in range(1000):\n    self.big.index(self.big[-1])",
    "for i in range(1000):\n    max(self.big)",
    "for i in range(1000):\n    str(self.big)",
])
def test_native_scans_of_big_state_cost_steps(loop):
    """Work over state that is already big (built over several calls) is charged by its
    size, so a loop of native scans cannot stall the apply thread."""
    src = ("class Big:\n    def __init__(self):\n        self.big = []\n"
           "    def grow(self):\n        self.big.extend(range(len(self.big), len(self.big) + 100000))\n"
           "    def scan(self):\n" + "\n".join("        " + x for x in loop.splitlines()) + "\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None
    h.create("Big", "b")
    for _ in range(6):
        h.value(h.call(s, "b", "grow"))
    h.error(h.call(s, "b", "scan"), Code.RESOURCE_EXHAUSTED)


def test_runtime_internals_of_enums_are_out_of_reach():
    refused_upload("import enum\nclass C(enum.Enum):\n    A = 1\n"
                   "class B:\n    def m(self):\n        return C._member_map_\n")
    h, s, err = call_m("return getattr(C, '_member_map_')",
                       prelude="import enum\nclass C(enum.Enum):\n    A = 1\n")
    assert err.type == "AttributeError"


def test_stand_in_containers_behave_like_the_builtins_and_survive_checkpoints():
    src = ("import collections\nclass S:\n    def __init__(self):\n"
           "        self.d = collections.defaultdict(list)\n"
           "    def m(self):\n        self.d['k'].append(1)\n"
           "        x = [1, 2]\n        return [isinstance(x, list), type(x) is list, "
           "type({}) == dict, list(range(3)), dict(a=1), sorted({3, 1}), tuple([1]), "
           "isinstance(self.d, dict), 2 in x, 3 not in x, x[1:], len(set([1, 1]))]\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None
    h.create("S", "s")
    assert h.value(h.call(s, "s", "m")) == [True, True, True, [0, 1, 2], {"a": 1}, [1, 3],
                                            [1], True, True, True, [2], 1]
    healthy(h, s)


def test_an_object_growing_between_checkpoints_is_measured_by_the_steps_it_spends():
    """No checkpoint here: the size is measured again once the calls on the object spent
    enough steps to have grown by a quarter of the limit."""
    h = H(Config(max_object_bytes=1_000_000))
    s = h.open_session()
    h.register(method("self.x.append('y' * 60000)\nreturn len(self.x)", init="self.x = []"))
    h.create("A", "a")
    results = [h.results[h.call(s, "a", "m")] for _ in range(40)]
    ok = [c for c in results if c.error is None]
    refused = [c for c in results if c.error is not None]
    assert refused and all(c.error.code == Code.RESOURCE_EXHAUSTED for c in refused)
    assert 16 <= len(ok) <= 25, len(ok)      # ~1 MB of 60 KB strings, measured every ~250 KB
    k, trace = replay(h.log, Kernel(Config(max_object_bytes=1_000_000)))
    assert trace == h.trace


def test_state_size_is_the_same_for_shared_and_unshared_immutables():
    from gesmas.server.kernel.limits import state_size
    word = "".join(["ab", "cd"])
    shared = [word, word, (word,), {"k": word}]
    unshared = ["abcd", "".join(["a", "bcd"]), ("abcd",), {"k": "ab" + "cd"}]
    assert state_size(shared, 10 ** 9) == state_size(unshared, 10 ** 9)
    nested: object = (1,)
    for _ in range(200):
        nested = (nested, nested)            # 2^200 paths: the walk stops at the limit
    assert state_size(nested, 10_000) > 10_000


def test_a_checkpoint_of_the_previous_format_still_restores():
    """Snapshots written before per-object checkpoints (format 1) load after an upgrade."""
    import io
    import pickle
    from gesmas.objects import standard_sources
    h = H()
    s = h.open_session()
    for _, src in standard_sources():
        h.register(src)
    h.run(CreateObject(ts=h.ts, class_name="Queue", name="q"))
    h.call(s, "q", "produce", "kept")
    k = h.kernel
    buf = io.BytesIO()
    pickle.dump(k.registry.dump(), buf, protocol=5)
    p = pickle.Pickler(buf, protocol=5)
    p.persistent_id = k.registry.persistent_id
    p.dump(({"format": 1, "index": k.index, "now": k.now, "order": k.runner.order,
             "sessions": k.sessions,
             "objects": [(n, r.cls.name, r.cls.version, r.instance)
                         for n, r in k.objects.items()]}, []))
    restored = Kernel.restore(buf.getvalue())
    assert restored.state_digest() == k.state_digest()


@pytest.mark.parametrize("rebind,attr", [
    ("(self := Semaphore(3))", "_value"),
    ("for self in [Semaphore(3)]:\n    pass", "_value"),
    ("self = Semaphore(3)", "_value"),
    ("import collections as self", "_names"),
    ("f = lambda self: self._value\nreturn f(Semaphore(3))", "_value"),
])
def test_a_method_that_rebinds_self_does_not_read_underscore_names_natively(rebind, attr):
    body = rebind + f"\nreturn self.{attr}"
    h, s, err = call_m(body)
    assert err is not None and err.type == "AttributeError" and "not accessible" in err.message, \
        (body, err)


# -- a red-team review's findings (each broke a promise before its fix) ----------------------

@pytest.mark.parametrize("body,prelude", [
    ("dataclasses.dataclass(object)", "import dataclasses"),
    ("dataclasses.dataclass(frozen=True)(Semaphore)", "import dataclasses"),
    ("dataclasses.dataclass(type(context()))", "import dataclasses"),
    ("functools.total_ordering(Semaphore)", "import functools"),
    ("dataclasses.dataclass(A)", "import dataclasses"),
])
def test_class_decorators_cannot_change_classes_at_run_time(body, prelude):
    h, s, err = call_m(body, prelude=prelude)
    assert err is not None and err.type == "TypeError", (body, err)
    h2 = H()
    s2 = h2.open_session()
    h2.register(QUEUE_PROBE)
    h2.create("Q", "q")
    h2.call(s2, "q", "put", 1)
    assert h2.value(h2.call(s2, "q", "try_take")) == 1        # other kernels unaffected
    healthy(h, s)


def test_class_decorators_still_work_where_the_class_is_defined():
    src = ("import dataclasses, functools\n@dataclasses.dataclass(frozen=True)\nclass P:\n"
           "    pass\n@functools.total_ordering\nclass V:\n    def __init__(self, n):\n"
           "        self.n = n\n    def __eq__(self, o):\n        return self.n == o.n\n"
           "    def __lt__(self, o):\n        return self.n < o.n\n"
           "class B:\n    def m(self):\n        return [P() == P(), V(2) >= V(1), hash(P()) == hash(P())]\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None
    h.create("B", "b")
    assert h.value(h.call(s, "b", "m")) == [True, True, True]


@pytest.mark.parametrize("body", [
    "return hash(float('nan'))",
    "return hash(len)",
    "return hash(A)",
    "return hash(lambda: 1)",
    "return hash(self.m)",
])
def test_hashes_that_are_addresses_are_refused(body):
    h, s, err = call_m(body)
    assert err is not None and err.type == "TypeError", (body, err)


@pytest.mark.parametrize("src", [
    "class function:\n    pass\nSHARED = function()\nclass B:\n    pass\n",
    "import dataclasses\nF = dataclasses.field(default=0, metadata={'k': []})\nclass B:\n    pass\n",
    "import collections\nP = collections.namedtuple('P', 'a', defaults=[[]])\nclass B:\n    pass\n",
])
def test_more_mutable_module_level_state_is_refused(src):
    refused_upload(src)


def test_namedtuples_at_module_level_are_fine():
    src = ("import collections\nP = collections.namedtuple('P', 'a b', defaults=(1,))\n"
           "class B:\n    def m(self):\n        return [P(0).b, P(5, 6)._asdict()]\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None, h.register(src)
    h.create("B", "b")
    assert h.value(h.call(s, "b", "m")) == [1, {"a": 5, "b": 6}]


def test_cached_property_is_not_available():
    refused_upload("import functools\nclass B:\n    @functools.cached_property\n"
                   "    def box(self):\n        return []\n")


def test_generators_with_clean_up_are_refused_at_upload():
    for body in ["try:\n    yield 1\nfinally:\n    self.x += 1",
                 "try:\n    yield 1\nexcept GeneratorExit:\n    self.x += 1",
                 "with self.lock:\n    yield 1"]:
        refused_upload(method(body))
    h, s, err = call_m("def g():\n    yield 1\nreturn list(g())")
    assert err is None and h.last == [1]


def test_a_restore_that_fails_for_one_object_keeps_the_others(monkeypatch):
    import gesmas.server.kernel.checkpoint as ck
    h = H()
    s = h.open_session()
    h.register(QUEUE_PROBE)
    h.create("Q", "q")
    h.create("Q", "q2")
    h.call(s, "q", "put", 1)
    assert h.checkpoint().error is None
    original, calls = ck.unpickle_state, []

    def first_fails(k, data):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("refuse")
        return original(k, data)
    monkeypatch.setattr(ck, "unpickle_state", first_fails)
    k = Kernel.restore(h.kernel.checkpoint_blob)
    assert list(k.objects) == ["q2"] and "refuse" in k.dropped["q"]


@pytest.mark.parametrize("body", [
    "return any(iter(int, 1))",
    "return max(range(3 * 10 ** 8)[:])",
    "t = ()\nfor i in range(28):\n    t = (t, t)\nreturn hash(t)",
    "a = []\nfor i in range(22):\n    a = [a, a]\nreturn len(repr(a))",
    "a = []\nfor i in range(22):\n    a = [a, a]\nreturn a",
    "a = []\nfor i in range(22):\n    a = [a, a]\nreturn len(f'{a}')",
    "s = b'x' * 1000\nfor i in range(6):\n    s = s.hex(':').encode('utf-32')\nreturn len(s)",
    "d = collections.deque([0])\nfor i in range(25):\n    d.extendleft(d)\nreturn len(d)",
    "x = int.from_bytes(bytes(range(256)) * 8000, 'big')\nreturn x.bit_length()",
    "x = int('f' * 100000, 16)\nreturn x.bit_length()",
    "m = (1 << 65000) + 1\nreturn pow(3, -(1 << 2000), m)",
    "return len('abc'.encode('punycode'))",
])
def test_more_native_work_is_bounded(body):
    h, s, err = call_m(body, prelude="import collections")
    assert err is not None and err.code == Code.RESOURCE_EXHAUSTED, (body, err)
    healthy(h, s)


def test_a_shared_tree_in_state_does_not_stall_the_digest_or_a_checkpoint():
    src = ("class B:\n    def __init__(self):\n        t = ()\n"
           "        for i in range(40):\n            t = (t, t)\n        self.t = t\n"
           "    def m(self):\n        return 1\n")
    # a measure once walked such a tree reference by reference up to max_object_bytes:
    # ~12 s at the default 64 MiB (now the ~40 distinct tuples: measure.py)
    config = Config()
    assert config.max_object_bytes >= 64 << 20
    h = H(config)
    s = h.open_session()
    assert h.register(src).error is None
    h.create("B", "b")
    h.kernel.state_digest()
    assert h.checkpoint().error is None
    assert Kernel.restore(h.kernel.checkpoint_blob, config).state_digest() == \
        h.kernel.state_digest()


@pytest.mark.parametrize("body", [
    "for f in {len, abs}:\n    pass",
    "return list({A, Semaphore})",
    "return [x for x in {Semaphore(1), Semaphore(2)}]",
    "return repr({lambda: 1})",
    "return sorted({float('nan'), 1.5})",
    "return {len}.pop()",
    "return list(enumerate({abs}))",
    "return ','.join({str(x) for x in [1, 2]} | {repr(len)}) and [t for t in {(len,)}]",
])
def test_sets_whose_order_would_differ_between_replicas_cannot_be_iterated(body):
    h, s, err = call_m(body)
    assert err is not None and err.type == "TypeError" and "same on every replica" in err.message, \
        (body, err)


def test_sets_of_plain_values_iterate_as_usual():
    h, s, err = call_m("s = {3, 1, 2}\nreturn [sorted(s), len([x for x in s]), "
                       "sorted(list(frozenset(['a', 'b']))), {1, 2}.pop() in (1, 2)]")
    assert err is None and h.last == [[1, 2, 3], 3, ["a", "b"], True]
