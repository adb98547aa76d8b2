"""The kernel's tables of objects kept in dicts of at most EPOCH names (kernel/epochdict.py):
the same answers and the same order as one dict, under any sequence of changes, and the same
checkpoint and state digest as a kernel whose tables are one part each, also after a restore."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gesmas.server.kernel import DeleteObject, Kernel, epochdict
from gesmas.server.kernel.epochdict import EpochDict

try:
    from tests.kernel_harness import replay
    from tests.test_objects import OH
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from kernel_harness import replay
    from test_objects import OH

KEYS = st.sampled_from([f"k{i}" for i in range(12)])
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), KEYS, st.integers(0, 9)),
    st.tuples(st.just("del"), KEYS), st.tuples(st.just("pop"), KEYS),
    st.tuples(st.just("popitem")), st.tuples(st.just("clear")),
    st.tuples(st.just("setdefault"), KEYS, st.integers(0, 9)),
    st.tuples(st.just("update"), st.lists(st.tuples(KEYS, st.integers(0, 9)), max_size=5))),
    max_size=60)


def _where_agrees(d):
    """Every key's shard of `where` names the part that holds it, and holds nothing else."""
    for part in d.parts:
        for key in part:
            assert d.where[hash(key) & epochdict._MASK][key] is part, key
    assert sum(map(len, d.where)) == len(d)
    assert all(hash(k) & epochdict._MASK == i for i, shard in enumerate(d.where) for k in shard)


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(epochdict, "EPOCH", 3)


def _apply(d, op):
    kind, *args = op
    try:
        if kind == "set":
            d[args[0]] = args[1]
        elif kind == "del":
            del d[args[0]]
        elif kind == "pop":
            return d.pop(args[0])
        elif kind == "popitem":
            return d.popitem()
        elif kind == "clear":
            d.clear()
        elif kind == "setdefault":
            return d.setdefault(args[0], args[1])
        else:
            d.update(args[0])
    except KeyError:
        return KeyError
    return None


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_the_parts_answer_and_iterate_as_one_dict(ops):
    epochdict.EPOCH, saved = 3, epochdict.EPOCH      # (hypothesis runs the body many times)
    try:
        ours: EpochDict[str, int] = EpochDict()
        ref: dict[str, int] = {}
        for op in ops:
            assert _apply(ours, op) == _apply(ref, op), op
            assert list(ours.items()) == list(ref.items()), op
            assert list(ours) == list(ref) and list(ours.values()) == list(ref.values())
            assert len(ours) == len(ref) and bool(ours) == bool(ref)
            assert all(len(part) <= 3 for part in ours.parts) and ours.parts
            assert all(ours.parts[:-1]), "an empty part kept besides the last"
            _where_agrees(ours)
            for key in ("k0", "k5", "k11"):
                assert (key in ours) == (key in ref) and ours.get(key) == ref.get(key)
                assert ((key, ref.get(key)) in ours.items()) == (key in ref)
            assert ours.values_of(list(ref)) == list(ref.values()) and ours == ref
        with pytest.raises(KeyError):
            ours.values_of(["absent"])
    finally:
        epochdict.EPOCH = saved


def test_a_key_set_again_keeps_its_place_and_one_made_again_goes_last(small_parts):
    d: EpochDict[str, int] = EpochDict((f"k{i}", i) for i in range(7))
    assert [len(p) for p in d.parts] == [3, 3, 1]
    d["k1"] = 10                                  # in the first part: stays there
    del d["k4"]
    d["k4"] = 40                                  # made again: after every other
    assert list(d.items()) == [("k0", 0), ("k1", 10), ("k2", 2), ("k3", 3), ("k5", 5),
                               ("k6", 6), ("k4", 40)]
    for k in ("k3", "k5"):
        del d[k]                                  # a part emptied is dropped
    assert [list(p) for p in d.parts] == [["k0", "k1", "k2"], ["k6", "k4"]]


PICKLED_ELSEWHERE = """
import pickle, sys
from gesmas.server.kernel.epochdict import EpochDict
d = pickle.loads(sys.stdin.buffer.read())
assert type(d) is EpochDict and len(d.parts) == 3, d.parts
assert list(d.items()) == [(f"k{i}", i) for i in range(7) if i != 4] + [("k4", 40)]
assert all(d[f"k{i}"] == (40 if i == 4 else i) for i in range(7)) and "k7" not in d
d["k7"] = 7
del d["k0"]
print(list(d))
"""


