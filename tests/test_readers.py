"""Readers: declared read-only methods run on the applied state without a log entry
(kernel/readers.py). No reader, however written, changes what the replicas hold."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gesmas.server.kernel import Code, KernelError
from gesmas.server.kernel.sched import NotYet
from kernel_harness import H

SRC = '''
import collections, heapq

class Oops(Exception):
    pass

class Node:
    def __init__(self):
        self.tags = ["a"]

class Box:
    _readers = ("get", "view", "scribble", "signal", "who", "until", "draw")

    def __init__(self):
        self.n = 0
        self.items = [3, 1, 2]
        self.d = {"k": [1, 2]}
        self.s = {1, 2}
        self.q = collections.deque([1, 2])
        self.node = Node()
        self.it = iter([1, 2, 3])
        self.gate = Semaphore(0)
        self.err = Oops("x")

    def get(self, k=1):
        return self.n * k

    def view(self):
        return {"n": self.n, "items": sorted(self.items), "d": self.d, "waiting": self.gate.waiters}

    def scribble(self, how):
        exec_ = {
            "attr": lambda: setattr(self, "n", self.n + 1),
            "append": lambda: self.items.append(9),
            "sort": lambda: self.items.sort(),
            "nested": lambda: self.d["k"].append(3),
            "dict": lambda: self.d.pop("k"),
            "set": lambda: self.s.add(5),
            "deque": lambda: self.q.rotate(1),
            "heap": lambda: heapq.heappush(self.items, 0),
            "deep": lambda: self.node.tags.append("b"),
            "next": lambda: next(self.it),
            "args": lambda: setattr(self.err, "args", (1,)),
            "helper": lambda: self._bump(),
        }
        exec_[how]()
        return how

    def _bump(self):
        self.n += 10

    def signal(self):
        self.gate.release()

    def who(self):
        return context().session

    def draw(self):
        return self.n

    def until(self, at):
        if self.n < at:
            raise NotYet()
        return self.n

    def inc(self):
        self.n += 1
        return self.n

    def wait(self):
        self.gate.acquire()
'''

WAYS = ["attr", "append", "sort", "nested", "dict", "set", "deque", "heap", "deep", "next",
        "args", "helper"]


def box() -> tuple[H, int]:
    h = H()
    s = h.open_session()
    assert h.register(SRC).error is None
    assert h.create("Box", "b").error is None
    return h, s


def test_a_reader_answers_from_the_applied_state_without_an_entry():
    h, s = box()
    index, digest = h.kernel.index, h.kernel.state_digest()
    assert h.kernel.read("", "b", "get", [2]) == 0
    h.call(s, "b", "inc")
    assert h.kernel.read("", "b", "get", [2]) == 2           # the copy follows the entries
    assert h.kernel.read("", "b", "view")["items"] == [1, 2, 3]
    assert h.kernel.index == index + 1
    t = h.call(s, "b", "wait")                                # a waiter: counted in the copy
    assert not h.done(t) and h.kernel.read("", "b", "view")["waiting"] == 1
    assert digest != h.kernel.state_digest()


@pytest.mark.parametrize("how", WAYS)
def test_a_reader_that_writes_is_refused_and_changes_nothing(how):
    h, s = box()
    h.call(s, "b", "inc")
    before = h.kernel.state_digest()
    with pytest.raises(KernelError) as failed:
        h.kernel.read("", "b", "scribble", [how])
    assert failed.value.error.code == Code.APPLICATION
    assert failed.value.error.type == "ReadOnlyViolation", failed.value.error
    assert "scribble" in failed.value.error.message
    assert h.kernel.state_digest() == before
    assert h.kernel.read("", "b", "get") == 1                 # a fresh copy: the write is gone
    assert h.value(h.call(s, "b", "inc")) == 2


@pytest.mark.parametrize("method, what", [("signal", "Semaphore.release"),
                                          ("who", "context()")])
def test_a_reader_may_not_wake_wait_or_ask_for_its_call(method, what):
    h, s = box()
    t = h.call(s, "b", "wait")
    with pytest.raises(KernelError) as failed:
        h.kernel.read("", "b", method)
    assert what in failed.value.error.message and "reader" in failed.value.error.message
    assert not h.done(t)


def test_only_declared_readers_of_existing_objects_are_read():
    h, s = box()
    with pytest.raises(KernelError) as failed:
        h.kernel.read("", "b", "inc")
    assert failed.value.error.code == Code.INVALID_ARGUMENT and "_readers" in str(failed.value)
    with pytest.raises(KernelError) as failed:
        h.kernel.read("", "nope", "get")
    assert failed.value.error.code == Code.NOT_FOUND
    with pytest.raises(KernelError) as failed:
        h.kernel.read("", "b", "get", [1, 2, 3])
    assert failed.value.error.code == Code.INVALID_ARGUMENT
    assert h.kernel.is_reader("b", "get") and not h.kernel.is_reader("b", "inc")
    assert not h.kernel.is_reader("nope", "get")


def test_a_reader_waits_for_an_entry_that_runs_on_its_object():
    h, s = box()
    with pytest.raises(NotYet):
        h.kernel.read("", "b", "until", [2])
    h.call(s, "b", "inc")
    assert h.kernel.touched == {"b"}
    with pytest.raises(NotYet):
        h.kernel.read("", "b", "until", [2])
    h.call(s, "b", "inc")
    assert h.kernel.read("", "b", "until", [2]) == 2


def test_the_standard_classes_readers_run_on_the_live_object_and_change_nothing():
    from gesmas.objects import RESERVED_CLASSES, standard_sources
    from gesmas.server.kernel import Config, RegisterClass
    from gesmas.server.kernel.auth import SYSTEM
    h = H(Config(reserved_classes=RESERVED_CLASSES))
    s = h.open_session()
    for _, src in standard_sources():
        assert h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM)).error is None
    h.create("Counter", "c", 5)
    h.call(s, "c", "add", 2)
    assert h.kernel.read("", "c", "get") == 7
    made = {"Counter": "c", "Queue": "q", "Lock": "l", "Semaphore": "s", "Barrier": "b",
            "CountDownLatch": "cd", "ReadWriteLock": "rw", "LeaderElection": "e", "Group": "g",
            "Election": "ge", "DoubleBarrier": "db", "Map": "m"}
    ctor = {"Semaphore": [2], "Barrier": [2], "CountDownLatch": [1], "DoubleBarrier": [2]}
    for cls, name in made.items():
        if cls != "Counter":
            assert h.create(cls, name, *ctor.get(cls, [])).error is None, cls
    h.call(s, "q", "produce", None)
    h.call(s, "l", "acquire")
    h.call(s, "g", "join", "m1")
    h.call(s, "e", "campaign", "v")
    h.call(s, "m", "put", "k", [1], True)
    before = h.kernel.state_digest()
    seen = 0
    for cls, name in made.items():
        rec = h.kernel.state.objects[name]
        for method in rec.cls.cls._readers:
            args = (["m1"] if method == "member" else
                    ["k"] if method in ("get", "entry") and name == "m" else
                    [""] if method in ("items", "keys", "watch") else [])
            try:
                h.kernel.read("", name, method, args)
            except KernelError as e:
                assert e.error.code == Code.APPLICATION, (cls, method, e.error)
            seen += 1
    assert seen >= 20 and h.kernel.state_digest() == before
    assert h.kernel.read("", "q", "peek") is None and h.kernel.read("", "q", "size") == 1
    assert h.kernel.read("", "l", "holder")["session"] == s


BODIES = ["self.n += 1", "self.items.append(1)", "self.items[0] = 7", "del self.items[0]",
          "self.d['z'] = 1", "self.d['k'][0] = 5", "self.s.discard(1)", "self.q.append(3)",
          "self.node.tags = []", "self.node.extra = 1", "next(self.it)", "x = self.items",
          "x = list(self.items)\n        x.append(1)", "self.items.reverse()",
          "self.d.setdefault('y', [])", "self.err.args = ()", "self.items += [1]",
          "self.q.popleft()", "return self.n", "setattr(self.node, 'tags', None)",
          "self.d.update(k=0)", "self.s |= {9}", "self.gate.try_acquire()",
          "self.items.sort(reverse=True)", "del self.d['k']", "self.node.tags.clear()"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(BODIES), min_size=1, max_size=4))
def test_no_reader_however_written_changes_the_state(lines):
    """Any reader body (here: generated from statements that read and write every kind of
    state) either answers or is refused; the state digest is the same afterwards."""
    src = SRC.replace('_readers = ("get",', '_readers = ("made", "get",') + \
        "\n    def made(self):\n" + "".join(f"        {line}\n" for line in lines) + \
        "        return 0\n"
    h = H()
    s = h.open_session()
    assert h.register(src).error is None, h.register(src).error
    h.create("Box", "b")
    h.call(s, "b", "inc")
    before = h.kernel.state_digest()
    try:
        h.kernel.read("", "b", "made")
    except KernelError as e:
        assert e.error.code in (Code.APPLICATION, Code.RESOURCE_EXHAUSTED), e.error
    assert h.kernel.state_digest() == before
    assert h.kernel.read("", "b", "get") == 1


def test_a_standard_long_poll_is_a_reader_that_waits():
    """LeaderElection.observe and Group.changes wait through a semaphore: in a reader an
    acquire that would wait raises NotYet (the replica runs the reader again after later
    entries), one that would take a permit is refused; through the log they block as ever."""
    from gesmas.objects import RESERVED_CLASSES, standard_sources
    from gesmas.server.kernel import Config, RegisterClass
    from gesmas.server.kernel.auth import SYSTEM
    h = H(Config(reserved_classes=RESERVED_CLASSES))
    a, b = h.open_session(), h.open_session()
    for _, src in standard_sources():
        assert h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM)).error is None
    h.create("LeaderElection", "e")
    h.create("Group", "g")
    assert h.kernel.read("", "e", "observe", [123]) is None          # the term differs
    term = h.kernel.state.objects["e"].instance._term
    with pytest.raises(NotYet):
        h.kernel.read("", "e", "observe", [term])
    won = h.value(h.call(a, "e", "campaign", "A"))
    assert h.kernel.read("", "e", "observe", [term]) == {"session": a, "value": "A",
                                                         "term": won["term"]}
    v = h.kernel.read("", "g", "changes")["version"]
    with pytest.raises(NotYet):
        h.kernel.read("", "g", "changes", [v])
    h.call(b, "g", "join", "m")
    assert h.kernel.read("", "g", "changes", [v])["members"] == ["m"]


def test_in_a_reader_an_acquire_that_would_take_a_permit_is_refused():
    src = SRC.replace('_readers = ("get",', '_readers = ("take", "peek_permit", "get",') + (
        "\n    def take(self):\n        self.gate.release\n        return self.gate.try_acquire()\n"
        "\n    def peek_permit(self):\n        return self.gate.acquire(timeout=0)\n")
    h = H()
    s = h.open_session()
    assert h.register(src).error is None
    h.create("Box", "b")
    assert h.kernel.read("", "b", "take") is False                   # nothing to take
    assert h.kernel.read("", "b", "peek_permit") is False
    h.call(s, "b", "signal")                                          # a permit now
    with pytest.raises(KernelError) as refused:
        h.kernel.read("", "b", "take")
    assert "would take a permit" in refused.value.error.message
