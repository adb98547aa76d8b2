"""The standard Map (objects/kvmap.py) driven through the kernel alone: entries, versions and
the revision, pages, cas, transactions, ephemeral entries across session ends, limits and
hostile arguments, and watches (as readers without a log entry and through the log, across
a checkpoint and a restore, with a bounded history)."""
from __future__ import annotations

import pytest

from gesmas.server.kernel import Code, KernelError
from gesmas.server.kernel.codec import DeleteObject
from gesmas.server.kernel.sched import NotYet

try:
    from tests.kernel_harness import H
    from tests.test_objects import APP, OH
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from kernel_harness import H
    from test_objects import APP, OH


def made(*args, **kw):
    h = OH()
    h.make("Map", "m", *args, **kw)
    return h, h.open_session()


def read(h, method, *args):
    return h.kernel.read("", "m", method, list(args))


# ============================================================================ entries

def test_put_get_delete_versions_and_the_revision():
    h, s = made()
    assert read(h, "revision") == 0 and read(h, "get", "a") is None
    assert read(h, "get", "a", "dflt") == "dflt" and read(h, "entry", "a") is None
    assert h.ok(s, "m", "put", "a", {"x": [1, b"y"]}) == {"revision": 1, "version": 1}
    assert h.ok(s, "m", "put", "b", None) == {"revision": 2, "version": 1}
    assert h.ok(s, "m", "put", "a", 2) == {"revision": 3, "version": 2}
    assert read(h, "get", "a") == 2 and read(h, "get", "b", "dflt") is None   # a stored None
    assert read(h, "entry", "a") == {"value": 2, "version": 2, "create_revision": 1,
                                     "mod_revision": 3, "ephemeral": False}
    assert h.ok(s, "m", "delete", "a") is True
    assert h.ok(s, "m", "delete", "a") is False            # nothing to delete: no revision
    assert read(h, "revision") == 4 and read(h, "size") == 1
    assert h.ok(s, "m", "put", "a", 0) == {"revision": 5, "version": 1}       # made anew
    assert read(h, "entry", "a")["create_revision"] == 5
    assert h.ok(s, "m", "get", "a") == 0                   # a reader may go through the log too


def test_items_and_keys_in_key_order_by_prefix_and_page():
    h, s = made()
    for k in ["svc/b", "svc/a", "cfg/x", "svc/c", "svd", "svc/", "a"]:
        h.ok(s, "m", "put", k, k.upper())
    assert read(h, "keys")["keys"] == ["a", "cfg/x", "svc/", "svc/a", "svc/b", "svc/c", "svd"]
    page = read(h, "items", "svc/", 2)
    made_at = read(h, "stat")["created"]
    assert page == {"items": [{"key": "svc/", "value": "SVC/", "version": 1, "mod_revision": 6},
                              {"key": "svc/a", "value": "SVC/A", "version": 1,
                               "mod_revision": 2}],
                    "more": True, "revision": 7, "created": made_at}
    rest = read(h, "keys", "svc/", 2, "svc/a")
    assert rest == {"keys": ["svc/b", "svc/c"], "more": False, "revision": 7,
                    "created": made_at}
    assert read(h, "keys", "svc/", 5, "a")["keys"][0] == "svc/"   # before the prefix: ignored
    assert read(h, "keys", "zz")["keys"] == [] and read(h, "keys", "", 1, "svd")["keys"] == []
    h.ok(s, "m", "delete", "svc/a")
    assert read(h, "keys", "svc/")["keys"] == ["svc/", "svc/b", "svc/c"]


def test_cas_puts_only_at_the_expected_version():
    h, s = made()
    assert h.ok(s, "m", "cas", "flag", 1, True) is False    # missing: version 0
    assert h.ok(s, "m", "cas", "flag", 0, True) is True     # 0: create only
    assert h.ok(s, "m", "cas", "flag", 0, False) is False
    assert h.ok(s, "m", "cas", "flag", 1, False) is True
    assert read(h, "entry", "flag")["version"] == 2 and read(h, "get", "flag") is False
    assert read(h, "revision") == 2                         # refused cas changed nothing
    h.fails(s, "m", "cas", "flag", -1, 1, type="ValueError")
    h.fails(s, "m", "cas", "flag", "2", 1, type="ValueError")


# ============================================================================ transactions