def test_a_table_pickled_here_is_found_by_its_keys_in_a_process_of_another_hash_seed(
        small_parts):
    # `where` places keys by hash, which another process computes with another seed: a
    # pickle carries the items, and the process that loads it places them again
    import os
    import pickle
    import subprocess
    import sys
    d: EpochDict[str, int] = EpochDict((f"k{i}", i) for i in range(7))
    del d["k4"]
    d["k4"] = 40
    assert pickle.loads(pickle.dumps(d)) == d
    code = "import gesmas.server.kernel.epochdict as e; e.EPOCH = 3\n" + PICKLED_ELSEWHERE
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(d),
                             capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed},
                             timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode().split() == [
            "['k1',", "'k2',", "'k3',", "'k5',", "'k6',", "'k4',", "'k7']"]


def _log_with_parts():
    """A log that makes, calls, deletes and makes again objects across many parts, with
    checkpoints between."""
    h = OH()
    s = h.open_session()
    for i in range(40):
        h.make("Counter", f"c{i:02d}")
        if i % 7 == 3:
            h.checkpoint()
    for i in range(0, 40, 3):
        h.run(DeleteObject(ts=h.ts, tag=h.tag(), name=f"c{i:02d}"))
    h.make("Queue", "q")
    for i in range(0, 40, 6):
        h.make("Counter", f"c{i:02d}")            # made again: after the others
        h.ok(s, f"c{i:02d}", "add", i)
    h.checkpoint()
    h.ok(s, "c01", "add", 5)
    h.ok(s, "q", "produce", "x")
    h.checkpoint()
    return h


def test_a_kernel_whose_tables_are_in_many_parts_gives_the_same_checkpoint_and_digest(
        monkeypatch):
    one = _log_with_parts()                         # the default: one part each here
    assert len(one.kernel.state.objects.parts) == 1
    monkeypatch.setattr(epochdict, "EPOCH", 4)
    many, _ = replay(one.log, Kernel(one.kernel.config))
    objects, frames = many.state.objects, many.state.frames
    assert len(objects.parts) > 5 and len(frames.parts) > 5 and len(frames.page_of.parts) > 5
    assert list(objects) == list(one.kernel.state.objects)        # creation order
    assert many.checkpoint_blob == one.kernel.checkpoint_blob
    assert many.state_digest() == one.kernel.state_digest()
    # restored with small parts (its own boundaries), then the same commands again
    restored = Kernel.restore(many.checkpoint_blob, many.config)
    assert list(restored.state.objects) == list(objects)
    assert restored.state_digest() == many.state_digest()
    more = OH(kernel=restored)
    more.index, more.ts = many.index, many.now
    s = more.open_session()
    more.ok(s, "c02", "add", 1)
    more.make("Counter", "late")
    more.checkpoint()
    again, _ = replay(more.log, many)
    assert again.checkpoint_blob == restored.checkpoint_blob
    assert again.state_digest() == restored.state_digest()


def test_names_picked_to_fall_in_one_shard_are_still_found_and_kept_in_order(small_parts):
    # a client knows the replicas' hash seed and can pick names for one shard of `where`
    # (docs/performance.md, "What a hostile client can still do to the tables"): that shard
    # grows as one dict did, but the answers and the order stay those of a dict
    names = [n for n in (f"evil-{i}" for i in range(20_000)) if hash(n) & epochdict._MASK == 0]
    assert len(names) > 200
    ours: EpochDict[str, int] = EpochDict()
    ref: dict[str, int] = {}
    for i, n in enumerate(names):
        ours[n] = ref[n] = i
    for n in names[::3]:
        del ours[n], ref[n]
    for n in names[:50]:
        ours[n] = ref[n] = -1
    assert list(ours.items()) == list(ref.items()) and ours == ref
    assert all(ours[n] == ref[n] for n in ref) and "evil-x" not in ours
    assert [len(s) for s in ours.where].count(0) == epochdict.SHARDS - 1
    _where_agrees(ours)
