"""The group-commit transport's backlog (replication/durable_transport.py, overrides 6, 17 and
23): how a flush frames a node's messages, how much it hands a connection, what waits, in
which order, and at what rate a snapshot goes out. On a bare transport with fake
connections; tests/test_raft_port.py and tests/test_rejoin.py run it in clusters."""
from __future__ import annotations

import os

from gesmas.server.replication import durable_transport, transport
from gesmas.server.replication.catchup import SnapshotPacer, SnapshotsSent


def test_frames_are_grouped_by_size():
    ae = [{"type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": i,
           "prevLogTerm": 1, "entries": [(b"x" * 400_000, i + 1, 1)]} for i in range(5)]
    ack = {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False}
    runs = list(transport._size_runs(ae + [ack], 2 ** 20))
    assert [len(r) for r in runs] == [2, 2, 2]
    assert [m for r in runs for m in r] == ae + [ack]  # order kept
    huge = dict(ae[0], entries=[(b"x" * 3_000_000, 1, 1)])
    assert list(transport._size_runs([huge, ack], 2 ** 20)) == [[huge], [ack]]
    chunk = {"type": "append_entries", "serialized": (b"s" * 900_000, True, False)}
    assert len(list(transport._size_runs([chunk, chunk], 2 ** 20))) == 2


def _unbatched(messages) -> list:
    return [x for m in messages
            for x in (m["messages"] if m.get("type") == transport.BATCH else [m])]


def _bare_transport(limit: int, connections: dict, rate: float = 0.0):
    """A _DurableTransport with only what _send_grouped reads: frames of `limit` bytes,
    `connections`, snapshot chunks paced at `rate` bytes/s (0: unpaced)."""
    t = object.__new__(durable_transport._DurableTransport)
    t._syncObj = type("S", (), {"encryptor": None, "conf": type(
        "C", (), {"appendEntriesBatchSizeBytes": limit})(), "_gesmas_sent": SnapshotsSent()})()
    t._connections = connections
    t._backlog = {}
    t.pacer = SnapshotPacer(rate)
    return t


class _Conn:
    """What _send_grouped reads of a TcpConnection: its socket and its unwritten bytes."""

    def __init__(self) -> None:
        self._TcpConnection__socket = object()
        self.unwritten = 0

    def getSendBufferSize(self) -> int:
        return self.unwritten


def test_a_flush_hands_a_connection_a_bounded_amount_and_keeps_the_rest_in_order(
        monkeypatch):
    """Override 17: a snapshot queued whole in one tick goes out SEND_AHEAD frames per flush
    beyond what the connection has not written, in order, each frame once; what waits is not
    sent to a node whose connection was replaced meanwhile (a cut transmission is started
    over by pysyncobj), and a node with room gets everything at once."""
    limit = 2 ** 20
    slow, fast = _Conn(), _Conn()
    t = _bare_transport(limit, {"slow": slow, "fast": fast})
    sent: list = []
    monkeypatch.setattr(durable_transport.TCPTransport, "send",
                        lambda self, node, m: sent.append((node, m)) or True)
    chunks = [{"type": "append_entries", "term": 1, "commit_index": 9,
               "serialized": (bytes([k]) * 900_000, k == 0, k == 9)} for k in range(10)]
    ack = {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False}
    assert t._send_grouped([("slow", c) for c in chunks] + [("fast", ack)]) == []
    assert [m for n, m in sent if n == "fast"] == [ack]
    first = _unbatched(m for n, m in sent if n == "slow")
    assert first == chunks[:3]                  # 2 MiB of room: three chunks of 0.9 MB
    assert t.backlog_bytes() > 6 * 900_000
    sent.clear()
    slow.unwritten = 3 * limit                  # nothing written since: no room
    t._send_grouped([])
    assert sent == []
    slow.unwritten = 0
    heartbeat = {"type": "append_entries", "term": 1, "commit_index": 9, "prevLogIdx": 9,
                 "prevLogTerm": 1, "entries": []}
    t._send_grouped([("slow", heartbeat)])      # newer messages wait behind the backlog
    while t._backlog:
        t._send_grouped([])
    assert _unbatched(m for _, m in sent) == chunks[3:] + [heartbeat]
    sent.clear()
    t._send_grouped([("slow", c) for c in chunks])
    assert _unbatched(m for _, m in sent) == chunks[:3]
    sent.clear()
    t._syncObj._gesmas_sent.went("slow", 9, 0.0)    # as if its last chunk was among them
    slow._TcpConnection__socket = object()      # reconnected: the rest is not sent
    t._send_grouped([("slow", ack)])
    assert _unbatched(m for _, m in sent) == [ack] and not t._backlog
    assert t._syncObj._gesmas_sent.sent == {}   # nor taken as arrived (override 19)