def test_txn_runs_one_branch_atomically_at_one_revision():
    h, s = made()
    h.ok(s, "m", "put", "a", 1)
    r = h.ok(s, "m", "txn", [["a", "value", "==", 1], ["a", "version", ">=", 1],
                             ["b", "exists", "==", False]],
             [["put", "b", "B"], ["delete", "a"], ["get", "b"], ["delete", "zz"]],
             [["put", "failed", 1]])
    assert r["succeeded"] is True and r["revision"] == 2
    assert r["results"] == [{"version": 1}, {"deleted": True},
                            {"value": "B", "version": 1, "create_revision": 2,
                             "mod_revision": 2, "ephemeral": False}, {"deleted": False}]
    r = h.ok(s, "m", "txn", [["b", "mod_revision", "<", 2]], [["put", "x", 1]],
             [["put", "failed", 1], ["put", "failed", 2]])
    assert r["succeeded"] is False and r["revision"] == 3
    assert r["results"] == [{"version": 1}, {"version": 2}]
    assert read(h, "keys")["keys"] == ["b", "failed"]
    r = h.ok(s, "m", "txn", [], [["get", "b"]])              # reads only: no revision
    assert r["succeeded"] is True and r["revision"] == 3
    r = h.ok(s, "m", "txn", [], [["delete", "zz"], ["get", "b"]])   # nothing deleted: none
    assert r["revision"] == 3 and r["results"][0] == {"deleted": False}


def test_txn_compares_on_a_missing_key():
    h, s = made()
    for compare, holds in [(["k", "version", "==", 0], True), (["k", "mod_revision", "<", 1], True),
                           (["k", "create_revision", "!=", 0], False),
                           (["k", "exists", "!=", True], True),
                           (["k", "value", "==", None], False),
                           (["k", "value", "!=", None], False)]:   # every value compare fails
        assert h.ok(s, "m", "txn", [compare], [])["succeeded"] is holds, compare


BAD_TXNS = [
    ([[["a", "colour", "==", 1]], []], "compare target"),
    ([[["a", "value", "~", 1]], []], "compare op"),
    ([[["a", "exists", "<", True]], []], "'exists' compare"),
    ([[["a", "version", "==", "1"]], []], "version compare takes an int"),
    ([[["a", "value", "<", "x"]], []], "cannot be ordered"),
    ([[["a", "value"]], []], "a compare is"),
    ([["a"], []], "a compare is"),
    ([[], [["put", "a"]]], "put takes 2"),
    ([[], [["rename", "a", "b"]]], "an operation is"),
    ([[], [["put", "a", 1, "yes"]]], "ephemeral"),
    ([[], [["put", "", 1]]], "non-empty str"),
    ([[], "put a 1"], "success must be a list"),
    ([{}, []], "compares must be a list"),
    ([[], [["put", "a", 1]] * 129], "at most 128"),
    ([[], [["put", "b", 2]], [["delete", 3]]], "non-empty str"),   # the branch not taken too
]


def test_a_bad_txn_is_refused_whole_and_changes_nothing():
    h, s = made()                          # one kernel for every case (each costs ~0.2 s)
    h.ok(s, "m", "put", "a", 1)
    for args, words in BAD_TXNS:
        e = h.fails(s, "m", "txn", *args)
        assert words in e.message, (args, e)
        assert read(h, "revision") == 1 and read(h, "keys")["keys"] == ["a"], args
        assert read(h, "get", "b") is None


# ============================================================================ limits

def test_key_value_and_count_limits_give_clear_errors():
    h, s = made(max_keys=3, max_key_bytes=8, max_value_bytes=40)
    for k in ["a", "b", "c"]:
        h.ok(s, "m", "put", k, k)
    e = h.fails(s, "m", "put", "d", 1, type="ValueError")
    assert "max_keys (3)" in e.message
    h.ok(s, "m", "put", "a", "again")                       # a replaced key takes no room
    e = h.fails(s, "m", "cas", "d", 0, 1, type="ValueError")
    assert "max_keys" in e.message
    e = h.fails(s, "m", "txn", [], [["delete", "a"], ["put", "d", 1], ["put", "e", 1]])
    assert "max_keys" in e.message
    r = h.ok(s, "m", "txn", [], [["delete", "a"], ["put", "d", 1]])
    assert r["succeeded"] and read(h, "keys")["keys"] == ["b", "c", "d"]
    assert "max_key_bytes" in h.fails(s, "m", "put", "123456789", 1).message
    assert "max_key_bytes" in h.fails(s, "m", "put", "ééééé", 1).message  # 10 bytes in UTF-8
    h.ok(s, "m", "delete", "d")
    h.ok(s, "m", "put", "éééé", 1)                          # 8 bytes in UTF-8: fits
    for big in ["x" * 41, b"x" * 41, ["x" * 20, "y" * 20], {"k": "v" * 40},
                list(range(6)), [[[[[[]]]]]]]:
        e = h.fails(s, "m", "put", "b", big, type="ValueError")
        assert "max_value_bytes (40)" in e.message, big
    h.ok(s, "m", "put", "b", ["x" * 16, "y" * 16])          # 8 + 32: fits


