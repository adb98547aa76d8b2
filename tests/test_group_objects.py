"""Group, Election and SharedLock (objects/gesmas/objects/group.py, the tooz driver's server
side) on the kernel harness: deterministic, no cluster."""
from __future__ import annotations

import pytest

try:
    from tests.test_objects import APP, ENDS, OH, TIMEOUT
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from test_objects import APP, ENDS, OH, TIMEOUT


@pytest.mark.parametrize("how", ENDS)
def test_group_members_leave_with_their_session(how):
    h = OH()
    h.make("Group", "g")
    a, b = h.sessions(2)
    assert h.ok(a, "g", "claim") is True and h.ok(b, "g", "claim") is False
    h.ok(a, "g", "join", "m1", b"caps")
    h.fails(b, "g", "join", "m1", None, type="MemberAlreadyExist")
    h.ok(b, "g", "join", "m2", None)
    h.fails(a, "g", "check_empty", type="GroupNotEmpty")
    v = h.ok(a, "g", "changes")["version"]
    poll = h.call(a, "g", "changes", v)
    assert h.waiting(poll)
    h.end(how, b)
    assert h.value(poll)["members"] == ["m1"]
    assert h.ok(a, "g", "members_caps") == {"m1": b"caps"}
    assert h.ok(a, "g", "member", "m1")["capabilities"] == b"caps"
    h.fails(a, "g", "member", "m2", type="MemberNotJoined")


def test_group_a_member_may_be_removed_by_another_session():
    h = OH()
    h.make("Group", "g")
    a, b = h.sessions(2)
    h.ok(a, "g", "join", "m1", None)
    h.ok(b, "g", "leave", "m1")                      # tooz: same member id, other coordinator
    h.fails(b, "g", "leave", "m1", type="MemberNotJoined")
    h.ok(a, "g", "check_empty")


@pytest.mark.parametrize("how", ENDS)
def test_group_max_bytes_refuses_a_join_or_update_and_members_can_still_leave(how):
    """Member ids and capabilities (200 bytes a member for its record) stay under
    max_bytes. 197 members with 250 KiB of capabilities took a group past the kernel's
    64 MiB an object, and from the next checkpoint not even a leave was taken."""
    h = OH()
    h.make("Group", "g", max_bytes=700)
    a, b = h.sessions(2)
    h.ok(a, "g", "join", "m1", "x" * 98)                    # 2 + 98 + 200: 300
    h.ok(b, "g", "join", "m2", ["y" * 90])                  # 2 + 8 + 90 + 200: 300
    for call in (["join", "m3", "z" * 99], ["update", "m1", "x" * 199]):
        e = h.fails(a, "g", *call, type="ValueError")
        assert "max_bytes (700)" in e.message, call
    assert h.ok(a, "g", "members") == ["m1", "m2"]
    assert h.ok(a, "g", "member", "m1")["capabilities"] == "x" * 98
    h.ok(a, "g", "update", "m1", "x" * 198)                 # 400 in all: 700
    h.ok(a, "g", "update", "m1", None)                      # smaller: 210 + 300
    h.end(how, b)                                           # m2 leaves with its session
    h.ok(a, "g", "join", "m3", "z" * 288)                   # 210 + 490: 700 again
    h.fails(a, "g", "join", "m4", "", type="ValueError")
    h.ok(a, "g", "leave", "m3")
    h.ok(a, "g", "join", "m4", "w" * 288)


@pytest.mark.parametrize("kw", [{"max_bytes": 0}, {"max_bytes": "1"}, {"max_bytes": 1.5}])
def test_group_bad_max_bytes(kw):
    h = OH()
    e = h.error(h.create("Group", "g", **kw).tag, APP)
    assert e.type == "ValueError" and "max_bytes must be an int" in e.message


