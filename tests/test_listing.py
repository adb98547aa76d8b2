"""Listing objects by page (kernel/queries.py `objects_page`, kernel/names.py): the sorted
names the object table keeps, pages after a continuation token, prefix and class filters,
the limits of one page, and that all of it survives a checkpoint and is the same on every
replica. ListObjects through a real cluster is in test_cluster.py."""
from __future__ import annotations

import copy
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gesmas.server.kernel import Code, CreateObject, Kernel, KernelError
from gesmas.server.kernel import names as names_module
from gesmas.server.kernel import queries
from gesmas.server.kernel.codec import DeleteObject
from gesmas.server.kernel.names import SortedNames
from gesmas.server.kernel.records import ObjectTable

from kernel_harness import replay
from test_auth_kernel import admin, secured
from test_objects import OH


def page(k: Kernel, user: str = "", **kw) -> tuple[list[str], str]:
    p = k.queries.objects_page(user, **kw)
    return [o["name"] for o in p["objects"]], p["next"]


def walk(k: Kernel, user: str = "", **kw) -> tuple[list[str], int]:
    """Every name the pages give, following the tokens; and how many pages that took."""
    got, token, pages = [], "", 0
    while True:
        names, token = page(k, user, after=token, **kw)
        got += names
        pages += 1
        if not token:
            return got, pages
        assert pages < 10_000


def invalid(fn) -> str:
    with pytest.raises(KernelError) as e:
        fn()
    assert e.value.error.code == Code.INVALID_ARGUMENT
    return e.value.error.message


# -- the sorted names --------------------------------------------------------------------------

words = st.text(alphabet=st.sampled_from("ab\u00e9\U0010ffff\ud800z"), max_size=4)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), words), max_size=200), probe=words)
def test_sorted_names_hold_what_a_sorted_set_holds(ops, probe):
    """Random adds and removes on chunks small enough to split and empty often: the names
    are always those of a set, in sorted order, and `since` starts where bisect would."""
    saved = names_module.LOAD
    names_module.LOAD = 2
    try:
        s, ref = SortedNames(), set()
        for add, w in ops:
            if add and w not in ref:
                s.add(w)
                ref.add(w)
            elif not add:
                s.discard(w)
                ref.discard(w)
            assert list(s) == sorted(ref) and len(s) == len(ref)
        assert (probe in s) == (probe in ref)
        assert list(s.since(probe, inclusive=True)) == sorted(w for w in ref if w >= probe)
        assert list(s.since(probe, inclusive=False)) == sorted(w for w in ref if w > probe)
    finally:
        names_module.LOAD = saved