def test_a_value_of_many_items_is_sized_within_the_step_budget():
    """Sizing a value costs a step an item: a list of 60,000 ints (480 KiB by the map's
    measure) is taken; the sizing walk before cost ~40 steps an item and a list of 5,000
    ran out of the call's 200,000 steps. Past max_value_bytes the error names the limit,
    not the budget."""
    h, s = made(max_value_bytes=512 * 1024)
    for value in (list(range(60_000)), ["ab"] * 50_000, {f"k{i}": i for i in range(20_000)},
                  [[i, "x"] for i in range(15_000)]):
        h.ok(s, "m", "put", "k", value)
        assert read(h, "get", "k") == value
    for value in (list(range(70_000)), ["abcdefghijklmnop"] * 40_000):
        e = h.fails(s, "m", "put", "k", value, type="ValueError")
        assert "max_value_bytes (524288)" in e.message


def test_pages_stay_in_key_order_while_keys_come_and_go_across_many_lists():
    """The keys in order are kept in lists of 256 to 512 (kvmap._CHUNK): 3,000 keys made
    and deleted at random split and empty such lists; every page, by prefix and after a
    key, is what a sorted list of the keys gives."""
    import random
    rng = random.Random(7)
    h, s = made()
    model: set[str] = set()
    for step in range(4500):
        key = f"{rng.choice('abc')}/{rng.randrange(2000):04d}"
        if key in model and rng.random() < 0.4:
            h.ok(s, "m", "delete", key)
            model.discard(key)
        else:
            h.ok(s, "m", "put", key, step)
            model.add(key)
        if step % 500 == 499 or step == 4499:
            for prefix in ("", "a/", "b/1", "c/19", "d"):
                want = sorted(k for k in model if k.startswith(prefix))
                got, after = [], ""
                for _ in range(20):       # 2,000 keys at most: 7 pages
                    page = read(h, "keys", prefix, 333, after)
                    got += page["keys"]
                    if not page["more"]:
                        break
                    after = page["keys"][-1]
                assert got == want, (step, prefix)
            assert read(h, "size") == len(model)
    assert read(h, "keys", "b/", 5, "b/0999")["keys"] == \
        sorted(k for k in model if k.startswith("b/") and k > "b/0999")[:5]


def test_a_large_map_takes_whole_transactions_and_a_session_end_within_the_step_budget():
    """At 30,000 keys, one sorted list cost ~470 steps a key made or deleted: a session's
    end deleting its 1,000 ephemeral keys ran out of its 200,000 steps and left them there.
    In lists of 256 to 512 keys, a full transaction of 128 new keys and that end fit."""
    h, s = made()
    for b in range(0, 30_000, 128):
        h.ok(s, "m", "txn", [], [["put", f"p/{i:05d}", i] for i in range(b, min(b + 128,
                                                                                 30_000))])
    a = h.open_session()
    for b in range(0, 1000, 125):
        h.ok(a, "m", "txn", [], [["put", f"e/{i:04d}", i, True] for i in range(b, b + 125)])
    assert read(h, "size") == 31_000
    h.end("expire", a)
    assert read(h, "size") == 30_000 and read(h, "keys", "e/")["keys"] == []
    assert read(h, "keys", "p/2999")["keys"] == ["p/29990", "p/29991", "p/29992", "p/29993",
                                                 "p/29994", "p/29995", "p/29996", "p/29997",
                                                 "p/29998", "p/29999"]


def test_max_keys_counts_before_the_put():
    h, s = made(max_keys=1)
    h.ok(s, "m", "put", "a", 1)
    assert "max_keys (1)" in h.fails(s, "m", "put", "b", 1).message


def test_bad_constructor_arguments():
    h = OH()
    for kw in [{"max_keys": 0}, {"max_keys": "9"}, {"history": 0}, {"history": 20_001},
               {"max_value_bytes": 2 << 20}, {"max_key_bytes": True},
               {"max_key_bytes": 4097}, {"max_bytes": 0}, {"max_bytes": 1.5}]:
        c = h.create("Map", "m", **kw)
        assert c.error is not None and c.error.code == APP, kw
        assert f"{next(iter(kw))} must be an int from 1 to" in c.error.message, kw
    for kw in [{"history_bytes": 512 * 1024 - 1}, {"history_bytes": (1 << 32) + 1}]:
        c = h.create("Map", "m", **kw)       # at least a transaction's: a revision fits
        assert "history_bytes must be an int from 524288 to" in c.error.message, kw
    h.create("Map", "m2", max_bytes=100)
    c = h.create("Map", "m2", max_bytes=200)                  # get-or-create, another limit
    assert c.error.type == "ConstructorMismatch" and "max_bytes" in c.error.message


