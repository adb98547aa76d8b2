"""Fault injection against 3 real replica processes (DESIGN §7, §9).

Each test starts its own LocalCluster (stopped by pid in `finally`), runs a bounded client load
(every loop bounded in operations and in time), injects a fault with real signals or a TCP
partition, records every call in a HistoryRecorder and checks the history per object:
linearizability (tests/lincheck.py models) and, for queues, exactly-once delivery.

Outcomes: a call that returned is 'ok'; a wait that timed out (`Timeout`) is 'fail' (no
effect); a call that raised `Unavailable` (or another transport-level error) after the
client's own retries is 'unknown'. One summary line per fault is printed (pytest -s) and all
of them are written to a JSON file whose path is printed at the end of the module.

    .venv/bin/python -m pytest -m slow tests/test_faults.py -s
"""
from __future__ import annotations

import json
import os
import pickle
import random
import signal
import threading
import time
from collections import Counter
from typing import Any, Callable

import grpc
import pytest

from gesmas.client import (Aborted, ApplicationError, Client, GesmasError, SessionExpired,
                           Timeout, Unavailable)
from gesmas.client import convert
from gesmas.client.client import CHANNEL_OPTIONS
from gesmas.client.errors import error_from_rpc
from gesmas.server.cluster import LocalCluster, Member
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

import rawgrpc

try:
    from tests.faultcluster import FaultCluster
    from tests.faultproxy import FaultProxy
    from tests.lincheck import (CounterModel, HistoryRecorder, LockModel, QueueModel, check,
                                check_queue_exactly_once)
    from tests.lincheck_map import MapModel
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from faultcluster import FaultCluster
    from faultproxy import FaultProxy
    from lincheck import (CounterModel, HistoryRecorder, LockModel, QueueModel, check,
                          check_queue_exactly_once)
    from lincheck_map import MapModel

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

RETRY = 20.0            # the clients' retry_timeout: outages here are shorter
SUMMARY: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def summary_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "fault_summary.json"
    yield path
    path.write_text(json.dumps(SUMMARY, indent=2))
    print(f"\nfault summary ({len(SUMMARY)} faults) written to {path}")
    for s in SUMMARY:
        print("  " + _line(s))


def _line(s: dict[str, Any]) -> str:
    rec = s.get("recovery_s")
    rec = ", ".join(f"{x:.2f}" for x in rec) if isinstance(rec, list) else rec
    return (f"[{s['fault']}] ops completed={s['ops_ok']} (unknown={s['ops_unknown']}, "
            f"failed={s['ops_failed']}) recovery_s=[{rec}] lost={s['lost']} "
            f"duplicates={s['duplicates']} verdict={s['verdict']}"
            + (f" ({s['note']})" if s.get("note") else ""))


def report(fault: str, history: list, verdicts: dict[str, Any], recovery: list[float],
           lost: int = 0, duplicates: int = 0, note: str = "", **extra: Any) -> dict:
    st = Counter(o.status for o in history)
    worst = "ok"
    for v in verdicts.values():
        if v.verdict == "violation":
            worst = "violation"
        elif v.verdict == "unknown" and worst == "ok":
            worst = "unknown"
    s = {"fault": fault, "ops_ok": st["ok"], "ops_unknown": st["unknown"],
         "ops_failed": st["fail"], "recovery_s": [round(r, 3) for r in recovery],
         "lost": lost, "duplicates": duplicates, "verdict": worst,
         "verdicts": {k: f"{v.verdict}: {v.explanation[:300]}" for k, v in verdicts.items()},
         "note": note, **extra}
    SUMMARY.append(s)
    print("\n" + _line(s), flush=True)
    return s


# --- load helpers ------------------------------------------------------------------------------

def session_violations(seen: list) -> list[str]:
    """What `Load.session_reader` saw that sequential consistency forbids."""
    bad, last = [], 0
    for wrote, read in seen:
        if read < wrote:
            bad.append(f"read {read} after its own write gave {wrote}")
        if read < last:
            bad.append(f"read {read} after an earlier read of {last}")
        last = max(last, read)
    return bad


def watch_violations(history: list, key: str, events: list) -> list[str]:
    """What a watch stream of the whole map `key` (`Load.map_watcher`) saw that its
    guarantees forbid: a revision seen twice or out of order, one skipped (a map's revisions
    go up by one per change), or an acknowledged put up to the last revision seen that is
    not there with its value."""
    bad: list[str] = []
    seen: dict[int, list] = {}
    last = 0
    for e in events:
        r = e["revision"]
        if r < last:
            bad.append(f"revision {r} after {last}")
        if r != last and r in seen:
            bad.append(f"revision {r} seen twice")
        seen.setdefault(r, []).append((e["type"], e["key"], e.get("value")))
        last = max(last, r)
    if seen and sorted(seen) != list(range(min(seen), last + 1)):
        missing = sorted(set(range(min(seen), last + 1)) - set(seen))
        bad.append(f"revisions missing: {missing[:10]}")
    if seen and min(seen) != 1:
        bad.append(f"the first change seen is revision {min(seen)}, not 1")
    for o in history:
        if o.key == key and o.kind == "put" and o.status == "ok" and isinstance(o.output, dict):
            r = o.output["revision"]
            if r <= last and ("put", o.input[0], o.input[1]) not in seen.get(r, []):
                bad.append(f"put {o.input} acknowledged at revision {r} not seen there: "
                           f"{seen.get(r)}")
    return bad


