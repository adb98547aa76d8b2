"""The runaway defence without a cluster: the kernel's side of an aborted entry, the
watchdog's decision (CPU burned, never time stood still), the watchdog process against a
real spinning C call and a SIGSTOPped one, and the applier's hold / abort / rollback rules on
in-process replicas (replication/applier.py).

The applier tests drive several `Applier`s with the same committed log, each in another
situation (it held the entry, applied it, applied it and a checkpoint after it, replays the
log with the abort ahead), and check that they end with the same state.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

from gesmas.server.kernel import Checkpoint, Code, Config, Invoke, Kernel, codec, encode
from gesmas.server.replication import Replica
from gesmas.server.replication.applier import (Applier, ApplyFailed, decode_abort,
                                               encode_abort)
from gesmas.server.replication.watchdog import (PAGE_NAME, RECORD_NAME, UNGUARDED, Record,
                                                Watch, read_page, read_record, write_record)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_harness import H  # noqa: E402
from replication_node import ListSM, TEST_SECRET, free_ports, restore  # noqa: E402


# ------------------------------------------------------------------------------ the kernel
COUNTER = "class C:\n    def __init__(self):\n        self.n = 0\n" \
          "    def add(self):\n        self.n += 1\n        return self.n\n"


def test_an_aborted_call_fails_and_a_retry_gets_the_same_error_without_running():
    h = H()
    s = h.open_session()
    h.register(COUNTER)
    h.create("C", "c")
    h.index += 1                                      # entry h.index: the call, aborted
    invoke = Invoke(ts=h.ts, tag="x", session=s, seq=1, name="c", method="add",
                    secret=h.kernel.sessions[s].secret)
    [done] = h.kernel.abort(h.index, encode(invoke), "ran away")
    assert (done.tag, done.error.code, done.error.message, done.error.type) == \
        ("x", Code.RESOURCE_EXHAUSTED, "ran away", "RunawayAborted")
    retry = h.call(s, "c", "add", seq=1)
    assert h.error(retry, Code.RESOURCE_EXHAUSTED).message == "ran away"
    assert h.value(h.call(s, "c", "add", seq=2)) == 1          # it never ran
    with pytest.raises(ValueError):
        h.kernel.abort(h.index, encode(invoke), "too late")


def test_the_native_stall_failpoint_exists_only_when_configured():
    src = "class S:\n    def run(self, n):\n        return native_stall(n)\n"
    for on in (False, True):
        h = H(Config(failpoint_native_stall=on))
        s = h.open_session()
        h.register(src)
        h.create("S", "s")
        t = h.call(s, "s", "run", 10)
        if on:
            assert h.value(t) == 45
        else:
            assert h.error(t, Code.APPLICATION).type == "NameError"


# --------------------------------------------------------------------- the watchdog's rule
def test_watch_counts_cpu_burned_on_one_entry_not_time():
    cpu = {"t": 0.0}
    w = Watch(2.0, lambda tid: cpu["t"])
    assert not w.step(1, 10, 7, 0)          # first sighting of entry 10
    cpu["t"] = 1.5
    assert not w.step(1, 10, 7, 0)
    for _ in range(100):                    # stopped (SIGSTOP) or descheduled: no CPU, no kill
        assert not w.step(1, 10, 7, 0)
    cpu["t"] = 2.1
    assert w.step(1, 10, 7, 0) and w.burned == pytest.approx(2.1)
    assert not w.step(2, 11, 7, 0)          # another entry starts from zero
    cpu["t"] = 9.0
    assert not w.step(2, 11, 7, UNGUARDED)  # the cluster kept it: no limit
    assert not w.step(2, 0, 7, 0)           # idle
    assert not w.step(3, 12, 7, 0)
    cpu["t"] = 10.0
    assert not w.step(3, 12, 7, 0)


_CHILD = textwrap.dedent("""
    import sys
    from gesmas.server.replication.watchdog import ApplyMonitor
    m = ApplyMonitor(sys.argv[1], float(sys.argv[2]), poll=0.05)
    m.begin(42, b"the entry")
    print("spinning", flush=True)
    sum(range(int(sys.argv[3])))     # one C call that holds the GIL
    m.end()
    print("done", flush=True)
    m.stop()