def test_a_snapshot_goes_out_at_the_paced_rate_and_nothing_else_waits_for_it(monkeypatch):
    """Override 23: a snapshot queued whole goes to its follower at the pacer's rate (its
    chunks wait in the backlog, in order, with what was queued behind them), however much
    room the connection has; another node's messages and a node without chunks go at once;
    a chunk that waited goes once credit is back."""
    limit, rate = 2 ** 20, 8 * 2 ** 20
    far, near = _Conn(), _Conn()
    t = _bare_transport(limit, {"far": far, "near": near}, rate=rate)
    clock = [100.0]
    monkeypatch.setattr(durable_transport._ps, "monotonicTime", lambda: clock[0])
    sent: list = []
    monkeypatch.setattr(durable_transport.TCPTransport, "send",
                        lambda self, node, m: sent.append((node, m)) or True)
    chunks = [{"type": "append_entries", "term": 1, "commit_index": 9,
               "serialized": (bytes([k]) * 1_000_000, k == 0, k == 19)} for k in range(20)]
    heartbeat = {"type": "append_entries", "term": 1, "commit_index": 9, "prevLogIdx": 9,
                 "prevLogTerm": 1, "entries": []}
    entries = [dict(heartbeat, entries=[(b"e" * 500_000, 10 + k, 1)]) for k in range(6)]
    t._send_grouped([("far", c) for c in chunks] + [("far", heartbeat)] +
                    [("near", e) for e in entries])
    assert _unbatched(m for n, m in sent if n == "near") == entries   # no chunks: unpaced
    first = _unbatched(m for n, m in sent if n == "far")
    assert first == chunks[:3]      # a burst of 2 MiB, the last run spent past it
    sent.clear()
    t._send_grouped([])             # no time passed: no credit, nothing goes
    assert sent == []
    got, flushes = list(first), 0
    while t._backlog:
        clock[0] += 0.05            # a tick: 0.4 MB of credit at 8 MiB/s
        t._send_grouped([])
        got += _unbatched(m for _, m in sent)
        sent.clear()
        flushes += 1
    assert got == chunks + [heartbeat]                 # in order, each once
    seconds = flushes * 0.05
    assert 17 * 1_000_000 / rate <= seconds <= 17 * 1_000_000 / rate + 0.2
    assert t.pacer.held > 0
    t.pacer = SnapshotPacer(0)      # unpaced (GESMAS_SNAPSHOT_RATE=0): room alone decides
    t._send_grouped([("far", c) for c in chunks])
    assert _unbatched(m for _, m in sent) == chunks[:3]


def test_a_backlog_drops_the_entries_the_leader_queues_again_after_an_ack(monkeypatch):
    """pysyncobj moves a follower's nextIndex back to each ack, so the entries still waiting
    in the node's backlog are queued again: the waiting append_entries are dropped (their
    entries are on the follower or in the newer messages), a snapshot chunk waiting among
    them is kept, and newer messages that go on from the end keep the backlog whole."""
    limit = 2 ** 16
    conn = _Conn()
    t = _bare_transport(limit, {"f": conn})
    sent: list = []
    monkeypatch.setattr(durable_transport.TCPTransport, "send",
                        lambda self, node, m: sent.append(m) or True)

    def ae(prev: int, n: int) -> dict:
        return {"type": "append_entries", "term": 1, "commit_index": prev, "prevLogIdx": prev,
                "prevLogTerm": 1, "entries": [(b"e" * 40_000, i, 1)
                                              for i in range(prev + 1, prev + n + 1)]}
    chunk = {"type": "append_entries", "term": 1, "commit_index": 0,
             "serialized": (b"s" * 1000, False, False)}
    conn.unwritten = 10 * limit                 # nothing goes out: everything waits
    t._send_grouped([("f", ae(0, 10)), ("f", chunk), ("f", ae(10, 10))])
    t._send_grouped([("f", ae(20, 5))])         # goes on from the end: all kept
    assert sum(len(m.get("entries") or ()) for m in t._backlog["f"][1]) == 25
    t._send_grouped([("f", ae(7, 18))])         # an ack of 7: queued again from 8
    waiting = t._backlog["f"][1]
    assert waiting[0] is chunk
    assert [e[1] for m in waiting[1:] for e in m["entries"]] == list(range(8, 26))
    conn.unwritten = 0
    while t._backlog:
        t._send_grouped([])
    out = _unbatched(sent)
    assert out[0] is chunk and [e[1] for m in out[1:] for e in m["entries"]] == \
        list(range(8, 26))


def test_a_snapshot_chunk_is_read_from_its_file_when_it_goes_out(monkeypatch, tmp_path):
    """A leader's snapshot chunks (snapshots.Chunk) are read as the flush sends them: what
    waits in the backlog holds no snapshot bytes, what goes holds the file's. A chunk the
    file cannot give (cut short under it) closes that node's connection and drops what
    waits for it (pysyncobj starts the transfer over); another node's messages still go."""
    from gesmas.server.replication.snapshots import Chunk, _Source
    limit = 2 ** 20
    slow, other = _Conn(), _Conn()
    closed: list = []
    slow.disconnect = lambda: closed.append("slow")
    t = _bare_transport(limit, {"slow": slow, "other": other})
    sent: list = []
    monkeypatch.setattr(durable_transport.TCPTransport, "send",
                        lambda self, node, m: sent.append((node, m)) or True)
    path = tmp_path / "snapshot.bin"
    blob = os.urandom(10 * 900_000)
    path.write_bytes(blob)
    source = _Source(str(path))
    chunks = [{"type": "append_entries", "term": 1, "commit_index": 9,
               "serialized": (Chunk(source, k * 900_000, 900_000), k == 0, False)}
              for k in range(10)]
    t._send_grouped([("slow", c) for c in chunks])
    went = _unbatched(m for _, m in sent)
    assert [m["serialized"][0] for m in went] == [blob[k * 900_000:(k + 1) * 900_000]
                                                  for k in range(3)]
    assert [m["serialized"][1] for m in went] == [True, False, False]
    waiting = t._backlog["slow"][1]
    assert all(isinstance(m["serialized"][0], Chunk) for m in waiting) and len(waiting) == 7
    assert t.backlog_bytes() >= 7 * 900_000      # counted at their size all the same
    sent.clear()
    os.truncate(path, 4 * 900_000)               # the fourth can be read, not the fifth
    ack = {"type": "next_node_idx", "next_node_idx": 3, "success": True, "reset": False}
    t._send_grouped([("other", ack)])
    assert [(n, m.get("serialized", [b""])[0]) for n, m in sent] == \
        [("slow", blob[3 * 900_000:4 * 900_000]), ("other", b"")]
    assert closed == ["slow"] and "slow" not in t._backlog    # and nothing after the fourth
