"""One gesmas replica with a fake state machine, driven over stdin/stdout (JSON lines).

Used by tests/test_replication.py, and as a benchmark that prints figures:

    .venv/bin/python tests/replication_node.py bench                # gesmas settings
    .venv/bin/python tests/replication_node.py bench --pysyncobj-defaults

Node mode: ``replication_node.py node --self ADDR --peers A,B --data DIR [--no-fsync]``.
Requests on stdin: {"op": ..., "rid": n, ...}; replies and events on stdout: {"ev": ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_SECRET = "replication-test-secret"  # the cluster secret tests use (loopback only)


@dataclass(frozen=True)
class Completion:
    tag: str
    index: int


class ListSM:
    """Append-only list of (index, data); a command starting with b'ckpt' is a checkpoint."""

    def __init__(self, items=None):
        self.items = list(items or [])
        self.checkpoint_index = None
        self.checkpoint_blob = None
        self.order_violations = 0

    def apply(self, index, data):
        if self.items and index <= self.items[-1][0]:
            self.order_violations += 1
        self.items.append((index, bytes(data)))
        if data.startswith(b"ckpt"):
            self.checkpoint_index = index
            self.checkpoint_blob = pickle.dumps(self.items)
        return [Completion(bytes(data).decode(), index)]

    def abort(self, index, data, message):
        """The entry at `index` was aborted (replication/applier.py): recorded as such."""
        self.items.append((index, b"aborted:" + bytes(data)))
        return [Completion(bytes(data).decode(), -index)]

    @staticmethod
    def is_checkpoint(data):
        return data.startswith(b"ckpt")


def restore(blob):
    return ListSM(pickle.loads(blob))


# ----------------------------------------------------------------------------- node mode
class NodeMain:
    def __init__(self, args):
        from gesmas.server.replication import RaftTuning, Replica
        self.out_lock = threading.Lock()
        self.waiting = {}  # tag -> callable(index), for local benchmarks
        self.mine = set()  # tags proposed through this node (the gateway's pending table)
        self.lock = threading.Lock()
        self.applied = threading.Condition()
        tuning = RaftTuning()
        if args.pysyncobj_defaults:
            tuning = RaftTuning(append_entries_period=0.1, raft_min_timeout=0.4,
                                raft_max_timeout=1.4, leader_fallback_timeout=30.0,
                                connection_retry_time=5.0, use_batch=True,
                                batch_size_bytes=2 ** 16, snapshot_chunk_bytes=2 ** 16,
                                log_compaction_min_entries=5000)
        if args.compaction_min_entries:
            tuning = RaftTuning(**{**tuning.__dict__,
                                   "log_compaction_min_entries": args.compaction_min_entries})
        self.replica = Replica(args.self, [p for p in args.peers.split(",") if p], args.data,
                               fresh=ListSM, restore=restore, on_completions=self.on_completions,
                               on_role_change=self.on_role, fsync=not args.no_fsync,
                               password=args.password, tuning=tuning,
                               new_cluster=args.new_cluster)
        if args.slow_sync_ms:
            self._simulate_slow_disk(args.slow_sync_ms / 1000, args.slow_sync_when)

    def _simulate_slow_disk(self, delay, when="follower"):
        """While this node is a follower (`when`: or the leader, or either), each journal sync
        takes `delay` longer *before* the data is written: an acknowledgement sent ahead of
        its sync would let the (fast) leader commit entries that both followers then lose to
        a kill -9, and elect each other without; a leader counting its own copy before it is
        written would commit entries that only one follower holds."""
        journal = self.replica._journal
        real_persist = journal._persist

        def slow_persist(fd, offset, data):
            if data and (when == "always" or
                         (when == "leader") == self.replica.is_leader()):
                time.sleep(delay)
            return real_persist(fd, offset, data)
        journal._persist = slow_persist

    def emit(this, **ev):  # noqa: N805 -- status() has a key named 'self'
        line = json.dumps(ev)
        with this.out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def last_index(self):
        items = self.replica._sm.items
        return items[-1][0] if items else 0

    def on_completions(self, completions):
        with self.applied:
            self.applied.notify_all()
        for c in completions:
            with self.lock:
                waiter = self.waiting.pop(c.tag, None)
                mine = c.tag in self.mine
                self.mine.discard(c.tag)
            if waiter is not None:
                waiter(c.index)
            if mine:
                self.emit(ev="done", tag=c.tag, index=c.index)

    def stream(self, prefix, count, window):
        """Keep `window` proposals in flight until `count` were made (or the process dies)."""
        sem = threading.Semaphore(window)
        for i in range(count):
            sem.acquire(timeout=2)  # a lost proposal must not stall the stream for good
            tag = f"{prefix}{i}"
            with self.lock:
                self.waiting[tag] = lambda _idx: sem.release()
            self.propose(tag)

    def on_role(self, is_leader, leader):
        self.emit(ev="role", is_leader=is_leader, leader=leader)

    def propose(self, tag):
        from gesmas.server.replication import ReplicationError
        with self.lock:
            self.mine.add(tag)
        try:
            self.replica.propose(tag.encode(), on_failure=lambda f, t=tag: self.emit(
                ev="failed", tag=t, reason=f.reason, maybe=f.maybe_applied))
        except ReplicationError as exc:
            with self.lock:
                self.mine.discard(tag)
            self.emit(ev="failed", tag=tag, reason=type(exc).__name__, maybe=False)

    def bench(self, n_latency, n_throughput, window):
        lat = []
        for i in range(n_latency):
            done = threading.Event()
            tag = f"lat-{os.getpid()}-{i}"
            with self.lock:
                self.waiting[tag] = lambda idx, d=done: d.set()
            t0 = time.perf_counter()
            self.replica.propose(tag.encode())
            if not done.wait(10):
                return {"error": f"latency command {i} timed out"}
            lat.append(time.perf_counter() - t0)
        lat.sort()
        sem = threading.Semaphore(window)
        all_done = threading.Event()
        remaining = [n_throughput]

        def finished(_idx):
            sem.release()
            with self.lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()
        t0 = time.perf_counter()
        for i in range(n_throughput):
            if not sem.acquire(timeout=10):
                return {"error": "throughput stalled"}
            tag = f"tp-{os.getpid()}-{i}-" + "x" * 80
            with self.lock:
                self.waiting[tag] = finished
            self.replica.propose(tag.encode())
        if not all_done.wait(30):
            return {"error": "throughput did not finish"}
        dt = time.perf_counter() - t0
        st = self.replica.status()
        return {"p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[int(len(lat) * 0.99)],
                "mean_ms": 1e3 * sum(lat) / len(lat), "ops_per_s": n_throughput / dt,
                "journal_syncs": st["journal_syncs"],
                "journal_synced_records": st["journal_synced_records"]}

    def handle(self, req):
        op, rid = req["op"], req.get("rid")
        if op == "propose":
            for tag in req["tags"]:
                self.propose(tag)
            self.emit(ev="ok", rid=rid)
        elif op == "status":
            self.emit(ev="status", rid=rid, **self.replica.status())
        elif op == "dump":
            sm = self.replica._sm
            self.emit(ev="dump", rid=rid, items=[[i, d.decode()] for i, d in list(sm.items)],
                      violations=sm.order_violations)
        elif op in ("add_node", "remove_node"):
            done, result = threading.Event(), {}

            def on_done(ok, reason):
                result.update(ok=ok, reason=reason)
                done.set()
            getattr(self.replica, op)(req["addr"], on_done)
            done.wait(req.get("timeout", 10))
            self.emit(ev="membership", rid=rid, ok=result.get("ok"), reason=result.get("reason"))
        elif op == "stream":
            threading.Thread(target=self.stream, daemon=True,
                             args=(req["prefix"], req["count"], req["window"])).start()
            self.emit(ev="ok", rid=rid)
        elif op == "wait_applied":  # until the state machine holds index >= req["index"]
            deadline = time.monotonic() + req["timeout"]
            with self.applied:
                while self.last_index() < req["index"] and time.monotonic() < deadline:
                    self.applied.wait(0.1)  # re-check: a snapshot load does not notify
            self.emit(ev="applied", rid=rid, index=self.last_index())
        elif op == "compact":  # snapshot + compact now; reply once the log was cut
            journal = self.replica._journal
            before = journal.first_index
            self.replica.force_compaction()
            deadline = time.monotonic() + req.get("timeout", 10)
            with self.applied:
                while journal.first_index == before and time.monotonic() < deadline:
                    self.applied.wait(0.05)  # compaction happens on the tick thread
            self.emit(ev="compacted", rid=rid, first_index=journal.first_index)
        elif op == "bench":
            self.emit(ev="bench", rid=rid, **self.bench(req["n_latency"], req["n_throughput"],
                                                        req["window"]))
        elif op == "quit":
            self.replica.destroy()
            self.emit(ev="bye", rid=rid)
            return False
        return True

    def run(self):
        self.emit(ev="started", pid=os.getpid())
        threading.Thread(target=self._watch_ready, daemon=True).start()
        for line in sys.stdin:
            if line.strip() and not self.handle(json.loads(line)):
                break
        else:
            self.replica.destroy()

    def _watch_ready(self):
        if self.replica.wait_ready(60):
            self.emit(ev="ready")


# ------------------------------------------------------------------------ test/bench client
from gesmas.server.cluster import free_ports  # noqa: E402,F401  (re-exported for tests)


class NodeProc:
    """A node subprocess and what it said."""

    def __init__(self, addr, peers, data_dir, log_path, extra=(), cond=None, new_cluster=False):
        self.addr, self.peers, self.data_dir, self.log_path = addr, peers, data_dir, log_path
        self.extra = list(extra)
        self.new_cluster = new_cluster    # the first start passes --new-cluster
        self.cond = cond or threading.Condition()
        self.proc = None
        self.start()

    def start(self):
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, os.path.join(HERE, "replication_node.py"), "node",
               "--self", self.addr, "--peers", ",".join(self.peers), "--data", self.data_dir,
               *self.extra, *(["--new-cluster"] if self.new_cluster else [])]
        self.new_cluster = False
        self.done, self.failed, self.replies, self.roles = {}, {}, {}, []
        self.ready = False
        self.rid = 0
        self.stderr = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env)
        self.reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self.reader.start()

    def _read(self, proc):
        for line in proc.stdout:
            ev = json.loads(line)
            with self.cond:
                kind = ev["ev"]
                if kind == "done":
                    self.done[ev["tag"]] = ev["index"]
                elif kind == "failed":
                    self.failed[ev["tag"]] = ev
                elif kind == "ready":
                    self.ready = True
                elif kind == "role":
                    self.roles.append(ev)
                elif "rid" in ev:
                    self.replies[ev["rid"]] = ev
                self.cond.notify_all()

    def wait_for(self, predicate, timeout, what=""):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"{self.addr}: timed out waiting for {what}")
                self.cond.wait(min(left, 0.5))

    def request(self, op, wait=20, **kw):
        with self.cond:
            self.rid += 1
            rid = self.rid
        self.proc.stdin.write((json.dumps({"op": op, "rid": rid, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        self.wait_for(lambda: rid in self.replies, wait, op)
        with self.cond:
            return self.replies.pop(rid)

    def sigkill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    def kill(self):
        self.sigkill()
        if self.proc is not None:
            self.proc.wait(10)
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        self.stderr.close()
        self.reader.join(5)


class Cluster:
    def __init__(self, root, n=3, extra=()):
        self.root = root
        self.cond = threading.Condition()  # shared: wait on conditions spanning nodes
        ports = free_ports(n)
        self.addrs = [f"127.0.0.1:{p}" for p in ports]
        self.nodes = []
        try:
            for i, addr in enumerate(self.addrs):
                self.nodes.append(NodeProc(addr, [a for a in self.addrs if a != addr],
                                           os.path.join(root, f"n{i}"),
                                           os.path.join(root, f"n{i}.log"), extra,
                                           self.cond, new_cluster=True))
        except BaseException:
            self.kill()
            raise

    def kill(self):
        for node in self.nodes:
            node.kill()

    def wait_ready(self, timeout=30):
        for node in self.nodes:
            node.wait_for(lambda n=node: n.ready, timeout, "ready")

    def leader(self, timeout=20):
        """The node every live node reports as a ready leader (from their role events)."""
        live = [n for n in self.nodes if n.proc.poll() is None]

        def agreed():
            for node in live:
                if node.roles and node.roles[-1]["is_leader"] and \
                        all(o.roles and o.roles[-1]["leader"] == node.addr for o in live):
                    return node
            return None
        live[0].wait_for(lambda: agreed() is not None, timeout, "an agreed leader")
        with self.cond:
            return agreed()


def bench_main(args):
    root = tempfile.mkdtemp(prefix="gesmas-bench-")
    extra = ["--pysyncobj-defaults"] if args.pysyncobj_defaults else []
    if args.no_fsync:
        extra.append("--no-fsync")
    cluster = Cluster(root, extra=extra)
    try:
        cluster.wait_ready()
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        settings = "pysyncobj defaults" if args.pysyncobj_defaults else "gesmas RaftTuning()"
        print(f"settings: {settings}, fsync={'off' if args.no_fsync else 'on'}, "
              f"3 nodes on 127.0.0.1")
        for name, node in (("leader", leader), ("follower", follower)):
            r = node.request("bench", wait=120, n_latency=args.n_latency,
                             n_throughput=args.n_throughput, window=args.window)
            if "error" in r:
                print(f"propose on {name}: ERROR {r['error']}")
                continue
            print(f"propose on {name:8s}: latency p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f}"
                  f" ms, mean {r['mean_ms']:.2f} ms; throughput {r['ops_per_s']:.0f} cmd/s "
                  f"(window {args.window}); this node: {r['journal_synced_records']} records in "
                  f"{r['journal_syncs']} fsyncs")
    finally:
        cluster.kill()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["node", "bench"])
    ap.add_argument("--self")
    ap.add_argument("--peers", default="")
    ap.add_argument("--data")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--new-cluster", action="store_true")
    ap.add_argument("--pysyncobj-defaults", action="store_true")
    ap.add_argument("--compaction-min-entries", type=int, default=0)
    ap.add_argument("--slow-sync-ms", type=float, default=0)
    ap.add_argument("--slow-sync-when", choices=["follower", "leader", "always"],
                    default="follower")
    ap.add_argument("--password", default=TEST_SECRET)  # a Replica always needs one
    ap.add_argument("--n-latency", type=int, default=300)
    ap.add_argument("--n-throughput", type=int, default=5000)
    ap.add_argument("--window", type=int, default=200)
    args = ap.parse_args()
    if args.mode == "bench":
        bench_main(args)
    else:
        import logging
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        NodeMain(args).run()


if __name__ == "__main__":
    main()