""")


def _child(tmp_path, limit, n):
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(limit), str(n)],
                            stdout=subprocess.PIPE, text=True)


def test_the_watchdog_kills_a_process_spinning_in_c_and_records_the_entry(tmp_path):
    p = _child(tmp_path, 0.5, 10 ** 12)
    try:
        assert p.stdout.readline() == "spinning\n"
        assert p.wait(timeout=120) == -signal.SIGKILL
    finally:
        p.kill()
        p.wait()
    assert read_record(str(tmp_path)) == Record(42, zlib.crc32(b"the entry"), 0.5)


def test_the_watchdog_spares_a_stopped_process(tmp_path):
    """SIGSTOP in the middle of an entry, for longer than the limit: the entry burns no CPU
    meanwhile, so the watchdog (which keeps polling) leaves it alone."""
    limit, poll = 1.0, 0.05
    p = _child(tmp_path, limit, 10 ** 7)          # well under the limit in CPU
    try:
        assert p.stdout.readline() == "spinning\n"
        os.kill(p.pid, signal.SIGSTOP)
        page = os.path.join(tmp_path, PAGE_NAME)
        polls, deadline = read_page(page)[-1], time.monotonic() + 60
        while read_page(page)[-1] < polls + 3 * limit / poll:   # the watchdog looked on
            assert time.monotonic() < deadline, "the watchdog stopped polling"
            time.sleep(poll)
        assert read_page(page)[2] == 42 and p.poll() is None
        os.kill(p.pid, signal.SIGCONT)
        assert p.stdout.readline() == "done\n"
        assert p.wait(timeout=60) == 0
    finally:
        os.kill(p.pid, signal.SIGCONT) if p.poll() is None else None
        p.kill()
        p.wait()
    assert not os.path.exists(os.path.join(tmp_path, RECORD_NAME))


# ------------------------------------------------------------------------ the applier
def crc(data):
    return zlib.crc32(data)


class Replay:
    """An Applier over ListSM, fed a log; records what it delivers and proposes."""

    def __init__(self, record=None, pending=()):
        self.out = []
        self.forgotten = 0
        self.pending = set(pending)           # entries with a committed abort ahead
        self.a = Applier(ListSM, restore, self.out.extend, record=record,
                         forget_record=self._forget, pending_abort=self.pending.__contains__)

    def _forget(self):
        self.forgotten += 1

    def feed(self, log, start=1):
        for index, data in enumerate(log, start=start):
            self.a.apply(index, data)
        return self

    @property
    def items(self):
        return self.a.sm.items


LOG = [b"a", b"b", b"X", b"c", b"d"]          # entry 3 runs away
X = 3


def test_a_held_entry_is_aborted_and_what_came_after_it_applied_in_order():
    r = Replay(record=Record(X, crc(b"X"), 1.5)).feed(LOG)
    assert r.items == [(1, b"a"), (2, b"b")] and [i for i, _ in r.a.held] == [3, 4, 5]
    assert r.a.applied == 2
    proposal = r.a.due_proposal(now=100.0)
    assert decode_abort(proposal) == (X, crc(b"X"), 1.5)
    assert r.a.due_proposal(now=100.1) is None          # again after PROPOSE_EVERY
    assert r.a.due_proposal(now=101.0) == proposal
    r.a.apply(6, proposal)
    assert r.items == [(1, b"a"), (2, b"b"), (3, b"aborted:X"), (4, b"c"), (5, b"d")]
    assert not r.a.held and r.a.record is None and r.forgotten == 1 and r.a.aborts == 1
    assert [c.index for c in r.out] == [1, 2, -3, 4, 5]
    r.a.apply(7, proposal)                              # a duplicate: nothing happens
    r.a.apply(8, b"e")
    assert r.items[-1] == (8, b"e") and r.a.aborts == 1


def _same_state(*replays):
    states = [r.items for r in replays]
    assert all(s == states[0] for s in states), states


def test_every_replica_ends_with_the_same_state_whether_it_held_applied_or_replays():
    x = 4
    log = [b"a", b"ckpt1", b"b", b"X", b"c", b"ckpt2", b"d", encode_abort(x, crc(b"X"), 1.5),
           b"e"]
    holder = Replay(record=Record(x, crc(b"X"), 1.5)).feed(log)
    fast = Replay().feed(log)                            # applied X and one checkpoint after
    replay = Replay(pending={x}).feed(log)               # restarted: the abort is ahead
    _same_state(holder, fast, replay)
    assert (x, b"aborted:X") in fast.items and fast.a.aborts == 1
    assert fast.a.gens[-1].index == 6 and fast.a.marks == [2, 6]   # ckpt2 re-made
    assert [c.tag for c in fast.out].count("c") == 2     # re-applied completions delivered too


def test_an_entry_with_two_checkpoints_after_it_stands_everywhere():
    x = 2
    abort = encode_abort(x, crc(b"X"), 1.5)
    log = [b"a", b"X", b"ckpt1", b"b", b"ckpt2", abort, b"c"]
    holder = Replay(record=Record(x, crc(b"X"), 1.5)).feed(log)
    fast = Replay().feed(log)
    _same_state(holder, fast)
    assert (x, b"X") in fast.items and fast.a.aborts == holder.a.aborts == 0
    assert holder.a.record is None and not holder.a.held


def test_the_watchdog_is_told_when_an_entry_the_cluster_kept_runs_unguarded():
    class Monitor:
        def __init__(self):
            self.seen = []

        def begin(self, index, data, guarded=True):
            self.seen.append((index, guarded))

        def end(self):
            pass
    x = 2
    log = [b"a", b"X", b"ckpt1", b"ckpt2", encode_abort(x, crc(b"X"), 1.0)]
    holder = Replay(record=Record(x, crc(b"X"), 1.0))
    holder.a.monitor = m = Monitor()
    holder.feed(log)
    assert (2, False) in m.seen and (3, True) in m.seen


def test_aborts_that_name_no_entry_or_the_wrong_bytes_change_nothing():
    base = [b"a", b"X", b"b"]
    for bad in (encode_abort(2, crc(b"other"), 1.0),     # a stale record's CRC
                encode_abort(9, crc(b"X"), 1.0),         # not before the abort
                encode_abort(0, 0, 1.0), b"\xffgesmas-abort\x00short"):
        r = Replay().feed(base + [bad, b"c"])
        assert r.items == [(1, b"a"), (2, b"X"), (3, b"b"), (5, b"c")], bad


def test_a_replica_that_cannot_roll_back_stops():
    """It loaded a snapshot whose checkpoint is after X: it cannot undo X."""
    src = Replay().feed([b"a", b"X", b"ckpt1", b"b"])
    payload, _ = src.a.snapshot(4)
    r = Replay()
    r.a.load(payload, 4)
    with pytest.raises(ApplyFailed, match="cannot abort log entry 2"):
        r.a.apply(5, encode_abort(2, crc(b"X"), 1.0))


def test_snapshots_keep_an_aborted_entry_aborted_and_are_refused_while_holding():
    x = 2
    r = Replay(record=Record(x, crc(b"X"), 1.0)).feed([b"a", b"X", b"b"])
    with pytest.raises(RuntimeError, match="held"):
        r.a.snapshot(3)
    r.a.apply(4, encode_abort(x, crc(b"X"), 1.0))
    payload, aborted_inside = r.a.snapshot(4)
    assert aborted_inside and payload["aborted"] == {2: 1.0}
    loaded = Replay()
    loaded.a.load(pickle.loads(pickle.dumps(payload)), 4)
    _same_state(r, loaded)
    loaded.a.apply(5, encode_abort(x, crc(b"X"), 1.0))   # a late duplicate: still a no-op
    assert loaded.items == r.items


class KernelSM:
    """The kernel as the Replica drives it (node.StateMachine without the node)."""

    def __init__(self, kernel=None):
        self.kernel = kernel or Kernel(Config())

    checkpoint_index = property(lambda self: self.kernel.checkpoint_index)
    checkpoint_blob = property(lambda self: self.kernel.checkpoint_blob)

    def apply(self, index, data):
        return self.kernel.apply(index, data)

    def abort(self, index, data, message):
        return self.kernel.abort(index, data, message)

    @staticmethod
    def is_checkpoint(data):
        return codec.is_checkpoint(data)


def test_with_the_kernel_a_rollback_ends_where_holding_does():
    """A replica that applied X and took a checkpoint after it restores the checkpoint
    before X: the same digest as one that held X, the caller's error kept in the session."""
    h = H()
    s = h.open_session()
    h.register(COUNTER)
    h.create("C", "c")
    secret = h.kernel.sessions[s].secret
    log = [encode(cmd) for _, cmd in h.log]

    def add(seq):
        return encode(Invoke(ts=1.0, tag=f"t{seq}", session=s, seq=seq, name="c",
                             method="add", secret=secret))
    ckpt = encode(Checkpoint(ts=1.0))
    log += [ckpt, add(1), add(2), add(3), ckpt, add(4)]
    x = len(h.log) + 3                                  # the entry of add(2)
    log += [encode_abort(x, crc(log[x - 1]), 2.0), add(5)]

    def replica(**kw):
        out = []
        a = Applier(KernelSM, lambda blob: KernelSM(Kernel.restore(blob, Config())),
                    out.extend, **kw)
        for index, data in enumerate(log, start=1):
            a.apply(index, data)
        return a, out
    held, _ = replica(record=Record(x, crc(log[x - 1]), 2.0))
    fast, out = replica()
    replay, _ = replica(pending_abort=lambda index: index == x)
    digests = {r.sm.kernel.state_digest() for r in (held, fast, replay)}
    assert len(digests) == 1 and fast.aborts == 1
    assert fast.sm.kernel.sessions[s].results[2][1].type == "RunawayAborted"
    assert [c.value for c in out if c.tag == "t5"] == [4]     # add(2) never counted