def test_the_object_table_keeps_its_sorted_names_whatever_changes_it():
    t = ObjectTable()
    t["b"] = 1
    t["a"] = 2
    t["b"] = 3                                   # replaced, not added twice
    t.setdefault("c", 4)
    t.update({"d": 5}, e=6)
    t |= {"f": 7}
    assert list(t.names) == ["a", "b", "c", "d", "e", "f"] and list(t) == list("bacdef")
    assert t.pop("a") == 2 and t.pop("zz", None) is None
    del t["c"]
    t.popitem()                                  # "f", the newest
    with pytest.raises(KeyError):
        t.pop("zz")
    assert list(t.names) == ["b", "d", "e"]
    for other in (copy.copy(t), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert type(other) is ObjectTable and list(other.names) == ["b", "d", "e"]
        assert dict(other) == dict(t)
    t.clear()
    assert list(t.names) == [] and len(t.names) == 0


def test_a_bulk_change_of_the_table_sorts_its_names_once_at_the_end(monkeypatch):
    """A restore adds every object inside bulk(): the names are made again from the keys at
    the end (chunked as LOAD says), and later changes keep them as usual."""
    monkeypatch.setattr(names_module, "LOAD", 3)
    t = ObjectTable()
    t["m"] = 0
    with t.bulk():
        for n in "qwertyuiopasdfgh":
            t[n] = 1
        del t["w"]
        assert len(t.names) == 0                   # not kept meanwhile
    assert list(t.names) == sorted(set("qertyuiopasdfghm")) and len(t.names) == 16
    assert [len(c) for c in t.names._chunks] == [3, 3, 3, 3, 3, 1]
    t["b"] = 2
    t.pop("q")
    assert list(t.names) == sorted(set("ertyuiopasdfghmb"))
    assert list(t.names.since("h", inclusive=False)) == sorted(c for c in t if c > "h")
    with t.bulk():
        t.clear()
    assert list(t.names) == [] and list(t.names.since("", inclusive=True)) == []


# -- pages ---------------------------------------------------------------------------------------


def test_pages_follow_name_order_whatever_the_creation_order():
    h = OH()
    names = [f"obj-{i:03d}" for i in range(50)]
    random.Random(7).shuffle(names)
    for n in names:
        h.make("Counter", n)
    k = h.kernel
    got, pages = walk(k, limit=7)
    assert got == sorted(names) and pages == 8          # 7 full pages and one of 1
    first, token = page(k, limit=7)
    assert first == sorted(names)[:7] and token == "obj-006"
    assert page(k, limit=50) == (sorted(names), "")       # the last page says so
    assert page(k, limit=49)[1] == "obj-048"
    assert page(k, after="obj-048", limit=49) == (["obj-049"], "")
    assert page(k)[0] == sorted(names)                    # default limit: 1000


def test_a_token_that_is_no_object_name_continues_after_it_in_name_order():
    h = OH()
    for n in ("apple", "banana", "cherry"):
        h.make("Counter", n)
    k = h.kernel
    assert page(k, after="b") == (["banana", "cherry"], "")
    assert page(k, after="banana") == (["cherry"], "")     # deleted meanwhile, or never was
    assert page(k, after="zzz") == ([], "")
    assert page(k, after="\U0010ffff" * 256) == ([], "")


def test_prefix_and_class_filters():
    h = OH()
    for n in ("jobs/1", "jobs/2", "jobs/3", "jobs0", "job", "locks/a"):
        h.make("Counter", n)
    h.make("Lock", "jobs/lock")
    k = h.kernel
    assert page(k, prefix="jobs/") == (["jobs/1", "jobs/2", "jobs/3", "jobs/lock"], "")
    assert page(k, prefix="jobs/", class_name="Lock") == (["jobs/lock"], "")
    assert page(k, class_name="Lock") == (["jobs/lock"], "")
    assert page(k, class_name="Nope") == ([], "")
    assert page(k, prefix="jobs/", limit=2) == (["jobs/1", "jobs/2"], "jobs/2")
    assert page(k, prefix="jobs/", after="jobs/2", limit=2) == (["jobs/3", "jobs/lock"], "")
    assert page(k, prefix="jobs/", after="a") == (["jobs/1", "jobs/2", "jobs/3", "jobs/lock"],
                                                  "")
    assert page(k, prefix="jobs/", after="k") == ([], "")    # a token past the prefix
    assert walk(k, prefix="jobs/", limit=1)[0] == ["jobs/1", "jobs/2", "jobs/3", "jobs/lock"]
    objs = k.queries.objects_page("", prefix="jobs/l")["objects"]
    assert objs == [{"name": "jobs/lock", "class": "Lock", "version": 1, "waiters": 0,
                     "owner": ""}]


def test_prefixes_of_odd_unicode():
    """Code points past the BMP, combining marks, the largest code point: the names that
    start with a prefix are exactly those listed, in code point order."""
    h = OH()
    names = ["é", "e\u0301", "e\u0301x", "\U0001f600", "\U0001f600\U0001f601", "\U0010ffff",
             "\U0010ffff\U0010ffff", "z", "\uffff", "\u0000a"]
    for n in names:
        h.make("Counter", n)
    k = h.kernel
    assert walk(k, limit=3)[0] == sorted(names)
    for prefix in ("e", "e\u0301", "\U0001f600", "\U0010ffff", "\uffff", "\u0000", "é",
                   "\U0010ffff" * 3):
        assert page(k, prefix=prefix) == (sorted(n for n in names if n.startswith(prefix)),
                                          ""), prefix


def test_an_empty_table_lists_nothing():
    k = Kernel()
    assert k.queries.objects_page("") == {"objects": [], "next": ""}
    assert page(k, prefix="x", class_name="Lock", after="m", limit=1) == ([], "")


def test_bad_pages_are_refused_naming_the_field():
    k = OH().kernel
    assert "limit must be 0 (the default, 1000) to 10000" in \
        invalid(lambda: k.queries.objects_page("", limit=10_001))
    assert "not -1" in invalid(lambda: k.queries.objects_page("", limit=-1))
    assert "not 1e+100" in invalid(lambda: k.queries.objects_page("", limit=1e100))
    assert "limit" in invalid(lambda: k.queries.objects_page("", limit=True))
    assert invalid(lambda: k.queries.objects_page("", limit=2 ** 70)).startswith("limit ")
    for field, kw in (("page_token", "after"), ("prefix", "prefix"),
                      ("class_name", "class_name")):
        message = invalid(lambda: k.queries.objects_page("", **{kw: "x" * 257}))
        assert message.startswith(f"{field} must be at most 256 characters"), message
        assert invalid(lambda: k.queries.objects_page("", **{kw: b"x"})).startswith(field)
    assert page(k, after="x" * 256, prefix="x" * 256, class_name="x" * 256) == ([], "")


def test_a_page_examines_a_bounded_number_of_names(monkeypatch):
    """A filter that matches few objects gives short pages (even empty ones) with a token,
    rather than one page walking every name; following the tokens finds every match."""
    monkeypatch.setattr(queries, "MAX_EXAMINED", 5)
    h = OH()
    for i in range(12):
        h.make("Counter", f"c{i:02d}")
    h.make("Lock", "c05-lock")
    k = h.kernel
    assert page(k, class_name="Lock") == ([], "c04")
    assert page(k, class_name="Lock", after="c04") == (["c05-lock"], "c08")
    assert walk(k, class_name="Lock") == (["c05-lock"], 3)
    assert walk(k, limit=2)[0] == sorted(k.objects)


def test_a_page_stops_at_its_byte_budget(monkeypatch):
    monkeypatch.setattr(queries, "PAGE_BYTES", 300)
    h = OH()
    names = [f"{'é' * 20}{i}" for i in range(6)]            # 21 characters each
    for n in names:
        h.make("Counter", n)
    first, token = page(h.kernel, limit=6)
    assert first == names[:3] and token == names[2]         # 3 x (4 x (21 + 7) + 16) > 300
    assert walk(h.kernel)[0] == names


def test_deleted_objects_leave_the_listing():
    h = OH()
    for n in ("a", "b", "c"):
        h.make("Counter", n)
    assert h.run(DeleteObject(name="b")).error is None
    assert page(h.kernel) == (["a", "c"], "")
    assert list(h.kernel.objects.names) == ["a", "c"]
    h.make("Counter", "b")
    assert page(h.kernel) == (["a", "b", "c"], "")


def test_waiters_are_counted_per_object_through_wakes_timeouts_and_checkpoints():
    h = OH()
    s1, s2, s3 = h.sessions(3)
    h.make("Queue", "q")
    h.make("Lock", "l")
    waits = [h.call(s, "q", "consume") for s in (s1, s2)]
    timed = h.call(s3, "q", "consume", timeout=5)
    assert h.ok(s1, "l", "acquire") and h.waiting(h.call(s2, "l", "acquire"))

    def waiters() -> dict[str, int]:
        return {o["name"]: o["waiters"] for o in h.kernel.queries.objects_page("")["objects"]}
    assert waiters() == {"l": 1, "q": 3}
    h.tick(h.ts + 6)                                         # the timed consume gives up
    h.error(timed, Code.TIMEOUT)
    assert waiters() == {"l": 1, "q": 2}
    h.checkpoint()
    assert waiters() == {"l": 1, "q": 2}
    restored = Kernel.restore(h.kernel.checkpoint_blob, h.kernel.config)
    assert {o["name"]: o["waiters"] for o in restored.queries.objects_page("")["objects"]} \
        == {"l": 1, "q": 2}
    h.ok(s3, "q", "produce", "x")
    assert h.value(waits[0]) == "x"
    h.end("close", s1)                                       # its lock goes to s2
    assert waiters() == {"l": 0, "q": 1}
    assert h.kernel.runner.waiting_on == {"q": 1}            # no zero counts kept


def test_pages_survive_a_checkpoint_and_are_the_same_on_every_replica():
    h = OH()
    rng = random.Random(3)
    live: set[str] = set()
    for i in range(300):
        name = f"{rng.choice('abc')}/{rng.randrange(1000)}"
        if name in live and rng.random() < 0.5:
            assert h.run(DeleteObject(name=name)).error is None
            live.discard(name)
        elif name not in live:
            h.make(rng.choice(["Counter", "Lock"]), name)
            live.add(name)
        if i == 150:
            h.checkpoint()
    k = h.kernel
    restored = Kernel.restore(k.checkpoint_blob, k.config)
    replay([(i, c) for i, c in h.log if i > k.checkpoint_index], restored)
    other, _ = replay(h.log, Kernel(k.config))
    for kernel in (restored, other):
        assert kernel.state_digest() == k.state_digest()
        assert list(kernel.objects.names) == sorted(live) == list(k.objects.names)
        for kw in ({"limit": 17}, {"prefix": "b/"}, {"class_name": "Lock", "limit": 5}):
            assert walk(kernel, **kw) == walk(k, **kw)
    assert walk(k, prefix="b/")[0] == sorted(n for n in live if n.startswith("b/"))


def test_a_user_pages_through_the_objects_it_may_see_only():
    h = secured()
    for name in ("a/1", "a/2", "a/3", "b/1", "b/2"):
        assert h.run(CreateObject(class_name="Buf", name=name, user="root")).error is None
    k = h.kernel
    assert walk(k, "alice", limit=2)[0] == ["a/1", "a/2", "a/3"]
    assert walk(k, "root", limit=2)[0] == ["a/1", "a/2", "a/3", "b/1", "b/2"]
    assert walk(k, "bob")[0] == []
    assert page(k, "alice", prefix="b/") == ([], "")
    with pytest.raises(KernelError) as e:
        k.queries.objects_page(None)
    assert e.value.error.code == Code.UNAUTHENTICATED
    admin(h, "auth_disable")
    assert walk(k, "bob")[0] == ["a/1", "a/2", "a/3", "b/1", "b/2"]