def test_max_bytes_refuses_the_put_and_the_map_still_takes_deletes():
    """Past the kernel's 64 MiB an object takes no more calls, deletes included: the map
    refuses a put that would pass max_bytes instead (put, cas and txn alike, a txn whole),
    takes one that makes an entry smaller, and a delete makes room."""
    h, s = made(max_bytes=100, max_value_bytes=100)
    h.ok(s, "m", "put", "a", "x" * 49)                       # 1 + 49
    h.ok(s, "m", "put", "b", "y" * 49)                       # 100: full
    rev = read(h, "revision")
    for call in (["put", "c", 1], ["put", "a", "x" * 50], ["cas", "c", 0, "z"],
                 ["txn", [], [["put", "c", "z"]]],
                 ["txn", [], [["delete", "a"], ["put", "c", "z" * 49], ["put", "d", 1]]]):
        e = h.fails(s, "m", *call, type="ValueError")
        assert "over max_bytes (100)" in e.message, call
    assert read(h, "revision") == rev and read(h, "keys")["keys"] == ["a", "b"]
    h.ok(s, "m", "put", "a", "x")                            # smaller: taken
    h.ok(s, "m", "put", "c", "z" * 47)                       # 2 + 50 + 48 = 100
    h.ok(s, "m", "delete", "b")
    r = h.ok(s, "m", "txn", [], [["delete", "c"], ["put", "d", "w" * 97]])   # 2 + 98
    assert r["succeeded"] and read(h, "keys")["keys"] == ["a", "d"]


def changes_after(h, after):
    """Every change after revision `after`, watched answer by answer (one ends past 256 KiB)."""
    out, last = [], read(h, "revision")
    while after < last:
        w = read(h, "watch", "", after)
        out += w["events"]
        after = w["revision"]
    return out


def test_large_values_changed_again_and_again_keep_the_history_under_history_bytes():
    """A value of 250 KiB put again and again: the history keeps fewer changes (not
    `history` of them: 1,000 x 250 KiB took the map past the kernel's 64 MiB an object,
    after which it took no call, not even a delete). A watch from before what is kept
    raises Compacted; the changes kept are whole revisions, the last ones."""
    h, s = made(history_bytes=1 << 20)
    big = "x" * (250 * 1024)
    for i in range(400):
        h.ok(s, "m", "put", f"k{i % 3}", big + str(i))
    with pytest.raises(KernelError) as old:
        read(h, "watch", "", 0)
    floor = int(old.value.error.message.split("changes after revision ")[1].split()[0])
    kept = changes_after(h, floor)
    assert 3 <= len(kept) <= 4 and kept[-1]["value"] == big + "399"   # 7/8 MiB .. 1 MiB
    assert [e["revision"] for e in kept] == list(range(floor + 1, 401))
    h.ok(s, "m", "delete", "k0")
    h.ok(s, "m", "txn", [], [["put", f"t{i}", "y" * (100 * 1024)] for i in range(5)])
    assert len(changes_after(h, read(h, "revision") - 1)) == 5        # a revision whole


HOSTILE = [
    ("put", [5, 1], "a key must be a non-empty str"),
    ("put", [None, 1], "a key must be"),
    ("get", [["a"]], "a key must be"),
    ("delete", [b"a"], "a key must be"),
    ("items", [3], "a prefix must be a str"),
    ("items", ["", 0], "limit must be an int from 1"),
    ("keys", ["", 10_001], "limit must be an int from 1"),
    ("keys", ["", 5, 7], "start_after must be a str"),
    ("watch", ["", -1], "after_revision must be an int >= 0"),
    ("watch", ["", 1.5], "after_revision must be an int >= 0"),
    ("watch", ["", 0, 0], "limit must be"),
    ("cas", [{"k": 1}, 0, 1], "a key must be"),
    ("put", ["k", 1, "no"], "ephemeral must be a bool"),
    ("put", ["k", 1, 1], "ephemeral must be a bool"),
]


def test_hostile_arguments_are_refused_by_name():
    h, s = made()
    for method, args, words in HOSTILE:
        e = h.error(h.call(s, "m", method, *args))
        assert words in e.message, (method, args, e)
        if method in ("get", "items", "keys", "watch"):     # the same without the log
            with pytest.raises(KernelError) as refused:
                read(h, method, *args)
            assert words in refused.value.error.message, (method, args)
    assert read(h, "revision") == 0


# ============================================================================ ephemeral

