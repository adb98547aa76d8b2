"""Prometheus metrics of one replica, on its own HTTP port (`--metrics-addr`; off unless
set), which also serves the status page (statuspage.py). Names follow Prometheus conventions (`gesmas_..._seconds`, `_total`).

Most values are read when scraped (the Raft state, the kernel's counts), so serving a call
costs only what the gateway records about it: one histogram observation, and one counter
increment when it fails.

    gesmas_raft_is_leader, gesmas_raft_term, gesmas_raft_commit_index,
    gesmas_raft_applied_index, gesmas_raft_peers_connected, gesmas_raft_send_backlog_bytes,
    gesmas_raft_snapshot_chunks_paced_total
    gesmas_sessions, gesmas_objects, gesmas_waiters, gesmas_classes, gesmas_pending_calls
    gesmas_waiting_readers, gesmas_reader_wakes_total   (reads that wait on this replica: a
        Map's watches, observe, ...; and how many times one was woken to run again; watch
        streams of one call at one state wait as one)
    gesmas_followed_calls   (followed reader calls in flight: watch streams, Call.follow)
    gesmas_followed_answers_merged_total   (their answers sent in another call's message:
        Follow.merge, the watches of one key on one stream)
    gesmas_reader_memo_hits_total   (reader calls answered by an identical one's run at the
        same state: node_reads.ReadMemo)
    gesmas_checkpoint_index, gesmas_checkpoint_bytes, gesmas_rejoining
    gesmas_journal_bytes, gesmas_snapshot_bytes, gesmas_data_dir_bytes   (what the disk holds)
    gesmas_runaway_aborts_total, gesmas_held_entries   (README "A call that runs away")
    gesmas_rpc_duration_seconds{method}   (histogram: every RPC served by this replica)
    gesmas_rpc_errors_total{method,code}
    gesmas_gc_pause_seconds{generation}   (histogram: the garbage collector's pauses)
"""
from __future__ import annotations

import gc
import os
import time
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, float("inf"))


