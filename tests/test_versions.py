"""Rolling upgrades need formats a replica can tell apart: a log entry, journal or snapshot
written by a newer gesmas is refused with a clear message (the replica stops, exit 3),
never skipped or misread."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from gesmas.server.cluster import free_ports
from gesmas.server.config import HASH_SEED
from gesmas.server.kernel import OpenSession, codec
from gesmas.server.node import Node
from gesmas.server.config import NodeConfig
from gesmas.server.replication.journal import LOG_NAME, DurableJournal, JournalError


def test_a_newer_command_format_stops_the_state_machine_instead_of_being_skipped():
    data = bytearray(codec.encode(OpenSession(ttl=5.0)))
    data[0] = codec.FORMAT_VERSION + 1
    with pytest.raises(codec.UnknownFormat, match=f"format version {codec.FORMAT_VERSION + 1}"):
        codec.decode(bytes(data))
    sm = Node(NodeConfig(1, "127.0.0.1:1", "127.0.0.1:2", (), "/tmp/x", "s")) \
        .make_state_machine()
    with pytest.raises(codec.UnknownFormat):
        sm.apply(1, bytes(data))
    assert sm.apply(2, b"\x02garbage") == []          # malformed (not newer): skipped


def test_a_newer_journal_format_is_named(tmp_path):
    (tmp_path / LOG_NAME).write_bytes(b"GESMASJ2" + b"\0" * 64)
    with pytest.raises(JournalError, match="journal format b'2' is not the one"):
        DurableJournal(str(tmp_path))
    (tmp_path / LOG_NAME).write_bytes(b"something else entirely")
    with pytest.raises(JournalError, match="not a gesmas journal"):
        DurableJournal(str(tmp_path))


def test_a_replica_refuses_a_snapshot_of_a_newer_format_and_exits_3(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    with open(data / "snapshot.bin", "wb") as f:
        pickle.dump({"format": 99}, f)
    client, raft = free_ports(2)
    out = subprocess.run(
        [sys.executable, "-m", "gesmas.client.cli", "server", "--id", "1", "--client-addr",
         f"127.0.0.1:{client}", "--raft-addr", f"127.0.0.1:{raft}", "--data-dir", str(data),
         "--secret", "s"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONHASHSEED=HASH_SEED), stdin=subprocess.DEVNULL)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "snapshot format 99 is not the one this gesmas reads" in out.stderr


def test_a_checkpoint_of_format_2_with_waiting_calls_still_restores():
    """Format 2 (gesmas <= cd0176a) pickled each waiting call as a PendingCall; format 3
    writes tuples holding the command's log bytes. A replica must still restore the old."""
    import io

    from gesmas.server.kernel.records import PendingCall
    from test_objects import OH

    h = OH()
    h.make("Queue", "q")
    a, b = h.sessions(2)
    waits = [h.call(a, "q", "consume"), h.call(b, "q", "consume", timeout=5)]
    h.checkpoint(defer=False)               # format 4, which this test rewrites as format 2
    buf = io.BytesIO(h.kernel.checkpoint_blob)
    registry = pickle.load(buf)
    state, pending, count = pickle.load(buf)
    assert state["format"] == 4 and all(type(p[1]) is bytes for p in pending)
    frames = [pickle.load(buf) for _ in range(count)]       # format 4: one frame per object
    objects = [(name, cname, version, data) for name, cname, version, data, _, _ in frames]
    state["owners"] = {f[0]: f[4] for f in frames if f[4]}
    state["sizes"] = {f[0]: f[5] for f in frames if f[5]}
    state["format"] = 2
    old = io.BytesIO()
    pickle.dump(registry, old, protocol=5)
    pickle.dump((state, [PendingCall(p.index, p.cmd, p.tags, p.deadline, p.deadlines)
                         for p in map(PendingCall.load, pending)], objects), old, protocol=5)
    h.kernel.checkpoint_blob = old.getvalue()
    r = h.restored()
    assert r.kernel.state_digest() == h.kernel.state_digest()
    for k in (h, r):
        k.ok(a, "q", "produce", 1)
        k.ok(a, "q", "produce", 2)
        assert [k.value(t) for t in waits] == [1, 2]