@pytest.mark.parametrize("how", ["expire", "close"])
def test_ephemeral_entries_go_with_their_session_a_revision_each(how):
    h, s = made()
    a, b = h.sessions(2)
    h.ok(a, "m", "put", "svc/a1", "10.0.0.1", True)
    h.ok(a, "m", "txn", [], [["put", "svc/a2", "10.0.0.2", True]])
    h.ok(b, "m", "put", "svc/b1", "10.0.0.3", True)
    h.ok(a, "m", "put", "cfg", 1)                           # a plain entry of a stays
    h.ok(a, "m", "put", "moved", 1, True)
    h.ok(b, "m", "put", "moved", 2, True)                   # b's now
    h.ok(a, "m", "put", "kept", 1, True)
    h.ok(a, "m", "put", "kept", 2)                          # a plain put: permanent now
    assert read(h, "entry", "kept")["ephemeral"] is False
    rev = read(h, "revision")
    h.end(how, a)
    assert read(h, "keys")["keys"] == ["cfg", "kept", "moved", "svc/b1"]
    assert read(h, "revision") == rev + 2
    w = read(h, "watch", "svc/", rev)
    assert w["revision"] == rev + 2
    assert [(e["type"], e["key"], e["revision"]) for e in w["events"]] == [
        ("delete", "svc/a1", rev + 1), ("delete", "svc/a2", rev + 2)]
    h.end("expire", b)
    assert read(h, "keys")["keys"] == ["cfg", "kept"]


def test_deleting_an_ephemeral_entry_unbinds_it():
    h, s = made()
    a = h.open_session()
    h.ok(a, "m", "put", "x", 1, True)
    h.ok(s, "m", "delete", "x")
    h.ok(s, "m", "put", "x", 2)                             # another entry, not a's
    rev = read(h, "revision")
    h.end("close", a)
    assert read(h, "get", "x") == 2 and read(h, "revision") == rev


def test_ephemeral_entries_survive_a_checkpoint_and_still_end_with_their_session():
    h, s = made()
    a = h.open_session()
    h.ok(a, "m", "put", "svc/a", 1, True)
    h.checkpoint()
    r = h.restored()
    for k in (h, r):
        k.end("expire", a)
        assert k.kernel.read("", "m", "keys", [])["keys"] == []
    assert r.kernel.state_digest() == h.kernel.state_digest()


# ============================================================================ watches

def test_watch_returns_changes_under_the_prefix_and_waits_without_any():
    h, s = made()
    h.ok(s, "m", "put", "cfg/a", 1)
    h.ok(s, "m", "put", "other", 1)
    w = read(h, "watch", "cfg/", 0)
    assert w == {"revision": 2, "events": [{"revision": 1, "type": "put", "key": "cfg/a",
                                            "value": 1, "version": 1}],
                 "created": read(h, "stat")["created"]}
    with pytest.raises(NotYet):                             # a change elsewhere only
        read(h, "watch", "cfg/", 1)
    with pytest.raises(NotYet):
        read(h, "watch", "cfg/", 2)
    with pytest.raises(NotYet):                             # a future revision waits too
        read(h, "watch", "", 50)
    h.ok(s, "m", "delete", "cfg/a")
    assert read(h, "watch", "cfg/", 2)["events"] == [
        {"revision": 3, "type": "delete", "key": "cfg/a", "value": None, "version": 0}]


def test_a_map_made_again_has_another_created_and_a_watch_of_the_old_one_is_refused():
    """A map deleted and made again starts at revision 0: a watch from revision r of the old
    map, given the old map's `created`, raises Replaced instead of taking the new map's
    changes after r (and missing its first r); waiting, through the log, too."""
    h, s = made()
    old = read(h, "stat")
    assert old == {"revision": 0, "size": 0, "created": old["created"]} and old["created"] > 0
    for i in range(3):
        h.ok(s, "m", "put", f"k{i}", i)
    w = read(h, "watch", "", 1, 1000, old["created"])
    assert w["created"] == old["created"] and len(w["events"]) == 2
    a = h.open_session()
    t = h.call(a, "m", "watch", "", 3, 1000, old["created"])     # waits through the log
    assert h.waiting(t)
    assert h.run(DeleteObject(ts=h.ts, tag=h.tag(), name="m")).error is None
    h.make("Map", "m")
    for i in range(5):
        h.ok(s, "m", "put", f"n{i}", i)
    new = read(h, "stat")
    assert new["revision"] == 5 and new["created"] > old["created"]
    with pytest.raises(KernelError) as e:
        read(h, "watch", "", 3, 1000, old["created"])
    assert e.value.error.type == "Replaced"
    assert f"made at log index {new['created']}, not {old['created']}" in e.value.error.message
    assert h.error(t).type == "Aborted"                          # the delete ended that wait
    assert [ev["key"] for ev in read(h, "watch", "", 3)["events"]] == ["n3", "n4"]  # unchecked
    assert len(read(h, "watch", "", 0, 1000, new["created"])["events"]) == 5
    with pytest.raises(KernelError) as e:
        read(h, "watch", "", 0, 1000, "1")
    assert e.value.error.type == "TypeError" and "created must be an int" in \
        e.value.error.message