def test_group_changes_times_out():
    h = OH()
    h.make("Group", "g")
    (a,) = h.sessions(1)
    v = h.ok(a, "g", "changes")["version"]
    poll = h.call(a, "g", "changes", v, timeout=1.0)
    h.tick(h.ts + 2.0)
    h.error(poll, TIMEOUT)


@pytest.mark.parametrize("how", ENDS)
def test_election_fifo_and_session_end(how):
    h = OH()
    h.make("Election", "e")
    a, b, c = h.sessions(3)
    assert h.ok(a, "e", "try_campaign", "A") is True
    assert h.ok(b, "e", "try_campaign", "B") is False
    tb = h.call(b, "e", "campaign", "B")
    tc = h.call(c, "e", "campaign", "C")
    assert h.waiting(tb, tc)
    assert h.ok(c, "e", "resign", "B") is False          # only the leader resigns
    h.end(how, a)
    assert h.value(tb) is True and h.waiting(tc)
    assert h.ok(c, "e", "leader") == "B"
    assert h.ok(b, "e", "resign", "B") is True
    assert h.value(tc) is True and h.ok(c, "e", "leader") == "C"


def test_election_campaign_timeout_leaves_the_queue():
    h = OH()
    h.make("Election", "e")
    a, b, c = h.sessions(3)
    h.ok(a, "e", "try_campaign", "A")
    tb = h.call(b, "e", "campaign", "B", timeout=1.0)
    tc = h.call(c, "e", "campaign", "C")
    h.tick(h.ts + 2.0)
    h.error(tb, TIMEOUT)
    h.ok(a, "e", "resign", "A")
    assert h.value(tc) is True and h.ok(a, "e", "leader") == "C"


def test_shared_lock_modes_tokens_and_fifo():
    h = OH()
    h.make("SharedLock", "l")
    a, b = h.sessions(2)
    assert h.ok(a, "l", "acquire", "t1", False, False) is True
    assert h.ok(a, "l", "acquire", "t2", False, False) is False   # same session, other lock
    assert h.ok(a, "l", "acquire", "t1", False, False) is False   # not reentrant
    assert h.ok(a, "l", "release", "t2") is False
    reader = h.call(b, "l", "acquire", "r", True, True)
    writer = h.call(a, "l", "acquire", "t2", False, True)
    assert h.waiting(reader, writer)
    assert h.ok(a, "l", "release", "t1") is True
    assert h.value(reader) is True and h.waiting(writer)          # FIFO: the reader first
    assert h.ok(a, "l", "acquire", "t3", True, False) is False    # a writer waits: no barging
    assert h.ok(b, "l", "release", "r") is True
    assert h.value(writer) is True
    assert h.ok(b, "l", "break_") is True
    assert h.ok(a, "l", "release", "t2") is False
    assert h.ok(b, "l", "acquire", "s", True, False) is True
    assert h.ok(b, "l", "acquire", "s", True, False) is True      # shared: counted
    assert h.ok(b, "l", "release", "s") and h.ok(b, "l", "release", "s")
    assert h.ok(b, "l", "release", "s") is False


@pytest.mark.parametrize("how", ENDS)
def test_shared_lock_freed_on_session_end(how):
    h = OH()
    h.make("SharedLock", "l")
    a, b, c = h.sessions(3)
    h.ok(a, "l", "acquire", "x", False, False)
    tc = h.call(c, "l", "acquire", "z", False, True)
    tb = h.call(b, "l", "acquire", "y", False, True, timeout=1.0)
    h.tick(h.ts + 2.0)
    h.error(tb, TIMEOUT)
    h.end(how, a)
    assert h.value(tc) is True
    assert h.ok(c, "l", "is_owner", "z") is True
    assert h.ok(b, "l", "is_owner", "y") is False


def test_group_errors_are_application_errors():
    h = OH()
    h.make("Group", "g")
    (a,) = h.sessions(1)
    e = h.fails(a, "g", "leave", "nobody", code=APP)
    assert e.type == "MemberNotJoined"