def rotated(cluster: LocalCluster, i: int) -> list[str]:
    """The cluster's client addresses, member i first (the client's preferred replica)."""
    addrs = [m.client_addr for m in cluster.members]
    i %= len(addrs)
    return addrs[i:] + addrs[:i]


class Load:
    """Client threads doing bounded loops, all recorded in one HistoryRecorder."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.rec = HistoryRecorder()
        self.stop = threading.Event()
        self.clients: list[Client] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []          # unexpected exceptions (Internal, ...)
        self.unexpected: list[str] = []

    def client(self, prefer: int) -> Client:
        # half the clients call through the replica they prefer, half through the leader
        c = Client(rotated(self.cluster, prefer), retry_timeout=RETRY, session_ttl=10.0,
                   route="replica" if prefer % 2 else "leader")
        self.clients.append(c)
        return c

    def call(self, c: Client, key: str, kind: str, inp: tuple, fn: Callable[[], Any]) -> Any:
        """Run fn() as one recorded op; returns its output, or the string 'fail'/'unknown'."""
        h = self.rec.invoke(c.session, key, kind, inp)
        try:
            out = fn()
        except Timeout:
            self.rec.fail(h)
            return "fail"
        except ApplicationError as e:          # the method raised: a definite, visible answer
            self.rec.ok(h, ("error", e.type))
            return ("error", e.type)
        except (Unavailable, SessionExpired, Aborted) as e:
            self.rec.unknown(h)
            self.unexpected.append(f"{kind} on {key}: {type(e).__name__}: {e}")
            return "unknown"
        except GesmasError as e:
            self.rec.unknown(h)
            self.errors.append(f"{kind} on {key}: {type(e).__name__}: {e}")
            return "unknown"
        self.rec.ok(h, out)
        return out

    def spawn(self, body: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                body()
            except Exception as e:          # noqa: BLE001 - reported, fails the test
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
        t = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def loop(self, name: str, max_ops: int, max_seconds: float,
             step: Callable[[int], bool | None]) -> None:
        """Run step(n) for n = 0, 1, ... until stop, max_ops or max_seconds; step may
        return False to end the loop."""
        def body() -> None:
            end = time.monotonic() + max_seconds
            for n in range(max_ops):
                if self.stop.is_set() or time.monotonic() > end:
                    return
                if step(n) is False:
                    return
        self.spawn(body, name)

    def producer(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float,
                 acked: list | None = None) -> None:
        q = c.queue(key)

        def step(n: int) -> None:
            item = f"{tag}-{n}"
            out = self.call(c, key, "produce", (item,), lambda: q.produce(item))
            if out is None and acked is not None:
                acked.append((time.monotonic(), item))
        self.loop(f"producer-{tag}", max_ops, max_seconds, step)

    def consumer(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float) -> None:
        q = c.queue(key)
        self.loop(f"consumer-{tag}", max_ops, max_seconds,
                  lambda n: self.call(c, key, "consume", (), lambda: q.consume(timeout=1.0))
                  and None)

    def adder(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float) -> None:
        ctr = c.counter(key)
        self.loop(f"adder-{tag}", max_ops, max_seconds,
                  lambda n: self.call(c, key, "add", (1,), lambda: ctr.add(1)) and None)

    def reader(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float) -> None:
        """Counter.get: a declared reader, served without a log entry (linearizable: the
        client's default), checked with the adds by CounterModel."""
        ctr = c.counter(key)
        self.loop(f"reader-{tag}", max_ops, max_seconds,
                  lambda n: self.call(c, key, "get", (), lambda: ctr.get()) and None)

    def mapper(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float,
               seed: int) -> None:
        """A Map's get (a reader), put, cas and txn on three keys, checked by MapModel."""
        m = c.map(key)
        rng = random.Random(seed)
        versions: dict[str, int] = {}           # the versions this client's puts made

        def step(n: int) -> None:
            k, k2, v = rng.choice("abc"), rng.choice("abc"), f"{tag}-{n}"
            kind = rng.choice(("get", "get", "put", "cas", "txn"))
            if kind == "get":
                self.call(c, key, "get", (k,), lambda: m.get(k))
            elif kind == "put":
                out = self.call(c, key, "put", (k, v), lambda: m.put(k, v))
                if isinstance(out, dict):
                    versions[k] = out["version"]
            elif kind == "cas":
                expect = versions.get(k, 0)
                self.call(c, key, "cas", (k, expect, v), lambda: m.cas(k, expect, v))
            else:
                inp = ([[k, "version", ">", 0]], [["put", k2, v], ["get", k]], [["put", k, v]])
                self.call(c, key, "txn", inp, lambda: m.txn(*inp))
        self.loop(f"mapper-{tag}", max_ops, max_seconds, step)

    def map_watcher(self, c: Client, key: str, tag: str, max_seconds: float,
                    events: list) -> None:
        """Every change of the map `key` from its start, through one watch stream (a
        followed call) that goes on elsewhere from its last revision when its replica fails,
        stalls or is cut off; checked by `watch_violations`."""
        m = c.map(key)

        def body() -> None:
            end, rev = time.monotonic() + max_seconds, 0
            while not self.stop.is_set() and time.monotonic() < end:
                try:
                    for got in m.watch_stream("", rev, timeout=1.0):
                        events.extend(got["events"])
                        rev = got["revision"]
                        if self.stop.is_set() or time.monotonic() > end:
                            return
                except (Timeout, Unavailable):
                    continue        # a quiet second, or no replica for a while: from `rev`
        self.spawn(body, f"map-watcher-{tag}")

    def session_reader(self, c: Client, key: str, tag: str, max_ops: int,
                       max_seconds: float, seen: list) -> None:
        """Counter.add then Counter.get, alternately, by a client whose reads are sequential
        (README "Reads"): not linearizable, so not in the history (give it a counter of its
        own, whose every add is its own); `seen` gets, per step, the
        value the session's last acknowledged add returned and what the read gave, checked
        by `session_violations` (never below the session's own write, never going back)."""
        ctr = c.counter(key)
        wrote = [0]

        def step(n: int) -> None:
            try:
                if n % 2 == 0:
                    wrote[0] = ctr.add(1, timeout=2.0)
                else:
                    seen.append((wrote[0], ctr.get(timeout=2.0)))
            except (Timeout, Unavailable, SessionExpired, Aborted):
                return        # refused or not answered in time: allowed, never a stale value
        self.loop(f"session-reader-{tag}", max_ops, max_seconds, step)

    def locker(self, c: Client, key: str, tag: str, max_ops: int, max_seconds: float,
               fences: list | None = None) -> None:
        lock = c.lock(key)

        def step(n: int) -> bool | None:
            fence = self.call(c, key, "acquire", (), lambda: lock.acquire(timeout=3.0))
            if fence == "fail":
                return None
            if fence == "unknown":
                return False             # it may hold the lock: a session owns it, stop here
            if fences is not None:
                fences.append((time.monotonic(), fence))
            time.sleep(0.005)
            # Lock.release returns True; LockModel's release returns None
            out = self.call(c, key, "release", (),
                            lambda: None if lock.invoke("release") is True else "not True")
            return False if out == "unknown" else None
        self.loop(f"locker-{tag}", max_ops, max_seconds, step)

    def join(self, timeout: float = 90.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        assert not alive, f"load threads still running (a hang?): {alive}"

    def close(self) -> None:
        self.stop.set()
        for c in self.clients:
            try:
                c.close()
            except Exception:                # noqa: BLE001 - best effort at teardown
                pass


def probe_recovery(load: Load, c: Client, key: str, since: float, limit: float = 60.0) -> float:
    """Seconds from `since` (the fault) to the first successful commit of a counter add
    invoked after it."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        out = load.call(c, key, "add", (1,),
                        lambda: c.invoke("Counter", key, "add", 1))
        if isinstance(out, int) and not isinstance(out, bool):
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"no commit within {limit}s of the fault")


class ElectionWatch:
    """Polls, from `since` on, until one of `among` answers Status as the leader."""

    def __init__(self, cluster: LocalCluster, among: list[Member], since: float) -> None:
        self.elapsed: float | None = None
        self.leader: Member | None = None

        def run() -> None:
            try:
                self.leader = cluster.find_leader(timeout=30, among=among)
                self.elapsed = time.monotonic() - since
            except TimeoutError:
                pass
        self.thread = threading.Thread(target=run, daemon=True, name="election-watch")
        self.thread.start()

    def result(self) -> tuple[Member | None, float | None]:
        self.thread.join(35)
        return self.leader, self.elapsed


def a_follower(cluster: LocalCluster, leader: Member) -> Member:
    return next(m for m in cluster.members if m is not leader and cluster.alive(m))


def queue_outcome(history: list, key: str) -> tuple[int, int, list[str]]:
    """(lost, duplicates, problems) of a drained queue: acknowledged produces never
    consumed, and items consumed more often than produced."""
    ops = [o for o in history if o.key == key]
    acked = Counter(o.input[0] for o in ops if o.kind == "produce" and o.status == "ok")
    made = Counter(o.input[0] for o in ops if o.kind == "produce" and o.status != "fail")
    got = Counter(o.output for o in ops if o.kind in ("consume", "try_consume")
                  and o.status == "ok" and o.output is not None)
    lost = sum(1 for item in acked if got[item] == 0)
    # items are unique per produce call: any second delivery, or one never produced, is extra
    dups = sum(max(0, k - max(made[item], 1)) + (made[item] == 0) for item, k in got.items())
    problems = check_queue_exactly_once(ops, require_drained=True)
    return lost, dups, problems


def drain(load: Load, c: Client, key: str, limit: int = 20000) -> int:
    q = c.queue(key)
    n = 0
    for _ in range(limit):
        out = load.call(c, key, "try_consume", (), lambda: q.try_consume())
        if out is None:
            return n
        n += 1
    raise AssertionError(f"queue {key} not drained after {limit} items")


def show(cluster: LocalCluster) -> str:
    return "\n".join(cluster.tail(m, 40) for m in cluster.members)


# --- 1. kill -9 the leader, then a follower, under produce/consume load -----------------------

def test_kill_leader_then_follower_under_queue_load():
    cluster = LocalCluster(nodes=3)
    load = Load(cluster)
    try:
        cluster.start(timeout=90)
        setup = load.client(0)
        setup.queue("q1")
        setup.counter("c1")
        setup.map("m1", history=20_000)          # the watcher may lag through the faults
        probe = load.client(1)
        for i in range(3):
            load.producer(load.client(i), "q1", f"p{i}", max_ops=400, max_seconds=40)
            load.consumer(load.client(i + 1), "q1", f"c{i}", max_ops=600, max_seconds=40)
        load.adder(load.client(2), "c1", "a", max_ops=1000, max_seconds=40)
        load.reader(load.client(0), "c1", "r", max_ops=1000, max_seconds=40)
        load.mapper(load.client(1), "m1", "m", max_ops=600, max_seconds=40, seed=20)
        load.mapper(load.client(2), "m1", "n", max_ops=600, max_seconds=40, seed=21)
        watched: list = []
        load.map_watcher(load.client(0), "m1", "w", max_seconds=60, events=watched)
        time.sleep(2.0)

        recovery = []
        leader = cluster.find_leader()
        t = time.monotonic()
        cluster.kill(leader, signal.SIGKILL)
        watch = ElectionWatch(cluster, [m for m in cluster.members if m is not leader], t)
        recovery.append(probe_recovery(load, probe, "c1", t))
        new, elected = watch.result()
        elected = round(elected, 2) if elected is not None else None
        print(f"\nkill -9 leader node {leader.node_id}: next commit after {recovery[-1]:.2f}s "
              f"(node {new and new.node_id} answered as leader after {elected}s)")
        cluster.start_member(leader)
        cluster.wait_caught_up(leader, timeout=60)
        time.sleep(1.0)

        follower = a_follower(cluster, cluster.find_leader())
        t = time.monotonic()
        cluster.kill(follower, signal.SIGKILL)
        recovery.append(probe_recovery(load, probe, "c1", t))
        print(f"kill -9 follower node {follower.node_id}: next commit after {recovery[-1]:.2f}s")
        time.sleep(2.0)
        cluster.start_member(follower)
        cluster.wait_caught_up(follower, timeout=60)
        time.sleep(1.0)
        load.join()
        drained = drain(load, setup, "q1")

        history = load.rec.history()
        lost, dups, problems = queue_outcome(history, "q1")
        qh = [o for o in history if o.key == "q1"]
        ch = [o for o in history if o.key == "c1"]
        verdicts = {"q1": check(qh, QueueModel(), max_steps=3_000_000),
                    "c1": check(ch, CounterModel()),
                    "m1": check([o for o in history if o.key == "m1"], MapModel())}
        report("kill -9 leader, then follower (queue load)", history, verdicts, recovery,
               lost, dups, note=f"new leader answered {elected}s after the leader's kill; "
               f"drained {drained} at the end",
               unexpected=load.unexpected[:10])
        assert not load.errors, load.errors
        assert not problems, problems
        assert lost == 0 and dups == 0
        print(f"watch stream of m1: {len(watched)} changes, up to revision "
              f"{max((e['revision'] for e in watched), default=0)}")
        assert watched and not watch_violations(history, "m1", watched), \
            watch_violations(history, "m1", watched)[:5]
        for key, v in verdicts.items():
            assert v.verdict == "ok", f"{key}: {v.explanation}\n{show(cluster)}"
    finally:
        load.close()
        cluster.stop()


# --- 2. kill -9 all three nodes mid-load, restart from their data dirs ------------------------

def test_kill_all_nodes_and_restart_loses_nothing():
    cluster = LocalCluster(nodes=3)
    load = Load(cluster)
    try:
        cluster.start(timeout=90)
        setup = load.client(0)
        setup.queue("q2")
        setup.lock("l2")
        acked: list = []
        fences: list = []
        for i in range(3):
            load.producer(load.client(i), "q2", f"p{i}", max_ops=400, max_seconds=40,
                          acked=acked)
            load.locker(load.client(i + 1), "l2", f"l{i}", max_ops=200, max_seconds=40,
                        fences=fences)
        time.sleep(2.5)

        t = time.monotonic()
        for m in cluster.members:                     # as close together as signals go
            os.kill(m.proc.pid, signal.SIGKILL)
        for m in cluster.members:
            m.proc.wait(timeout=30)
        acked_before = {item for at, item in acked if at < t}
        fence_before = max((f for at, f in fences if at < t), default=0)
        for m in cluster.members:
            cluster.start_member(m)
        cluster.wait_ready(timeout=90)
        recovery = [_first_commit(setup, t)]
        print(f"\nkill -9 all: next commit {recovery[0]:.2f}s after the kill "
              f"({len(acked_before)} produces acknowledged before it)")
        time.sleep(3.0)
        load.join()
        drained = drain(load, setup, "q2")

        history = load.rec.history()
        lost, dups, problems = queue_outcome(history, "q2")
        consumed = {o.output for o in history if o.key == "q2" and o.status == "ok"
                    and o.kind == "try_consume" and o.output is not None}
        lost_pre_kill = sorted(acked_before - consumed)
        fences_after = [f for at, f in fences if at > t]
        verdicts = {"l2": check([o for o in history if o.key == "l2"], LockModel()),
                    "q2": check([o for o in history if o.key == "q2"], QueueModel(),
                                max_steps=3_000_000)}
        report("kill -9 all three nodes, restart from data dirs", history, verdicts, recovery,
               lost, dups, note=f"{len(acked_before)} acked before the kill, drained "
               f"{drained}; fences before <= {fence_before}, after: "
               f"{fences_after[:1]}..{fences_after[-1:]}", unexpected=load.unexpected[:10])
        assert not load.errors, load.errors
        assert not lost_pre_kill, f"acknowledged before the kill, lost: {lost_pre_kill[:20]}"
        assert not problems, problems
        assert lost == 0 and dups == 0
        assert fences_after, "no lock grant after the restart"
        assert min(fences_after) > fence_before, "a fence did not increase across the restart"
        seq = [f for _, f in sorted(fences)]
        assert len(set(seq)) == len(seq), "a fence was granted twice"
        for key, v in verdicts.items():
            assert v.verdict == "ok", f"{key}: {v.explanation}\n{show(cluster)}"
    finally:
        load.close()
        cluster.stop()


def _first_commit(c: Client, since: float) -> float:
    """After a restart: the counter c2 may not exist yet; create it (a commit) and time it."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            c.counter("c2").add(1)
            return time.monotonic() - since
        except Unavailable:
            time.sleep(0.05)
    raise AssertionError("no commit within 60s of the restart")


# --- 3. SIGSTOP the leader past the election timeout ------------------------------------------

def test_sigstop_leader_then_sigcont():
    cluster = LocalCluster(nodes=3)
    load = Load(cluster)
    try:
        cluster.start(timeout=90)
        setup = load.client(0)
        setup.lock("l3")
        setup.counter("c3")
        setup.map("m3", history=20_000)
        leader = cluster.find_leader()
        li = cluster.members.index(leader)
        probe = load.client(li + 1)               # prefers a replica that keeps running
        for i in range(3):                        # one locker and one adder per replica
            load.locker(load.client(li + i), "l3", f"l{i}", max_ops=300, max_seconds=20)
            load.adder(load.client(li + i), "c3", f"a{i}", max_ops=600, max_seconds=20)
            load.reader(load.client(li + i), "c3", f"r{i}", max_ops=600, max_seconds=20)
            load.mapper(load.client(li + i), "m3", f"m{i}", max_ops=300, max_seconds=20, seed=i)
        watched: list = []                        # through the replica about to stop
        wc = Client(rotated(cluster, li), retry_timeout=RETRY, session_ttl=10.0,
                    route="replica", consistency="sequential")
        load.clients.append(wc)
        load.map_watcher(wc, "m3", "w", max_seconds=40, events=watched)
        time.sleep(1.5)

        t = time.monotonic()
        os.kill(leader.proc.pid, signal.SIGSTOP)
        try:
            others = [m for m in cluster.members if m is not leader]
            new = cluster.find_leader(timeout=20, among=others)
            elected = time.monotonic() - t
            recovery = [probe_recovery(load, probe, "c3", t)]
            time.sleep(max(0.0, 3.0 - (time.monotonic() - t)))   # stopped for >= 3 s
        finally:
            os.kill(leader.proc.pid, signal.SIGCONT)
        stopped = time.monotonic() - t
        print(f"\nSIGSTOP leader node {leader.node_id} for {stopped:.1f}s: node {new.node_id} "
              f"elected after {elected:.2f}s, next commit after {recovery[0]:.2f}s")
        time.sleep(3.0)
        load.join()
        st = cluster.wait_caught_up(leader, timeout=30)

        history = load.rec.history()
        verdicts = {"l3": check([o for o in history if o.key == "l3"], LockModel()),
                    "c3": check([o for o in history if o.key == "c3"], CounterModel()),
                    "m3": check([o for o in history if o.key == "m3"], MapModel())}
        report("SIGSTOP leader 3 s, SIGCONT", history, verdicts, recovery,
               note=f"new leader elected after {elected:.2f}s; old leader is_leader="
               f"{st['is_leader']} afterwards", unexpected=load.unexpected[:10])
        assert not load.errors, load.errors
        print(f"watch stream of m3: {len(watched)} changes, up to revision "
              f"{max((e['revision'] for e in watched), default=0)}")
        assert watched and not watch_violations(history, "m3", watched), \
            watch_violations(history, "m3", watched)[:5]
        assert not st["is_leader"], "the paused leader is still (or again) the leader"
        for key, v in verdicts.items():
            assert v.verdict == "ok", f"{key}: {v.explanation}\n{show(cluster)}"
        fences = [o.output for o in sorted(history, key=lambda o: o.ret)
                  if o.key == "l3" and o.kind == "acquire" and o.status == "ok"]
        assert len(set(fences)) == len(fences), "a fence was granted twice"
    finally:
        load.close()
        cluster.stop()


# --- 4. a partition isolating the leader (TCP proxies between the Raft ports) -----------------

def raw_is_leader(m: Member, timeout: float,
                  metadata: tuple[tuple[str, str], ...] = ()) -> bool | None:
    """Whether m says it leads, in its own view (a sequential Status: no quorum needed);
    None if it did not answer within `timeout`."""
    with rawgrpc.channel(m.client_addr) as ch:
        try:
            r = pb_grpc.GesmasStub(ch).Status(
                pb.StatusRequest(read=pb.ReadOptions(consistency=pb.CONSISTENCY_SEQUENTIAL)),
                timeout=timeout, metadata=metadata)
            return r.is_leader
        except grpc.RpcError:
            return None


def test_partition_isolating_the_leader():
    cluster = FaultCluster(nodes=3, proxy_factory=FaultProxy)
    load = Load(cluster)
    try:
        cluster.start(timeout=90)
        setup = load.client(0)
        setup.lock("l4")
        setup.counter("c4")
        setup.map("m4", history=20_000)
        leader = cluster.find_leader()
        li = cluster.members.index(leader)
        probe = load.client(li + 1)
        for i in range(3):       # clients preferring each replica, the isolated one included
            load.locker(load.client(li + i), "l4", f"l{i}", max_ops=300, max_seconds=20)
            load.adder(load.client(li + i), "c4", f"a{i}", max_ops=600, max_seconds=20)
            load.reader(load.client(li + i), "c4", f"r{i}", max_ops=600, max_seconds=20)
            load.mapper(load.client(li + i), "m4", f"m{i}", max_ops=300, max_seconds=20,
                        seed=10 + i)
        # sequential reads through the replica about to be isolated (and through another)
        seq_seen: list[list] = [[], []]
        for j, seen in enumerate(seq_seen):
            c = Client(rotated(cluster, li + j), retry_timeout=RETRY, session_ttl=10.0,
                       route="replica", consistency="sequential")
            load.clients.append(c)
            load.session_reader(c, f"s{j}", f"s{j}", max_ops=600, max_seconds=20, seen=seen)
        watched: list = []                        # through the replica about to be cut off
        wc = Client(rotated(cluster, li), retry_timeout=RETRY, session_ttl=10.0,
                    route="replica", consistency="sequential")
        load.clients.append(wc)
        load.map_watcher(wc, "m4", "w", max_seconds=40, events=watched)
        time.sleep(1.5)
        with rawgrpc.channel(leader.client_addr) as ch:
            login = rawgrpc.metadata(ch)             # taken before: a login needs the log

        t = time.monotonic()
        cluster.partition(leader)
        stepped: list[float] = []

        def watch_step_down() -> None:   # its own view (a sequential read) says it gave up
            while time.monotonic() - t < 3.0 and not stepped:
                if raw_is_leader(leader, timeout=0.3, metadata=login) is False:
                    stepped.append(time.monotonic() - t)
                time.sleep(0.05)
        watcher = threading.Thread(target=watch_step_down, daemon=True)
        watcher.start()
        others = [m for m in cluster.members if m is not leader]
        new = cluster.find_leader(timeout=20, among=others)
        elected = time.monotonic() - t
        recovery = [probe_recovery(load, probe, "c4", t)]
        watcher.join(10)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - t)))     # isolated for ~3 s
        cluster.heal()
        stepped_down = round(stepped[0], 2) if stepped else None
        cut = time.monotonic() - t
        print(f"\npartition of leader node {leader.node_id} for {cut:.1f}s: node {new.node_id} "
              f"elected after {elected:.2f}s, next commit after {recovery[0]:.2f}s, old leader "
              f"stepped down after {stepped_down}s")
        time.sleep(2.0)
        load.join()
        st = cluster.wait_caught_up(leader, timeout=30)

        history = load.rec.history()
        verdicts = {"l4": check([o for o in history if o.key == "l4"], LockModel()),
                    "c4": check([o for o in history if o.key == "c4"], CounterModel()),
                    "m4": check([o for o in history if o.key == "m4"], MapModel())}
        report("partition isolating the leader ~3 s", history, verdicts, recovery,
               note=f"new leader after {elected:.2f}s; old leader stepped down after "
               f"{stepped_down}s; rejoined with is_leader={st['is_leader']}",
               unexpected=load.unexpected[:10],
               proxy_bytes_dropped={f"{a}-{b}": p.dropped for (a, b), p in
                                    cluster.proxies.items()})
        assert not load.errors, load.errors
        print(f"watch stream of m4: {len(watched)} changes, up to revision "
              f"{max((e['revision'] for e in watched), default=0)}")
        assert watched and not watch_violations(history, "m4", watched), \
            watch_violations(history, "m4", watched)[:5]
        for seen in seq_seen:
            assert seen and not session_violations(seen), session_violations(seen)[:5]
        assert stepped_down is not None, "the isolated leader never stepped down"
        for key, v in verdicts.items():
            assert v.verdict == "ok", f"{key}: {v.explanation}\n{show(cluster)}"
    finally:
        load.close()
        cluster.stop()