def test_watch_through_the_log_blocks_and_wakes_only_with_a_match():
    h, s = made()
    a, b = h.sessions(2)
    ta = h.call(a, "m", "watch", "svc/", 0)
    tb = h.call(b, "m", "watch", "cfg", 0, timeout=5)
    h.ok(s, "m", "put", "zzz", 1)
    assert h.waiting(ta, tb)
    h.ok(s, "m", "put", "svc/x", 1)
    assert h.value(ta)["events"][0]["key"] == "svc/x" and h.waiting(tb)
    h.tick(h.ts + 6)
    assert h.error(tb).code == Code.TIMEOUT


def test_watching_from_each_answer_sees_every_change_once():
    """A watcher that always continues from the revision it was given sees each change under
    its prefix exactly once, in order, whatever else changes and however it is cut."""
    h, s = made()
    seen, rev = [], 0
    want = []
    for i in range(60):
        key = f"p/{i % 7}" if i % 3 else f"q/{i}"
        if i % 5 == 4:
            h.ok(s, "m", "txn", [], [["put", key, i], ["put", "p/t", i], ["delete", "q/0"]])
            want += [(key, i)] if key.startswith("p/") else []
            want.append(("p/t", i))
        else:
            h.ok(s, "m", "put", key, i)
            if key.startswith("p/"):
                want.append((key, i))
        if i % 4 == 0:
            try:
                w = read(h, "watch", "p/", rev, 2)
            except KernelError as e:                         # nothing new under p/
                raise AssertionError(e)
            except NotYet:
                continue
            seen += [(e["key"], e["value"]) for e in w["events"]]
            rev = w["revision"]
    while True:
        try:
            w = read(h, "watch", "p/", rev, 3)
        except NotYet:
            break
        seen += [(e["key"], e["value"]) for e in w["events"]]
        rev = w["revision"]
    assert seen == want and rev == read(h, "revision")


def test_a_truncated_watch_ends_at_a_whole_revision():
    h, s = made()
    h.ok(s, "m", "txn", [], [["put", "a", 1], ["put", "b", 1], ["put", "c", 1]])
    h.ok(s, "m", "put", "d", 1)
    w = read(h, "watch", "", 0, 1)
    assert w["revision"] == 1 and [e["key"] for e in w["events"]] == ["a", "b", "c"]
    w = read(h, "watch", "", 1, 1)
    assert w["revision"] == 2 and [e["key"] for e in w["events"]] == ["d"]


def test_a_watch_older_than_the_history_names_the_oldest_revision_kept():
    """The history is trimmed by batches (past history + 16 changes here), down to the last
    `history` changes or a few more: a revision is kept whole."""
    h, s = made(history=4)
    for i in range(17):
        h.ok(s, "m", "put", "k", i)                            # revisions 1-17
    assert len(read(h, "watch", "", 0)["events"]) == 17        # nothing dropped yet
    h.ok(s, "m", "txn", [], [["put", f"t{i}", i] for i in range(5)])   # 18: 5 changes
    with pytest.raises(KernelError) as old:
        read(h, "watch", "", 16)
    assert old.value.error.type == "Compacted"
    assert "changes after revision 17" in old.value.error.message
    w = read(h, "watch", "", 17)
    assert [e["revision"] for e in w["events"]] == [18] * 5    # 5 > 4: the revision whole
    h.fails(s, "m", "watch", "", 0, type="Compacted")


def test_a_watch_waiting_through_the_log_survives_a_checkpoint_and_a_restore():
    h, s = made()
    a = h.open_session()
    h.ok(s, "m", "put", "x", 0)
    t = h.call(a, "m", "watch", "cfg/", 1)
    h.checkpoint()
    r = h.restored()
    for k in (h, r):
        assert k.waiting(t)
        k.ok(s, "m", "put", "y", 1)
        assert k.waiting(t)
        k.ok(s, "m", "put", "cfg/z", 2)
        assert k.value(t)["events"] == [{"revision": 3, "type": "put", "key": "cfg/z",
                                         "value": 2, "version": 1}]
        assert k.kernel.read("", "m", "watch", ["", 0])["revision"] == 3
    assert r.kernel.state_digest() == h.kernel.state_digest()
    assert r.trace[-2:] == h.trace[-2:]


# ============================================================================ wake-ups by key