class NodeCollector:
    """Gauges read from the node at scrape time (on the HTTP server's thread)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        node = self.node
        st: dict[str, Any] = {}
        try:
            if node.replica is not None:
                st = node.replica.status()
        except Exception:
            st = {}

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            return g

        yield gauge("gesmas_raft_is_leader", "1 if this replica is the Raft leader",
                    1.0 if st.get("state") == "leader" else 0.0)
        yield gauge("gesmas_raft_term", "current Raft term", float(st.get("term") or 0))
        yield gauge("gesmas_raft_commit_index", "highest log index known committed",
                    float(st.get("commit_index") or 0))
        yield gauge("gesmas_raft_applied_index", "highest log index applied here",
                    float(st.get("last_applied") or 0))
        peers = st.get("peers", {})
        yield gauge("gesmas_raft_peers_connected", "other members this replica reaches",
                    float(sum(1 for p in peers.values() if p.get("connected"))))
        yield gauge("gesmas_raft_send_backlog_bytes", "bytes of Raft messages waiting for "
                    "their peer's connection to drain (a snapshot or log on its way to a "
                    "follower catching up)", float(st.get("send_backlog_bytes") or 0))
        paced = CounterMetricFamily("gesmas_raft_snapshot_chunks_paced", "times a snapshot "
                                    "chunk for a follower waited for the rate this leader "
                                    "sends snapshots at (GESMAS_SNAPSHOT_RATE)")
        paced.add_metric([], float(st.get("snapshot_chunks_paced") or 0))
        yield paced
        reads = getattr(node, "reads", None)        # a node still being made has none
        if reads is not None:
            yield gauge("gesmas_waiting_readers", "reads waiting on this replica for a change "
                        "(watch streams sharing one run count once)",
                        float(reads.changes.waiting()))
            yield gauge("gesmas_followed_calls", "followed reader calls (watch streams) in "
                        "flight on this replica", float(reads.followed))
            wakes = CounterMetricFamily("gesmas_reader_wakes",
                                        "waiting reads woken to run again")
            wakes.add_metric([], float(reads.changes.wakes))
            yield wakes
            merged = CounterMetricFamily("gesmas_followed_answers_merged",
                                         "answers of followed calls sent in another call's "
                                         "message (Follow.merge)")
            merged.add_metric([], float(reads.merged))
            yield merged
            hits = CounterMetricFamily("gesmas_reader_memo_hits",
                                       "reader calls answered by an identical call's run")
            hits.add_metric([], float(reads.memo.hits))
            yield hits
        k = node.kernel
        if k is not None:
            yield gauge("gesmas_sessions", "open sessions", float(len(k.sessions)))
            yield gauge("gesmas_objects", "live objects", float(len(k.objects)))
            yield gauge("gesmas_waiters", "calls blocked in the kernel", float(k._waiting))
            yield gauge("gesmas_classes", "registered class names",
                        float(len(k.registry.versions)))
            yield gauge("gesmas_checkpoint_index", "kernel index of the last checkpoint",
                        float(k.checkpoint_index or 0))
            yield gauge("gesmas_checkpoint_bytes", "size of the last checkpoint",
                        float(k.checkpoint_size or 0))
        yield gauge("gesmas_pending_calls", "calls this replica accepted and waits on",
                    float(len(node.calls)))
        yield gauge("gesmas_rejoining", "1 while this replica, started empty without "
                    "--new-cluster, has not caught up and gives no votes",
                    float(bool(st.get("rejoining"))))
        aborts = CounterMetricFamily("gesmas_runaway_aborts", "log entries this replica "
                                     "took as aborted by the cluster (they ran away)")
        aborts.add_metric([], float(st.get("runaway_aborts") or 0))
        yield aborts
        yield gauge("gesmas_held_entries", "committed entries held back behind one that ran "
                    "away, until the cluster aborts it", float(st.get("held_entries") or 0))
        journal = getattr(node.replica, "_journal", None)
        if journal is not None:
            yield gauge("gesmas_journal_bytes", "bytes of the Raft journal: its log file "
                        "(records buffered for the next fsync included) and its meta file",
                        float(journal.files_size()))
        data_dir = getattr(node.replica, "data_dir", None)
        if data_dir:
            snapshot, total = data_dir_bytes(data_dir)
            yield gauge("gesmas_snapshot_bytes", "bytes of the Raft snapshot file (the last "
                        "checkpoint and the entries after it) in the data directory",
                        float(snapshot))
            yield gauge("gesmas_data_dir_bytes", "bytes of every file in the data directory: "
                        "journal, snapshot, the one before it (written over by the next: "
                        "replication/snapshots.py), snapshots being written or received, markers",
                        float(total))


def data_dir_bytes(path: str) -> tuple[int, int]:
    """(bytes of the snapshot file, bytes of every file under `path`), by a walk of the
    directory: files that come and go meanwhile (a snapshot written, a compaction) are
    counted if they are seen, never an error."""
    from .replication.replica import SNAPSHOT_NAME
    snapshot = total = 0
    top = os.path.join(path, SNAPSHOT_NAME)
    todo = [path]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    size = e.stat(follow_symlinks=False).st_size
                    total += size
                    if e.path == top:
                        snapshot = size
            except OSError:
                continue
    return snapshot, total


class Metrics:
    """The registry of one replica, and what the gateway records per RPC."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(node))
        self.rpc_duration = Histogram("gesmas_rpc_duration_seconds",
                                      "time to serve an RPC on this replica", ["method"],
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rpc_errors = Counter("gesmas_rpc_errors_total", "RPCs that failed, by code",
                                  ["method", "code"], registry=self.registry)
        self.invocations = Histogram("gesmas_invocation_duration_seconds",
                                     "Invoke calls served here, by class and method",
                                     ["class_name", "method"], buckets=LATENCY_BUCKETS,
                                     registry=self.registry)
        self._labels: set[tuple[str, str]] = set()
        self.proposal = Histogram("gesmas_proposal_apply_seconds",
                                  "from proposing a call's command to applying it here",
                                  buckets=LATENCY_BUCKETS, registry=self.registry)
        self.fsync = Histogram("gesmas_journal_fsync_seconds",
                               "one write + fsync of the Raft journal",
                               buckets=LATENCY_BUCKETS, registry=self.registry)
        self.checkpoint = Histogram("gesmas_checkpoint_seconds",
                                    "applying a Checkpoint command (interrupt, pickle, re-run)",
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.leader_changes = Counter("gesmas_raft_role_changes_total",
                                      "times this replica's view of the leader changed",
                                      registry=self.registry)
        self.sessions_expired = Counter("gesmas_sessions_expired_total",
                                        "sessions ended by their TTL", registry=self.registry)
        # A full collection walks every live object (10^4 waiters hold ~10^6): every thread
        # of the replica stops meanwhile, so its pauses are worth seeing.
        self.gc_pause = Histogram("gesmas_gc_pause_seconds",
                                  "pauses of Python's garbage collector, by generation",
                                  ["generation"], buckets=LATENCY_BUCKETS,
                                  registry=self.registry)
        self._gc_by_generation = [self.gc_pause.labels(str(g)) for g in range(3)]
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_by_generation[info["generation"]].observe(
                time.perf_counter() - self._gc_started)

    def close(self) -> None:
        """Stop observing the collector (the registry stays readable)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    MAX_LABELS = 1000          # (class, method) pairs; beyond: ("other", "other")

    def invoked(self, class_name: str, method: str, seconds: float) -> None:
        key = (class_name, method)
        if key not in self._labels:
            if len(self._labels) >= self.MAX_LABELS:
                key = ("other", "other")
            else:
                self._labels.add(key)
        self.invocations.labels(*key).observe(seconds)

    def serve(self, addr: str, idle_timeout: float = 10.0) -> Any:
        """Serve /metrics, /status (the status page) and /status.json on `addr` from a
        daemon thread; returns the server (``shutdown()`` stops it). A connection that sends
        nothing for `idle_timeout` seconds is dropped."""
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from . import statuspage
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_timeout

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
                elif path in ("/", "/status", "/status/"):
                    self._send(200, "text/html; charset=utf-8",
                               statuspage.PAGE.encode("utf-8"))
                elif path in ("/status.json", "/status/status.json"):
                    body = json.dumps(statuspage.snapshot(metrics.node)).encode("utf-8")
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain", b"not found: /metrics, /status\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass                                  # no access log on stderr

        host, _, port = addr.rpartition(":")
        server = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="gesmas-metrics",
                         daemon=True).start()
        return server

    def observe(self, method: str, started: float, code: str | None) -> None:
        self.rpc_duration.labels(method).observe(time.perf_counter() - started)
        if code is not None:
            self.rpc_errors.labels(method, code).inc()