# ---------------------------------------------------- a Replica with its journal and record
def _run(data_dir, me, tags, compact=False):
    got = queue.Queue()
    r = Replica(me, [], data_dir, fresh=ListSM, restore=restore,
                on_completions=lambda cs: [got.put(c) for c in cs], password=TEST_SECRET)
    seen = []

    def run(batch):
        for tag in batch:
            r.propose(tag.encode())
        pending = set(batch)
        while pending:
            seen.append(got.get(timeout=20))
            pending.discard(seen[-1].tag)
    try:
        assert r.wait_ready(10)
        run(tags)
        if compact:   # pysyncobj snapshots in the tick that adds a marker, compacts one later
            r.force_compaction()
            run(["marker"])
            run(["marker2"])
            assert r._journal.first_index > 1
        return [(i, d.decode()) for i, d in r._sm.items], r.status(), seen
    finally:
        r.destroy()


def test_a_replica_restarted_with_a_runaway_record_has_the_entry_aborted_and_so_on_replay(
        tmp_path):
    data_dir, me = str(tmp_path), f"127.0.0.1:{free_ports(1)[0]}"
    items, _, _ = _run(data_dir, me, ["a", "X", "b"])
    x = next(i for i, d in items if d == "X")
    write_record(data_dir, Record(x, crc(b"X"), 2.0), 2.0)   # as if the watchdog fired on X
    items, st, seen = _run(data_dir, me, ["c"])   # holds X, has it aborted, applies the rest
    assert [d for _, d in items] == ["a", "aborted:X", "b", "c"]
    assert st["runaway_aborts"] == 1 and st["holding"] is None
    assert not any(c.tag == "X" and c.index > 0 for c in seen)     # X never ran
    assert not os.path.exists(os.path.join(data_dir, RECORD_NAME))
    again, st, seen = _run(data_dir, me, ["d"], compact=True)   # the abort is ahead in the log
    assert again[:len(items) + 1] == items + [(again[len(items)][0], "d")]
    assert st["runaway_aborts"] == 1 and not any(c.tag == "X" and c.index > 0 for c in seen)
    with open(os.path.join(data_dir, "snapshot.bin"), "rb") as f:
        assert pickle.load(f)["format"] == 2            # it holds the aborted entry
    last, _, seen = _run(data_dir, me, ["e"])         # restored from that snapshot
    assert last[:len(again)] == again and not any(c.tag == "X" for c in seen)