def test_each_change_announces_its_key_and_a_waiting_watch_names_its_prefix():
    """What the node wakes waiting readers by (node_reads.ObjectChanges): the keys an entry
    changed (Kernel.topics) and the prefix a watch waits for (NotYet.topic)."""
    h, s = made()
    a = h.open_session()
    h.ok(s, "m", "put", "svc/a", 1)
    assert h.kernel.topics == {"m": ["svc/a"]}
    h.ok(s, "m", "get", "svc/a")                            # through the log, no change
    assert h.kernel.topics == {}
    h.ok(s, "m", "txn", [], [["put", "x", 1], ["delete", "svc/a"], ["get", "x"]])
    assert h.kernel.topics == {"m": ["x", "svc/a"]}
    h.ok(a, "m", "put", "e/1", 1, True)
    h.ok(a, "m", "put", "e/2", 1, True)
    h.end("close", a)
    assert h.kernel.topics == {"m": ["e/1", "e/2"]}
    with pytest.raises(NotYet) as waits:
        read(h, "watch", "cfg/", read(h, "revision"))
    assert waits.value.topic == "cfg/"


def test_an_entry_announcing_too_many_topics_counts_as_changing_everything():
    from gesmas.server.kernel.sched import MAX_TOPICS
    h = OH()
    h.register("class Many:\n"
               "    def touch(self, n, what='k'):\n"
               "        for i in range(n):\n"
               "            context().changed(what if what != 'k' else f'k{i}')\n")
    h.create("Many", "m")
    s = h.open_session()
    h.ok(s, "m", "touch", 3)
    assert h.kernel.topics == {"m": ["k0", "k1", "k2"]}
    h.ok(s, "m", "touch", MAX_TOPICS + 1)
    assert h.kernel.topics == {"m": None}
    e = h.fails(s, "m", "touch", 1, 5, type="TypeError")
    assert "a changed topic must be a str" in e.message


# ============================================================================ answers and calls stay bounded

def test_pages_and_watch_answers_stop_past_their_byte_budget():
    h, s = made(max_value_bytes=100_000)
    for i in range(8):
        h.ok(s, "m", "put", f"big/{i}", "x" * 90_000)
    page = read(h, "items", "big/", 100)
    assert [i["key"] for i in page["items"]] == ["big/0", "big/1", "big/2"] and page["more"]
    rest = read(h, "items", "big/", 100, "big/2")
    assert rest["items"][0]["key"] == "big/3"
    w = read(h, "watch", "big/", 0)
    assert [e["revision"] for e in w["events"]] == [1, 2, 3] and w["revision"] == 3
    assert [e["revision"] for e in read(h, "watch", "big/", 3)["events"]] == [4, 5, 6]


def test_a_transaction_over_its_byte_budget_is_refused_whole():
    h, s = made(max_value_bytes=300_000)
    h.ok(s, "m", "put", "a", "x" * 300_000)
    e = h.fails(s, "m", "txn", [], [["put", "b", "y" * 300_000], ["put", "c", "z" * 250_000]])
    assert "over 524288 bytes" in e.message
    e = h.fails(s, "m", "txn", [], [["get", "a"], ["put", "b", "y" * 250_000]])
    assert "those its gets return" in e.message                # what it would answer counts
    assert read(h, "keys")["keys"] == ["a"] and read(h, "revision") == 1


def test_a_session_holds_at_most_1000_ephemeral_entries_and_its_end_deletes_them_all():
    h, s = made()
    a = h.open_session()
    for i in range(1000):
        h.ok(a, "m", "put", f"e/{i:04d}", i, True)
    h.ok(a, "m", "put", "e/0000", "again", True)               # already its own: no room
    e = h.fails(a, "m", "put", "e/x", 1, True, type="ValueError")
    assert "more than 1000 ephemeral entries" in e.message
    e = h.fails(a, "m", "txn", [], [["put", "e/y", 1, True]])
    assert "more than 1000 ephemeral entries" in e.message
    h.ok(a, "m", "put", "plain", 1)                            # a permanent one: no limit
    rev = read(h, "revision")
    h.end("expire", a)                                         # one call, within budget
    assert read(h, "keys")["keys"] == ["plain"] and read(h, "revision") == rev + 1000
    assert h.kernel.topics == {"m": [f"e/{i:04d}" for i in range(1000)]}


def test_a_watch_scans_the_whole_history_within_the_step_budget():
    h, s = made(history=20_000)
    h.ok(s, "m", "put", "wanted", 0)
    for i in range(1000):
        h.ok(s, "m", "txn", [], [["put", f"k{j}", i] for j in range(12)])
    got = read(h, "watch", "wanted", 0)                        # 12,001 events scanned
    assert [e["key"] for e in got["events"]] == ["wanted"] and got["revision"] == 1001
    with pytest.raises(NotYet):
        read(h, "watch", "nothing", 0)