# --- 5. a snapshot taken while 100 consumers wait, loaded by a restarted replica --------------

def test_snapshot_with_100_blocked_consumers_keeps_fifo_order(tmp_path):
    n = 100
    # data in the pytest tmp dir, kept for a post-mortem (journals, snapshot, logs)
    cluster = LocalCluster(nodes=3, data_dir=str(tmp_path / "cluster"),
                           env={"GESMAS_CHECKPOINT_EVERY": "500", "GESMAS_LOG": "INFO",
                                "GESMAS_SNAPSHOT_EVERY": "2000"})
    clients: list[Client] = []
    stop = threading.Event()
    try:
        cluster.start(timeout=90)
        leader = cluster.find_leader()
        victim = a_follower(cluster, leader)
        # everything but the consumers' calls avoids the victim
        admin = Client([m.client_addr for m in cluster.members if m is not victim],
                       retry_timeout=RETRY)
        clients.append(admin)
        admin.queue("q5")
        # the consumers' sessions (kept alive by these clients); their calls go to the victim
        owners = [Client(cluster.addresses, retry_timeout=RETRY, session_ttl=15.0)
                  for _ in range(4)]
        clients += owners
        channel = rawgrpc.channel(victim.client_addr, options=CHANNEL_OPTIONS)
        stub = pb_grpc.GesmasStub(channel)
        meta = rawgrpc.metadata(channel)
        results: list[Any] = [None] * n
        attempts = [0] * n

        def consume(i: int, session: int, seq: int, secret: str) -> None:
            req = pb.InvokeRequest(session=session, seq=seq, class_name="Queue",
                                   object_name="q5", method="consume", session_secret=secret)
            end = time.monotonic() + 150
            while time.monotonic() < end and not stop.is_set():
                attempts[i] += 1
                try:
                    resp = stub.Invoke(req, timeout=max(0.1, end - time.monotonic()),
                                       metadata=meta)
                    results[i] = convert.from_value(resp.result)
                    return
                except grpc.RpcError as e:
                    err = error_from_rpc(e)
                    if not isinstance(err, Unavailable) and \
                            e.code() not in (grpc.StatusCode.CANCELLED,):
                        results[i] = ("error", type(err).__name__, str(err))
                        return
                time.sleep(0.2)             # the victim is down: retry there, same seq
            results[i] = ("gave up",)

        threads = []
        calls = []
        for i in range(n):
            owner = owners[i % len(owners)]
            calls.append((owner.session, owner._new_seq(), owner._session_secret))
            t = threading.Thread(target=consume, args=(i, *calls[-1]), daemon=True)
            t.start()
            threads.append(t)
            _wait_waiters(admin, "q5", i + 1)

        # Drive the log past the snapshot threshold (--snapshot-every 2000) so the victim
        # writes a snapshot: checkpoints (every 500 commands) interrupt and re-run the 100
        # waiters each time.
        snap = os.path.join(victim.data_dir, "snapshot.bin")
        pushers = [Client(admin.addresses[i % 2:] + admin.addresses[:i % 2],
                          retry_timeout=RETRY) for i in range(4)]
        clients += pushers
        pushed = [0]

        def push(c: Client) -> None:
            ctr = c.counter("c5")
            end = time.monotonic() + 120
            for _ in range(8000):
                if stop.is_set() or os.path.exists(snap) or time.monotonic() > end:
                    return
                ctr.add(1)
                pushed[0] += 1
        t0 = time.monotonic()
        pthreads = [threading.Thread(target=push, args=(c,), daemon=True)
                    for c in pushers for _ in range(2)]
        for t in pthreads:
            t.start()
        for t in pthreads:
            t.join(150)
        assert os.path.exists(snap), f"no snapshot after {pushed[0]} commands"
        with open(snap, "rb") as f:
            payload = pickle.load(f)
        ckpt, last = payload["checkpoint_index"], payload["last_entry"][1]
        print(f"\nsnapshot at index {last} (checkpoint at {ckpt}, {len(payload['commands'])} "
              f"commands after it) after {pushed[0]} adds in {time.monotonic() - t0:.1f}s")
        assert ckpt is not None, "the snapshot holds no checkpoint"
        assert (cluster.member_status(victim) or {}).get("waiter_count") == n

        t = time.monotonic()
        cluster.kill(victim, signal.SIGKILL)
        log_start = os.path.getsize(victim.log_path)
        cluster.start_member(victim)
        st = cluster.wait_caught_up(victim, timeout=60)
        recovery = time.monotonic() - t
        with open(victim.log_path, encoding="utf-8", errors="replace") as f:
            f.seek(log_start)
            log_text = f.read()
        loaded = "loaded snapshot at index" in log_text
        assert loaded, f"the restarted replica did not load its snapshot\n{cluster.tail(victim)}"
        assert st["waiter_count"] == n, f"restored waiters: {st['waiter_count']}"
        time.sleep(1.5)                 # the consumers re-attach to the victim (same seqs)

        producer = Client(rotated(cluster, cluster.members.index(leader)), retry_timeout=RETRY)
        clients.append(producer)
        pq = producer.queue("q5")
        for i in range(n):
            pq.produce(i)
        for th in threads:
            th.join(max(0.1, t + 120 - time.monotonic()))
        got = list(results)
        (tmp_path / "consumers.json").write_text(json.dumps(
            {"victim": victim.node_id, "leader": leader.node_id, "calls": calls,
             "results": [r if isinstance(r, int) else repr(r) for r in got]}))
        # every replica keeps the results (ack 0): a retry of each consume on each replica
        # returns that replica's own stored answer, which must be the same everywhere
        views = {m.node_id: _stored_results(m, calls) for m in cluster.members}
        diverged = {i: {k: v[i] for k, v in views.items()} for i in range(n)
                    if len({repr(v[i]) for v in views.values()}) > 1}
        in_order = got == list(range(n))
        stored_fifo = views[leader.node_id] == list(range(n))
        wrong = [(i, r) for i, r in enumerate(got) if r != i]
        items = [r for r in got if isinstance(r, int)]
        SUMMARY.append({"fault": "snapshot with 100 blocked consumers, kill -9 + restart",
                        "ops_ok": len(items) + n + pushed[0], "ops_unknown": 0,
                        "ops_failed": n - len(items), "recovery_s": [round(recovery, 3)],
                        "lost": n - len(set(items)), "duplicates": len(items) - len(set(items)),
                        "verdict": "ok" if in_order else "violation",
                        "note": f"snapshot index {last}, checkpoint {ckpt}; FIFO "
                                f"{'kept' if in_order else 'BROKEN'}; re-attach attempts "
                                f"{sum(attempts) - n}; replicas disagree on {len(diverged)} "
                                f"results; replicated (stored) results FIFO: {stored_fifo}",
                        "wrong": wrong[:10],
                        "diverged": {str(k): v for k, v in list(diverged.items())[:10]}})
        print(_line(SUMMARY[-1]), flush=True)
        assert not diverged, f"replicas disagree on consume results (victim node " \
            f"{victim.node_id}): {list(diverged.items())[:10]}\n{show(cluster)}"
        dup = {x: [i for i, r in enumerate(got) if r == x] for x in set(items)
               if items.count(x) > 1}
        assert in_order, f"consumers released out of order / not at all: {wrong[:10]}; " \
                         f"items delivered to several consumers: {list(dup.items())[:10]}; " \
                         f"stored results agree on all replicas: {not diverged}, are FIFO: " \
                         f"{stored_fifo}\n" \
                         f"{show(cluster)}"
    finally:
        stop.set()
        for c in clients:
            try:
                c.close()
            except Exception:                # noqa: BLE001
                pass
        cluster.stop()


def _stored_results(m: Member, calls: list[tuple[int, int, str]]) -> list[Any]:
    """Re-send each (session, seq) consume to m alone: its stored result, or the error."""
    out: list[Any] = []
    with rawgrpc.channel(m.client_addr) as ch:
        stub = pb_grpc.GesmasStub(ch)
        meta = rawgrpc.metadata(ch)
        for session, seq, secret in calls:
            req = pb.InvokeRequest(session=session, seq=seq, class_name="Queue",
                                   object_name="q5", method="consume", timeout=0.0,
                                   session_secret=secret)
            try:
                out.append(convert.from_value(stub.Invoke(req, timeout=10,
                                                          metadata=meta).result))
            except grpc.RpcError as e:
                out.append(("error", repr(error_from_rpc(e))[:80]))
    return out


def _wait_waiters(c: Client, name: str, k: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(o["name"] == name and o["waiters"] >= k for o in c.list_objects()):
            return
        time.sleep(0.01)
    raise AssertionError(f"{name}: fewer than {k} waiters after {timeout}s")