# ============================================================================ checkpoint anywhere

def _random_run(seed: int, n: int = 60) -> list[tuple]:
    """Random calls: puts (some ephemeral), txns, deletes, cas, watches through the log
    (some with a timeout), sessions that end (expired or closed) and are replaced, ticks."""
    import random
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = f"{rng.choice('ab')}/{rng.randrange(3)}"
        kind = rng.choice(["put", "put", "txn", "delete", "cas", "watch", "end", "tick"])
        if kind == "put":
            out.append(("put", rng.randrange(4), k, i, rng.random() < 0.5))
        elif kind == "txn":
            out.append(("txn", rng.randrange(4), [[k, "exists", "==", True]],
                        [["put", k, i, True], ["get", k]], [["put", k, -i]]))
        elif kind == "delete":
            out.append(("delete", rng.randrange(4), k))
        elif kind == "cas":
            out.append(("cas", rng.randrange(4), k, rng.randrange(3), i))
        elif kind == "watch":
            out.append(("watch", rng.randrange(4), rng.choice(["a/", "b/1", ""]),
                        rng.randrange(0, i + 1), rng.choice([None, 1.0, 3.0])))
        elif kind == "end":
            out.append(("end", rng.randrange(4), rng.choice(["expire", "close"])))
        else:
            out.append(("tick", rng.choice([0.5, 2.0])))
    return out


def _play(h, sessions: list[int], actions: list[tuple]) -> None:
    for a in actions:
        if a[0] == "tick":
            h.tick(h.ts + a[1])
        elif a[0] == "end":
            h.end(a[2], sessions[a[1]])
            sessions[a[1]] = h.open_session()
        elif a[0] == "watch":
            h.call(sessions[a[1]], "m", "watch", a[2], a[3], timeout=a[4])
        else:
            h.call(sessions[a[1]], "m", a[0], *a[2:])


@pytest.mark.parametrize("seed", range(2))
def test_a_checkpoint_anywhere_changes_no_answer_and_a_restore_goes_on_alike(seed):
    """Two cuts of a random run: a checkpoint there (waiting watches kept in place) answers
    every later call as a run without it does, and so does a kernel restored from it."""
    from gesmas.server.kernel import Tick
    actions = _random_run(seed)
    for cut in (len(actions) // 3, 2 * len(actions) // 3):
        ref, s_ref = made(history=20)
        ses_ref = [s_ref] + ref.sessions(3)
        _play(ref, ses_ref, actions[:cut])
        ref.apply(Tick(ts=ref.ts, tag=ref.tag("c")))     # the checkpoint's index and tag
        mark = len(ref.trace)
        _play(ref, ses_ref, actions[cut:])

        h, s = made(history=20)
        ses = [s] + h.sessions(3)
        _play(h, ses, actions[:cut])
        h.checkpoint()
        r = h.restored()
        ses_r = list(ses)
        _play(h, ses, actions[cut:])
        _play(r, ses_r, actions[cut:])
        assert r.trace and h.trace[mark:] == ref.trace[mark:] == r.trace, (seed, cut)
        assert h.kernel.state_digest() == r.kernel.state_digest() == \
            ref.kernel.state_digest(), (seed, cut)


def test_a_maps_entries_count_in_its_owners_state_bytes_quota():
    """The map's state is measured like any object's (at a checkpoint here; a standard
    object's measure counts from the next checkpoint: kernel/capture.py): once its owner is
    over the state_bytes quota, the map takes no new calls, and says why."""
    from gesmas.objects import RESERVED_CLASSES, standard_sources
    from gesmas.server.kernel import Config, RegisterClass
    from gesmas.server.kernel.auth import SYSTEM
    quota = tuple((k, 200_000 if k == "state_bytes" else v)
                  for k, v in Config().default_quota)
    h = H(Config(reserved_classes=RESERVED_CLASSES, default_quota=quota))
    for _, src in standard_sources():
        assert h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM)).error is None
    assert h.create("Map", "m").error is None
    s = h.open_session()
    for i in range(3):
        assert h.results[h.call(s, "m", "put", f"k{i}", "x" * 100_000)].error is None
    h.checkpoint()                                           # measured: ~300 KB
    assert h.results[h.call(s, "m", "get", "k0")].error is None   # not counted yet
    h.checkpoint()                                           # counted from here
    e = h.error(h.call(s, "m", "put", "k9", 1), Code.RESOURCE_EXHAUSTED)
    assert e.type == "QuotaExceeded" and "state_bytes" in e.message
