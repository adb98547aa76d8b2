"""Snapshot files written beside Raft (replication/snapshots.py, override 13): the tick thread
only gathers what a snapshot holds; a thread of its own writes it, and pysyncobj is told
SERIALIZING until the file is in place; a snapshot received from the leader meanwhile wins."""
from __future__ import annotations

import pickle
import threading

from pysyncobj.config import SERIALIZER_STATE

from gesmas.server.replication.snapshots import BackgroundSerializer

WAIT = 10.0


class Writer:
    """A `write` that blocks until released, recording the thread it ran on."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        self.fail = fail

    def __call__(self, path: str, payload: object) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.release.wait(WAIT)
        with open(path, "wb") as f:
            if self.fail:
                f.write(b"half")
                raise OSError("disk full")
            pickle.dump(payload, f)


def make(tmp_path, writer, prepare=lambda raft_data: {"raft": raft_data}):
    path = str(tmp_path / "snapshot.bin")
    return path, BackgroundSerializer(path, 1 << 16, prepare, writer,
                                      lambda p: pickle.load(open(p, "rb")))


def test_the_file_is_written_on_another_thread_and_reported_when_in_place(tmp_path):
    writer = Writer()
    path, s = make(tmp_path, writer)
    (tmp_path / "snapshot.bin").write_bytes(pickle.dumps("the previous one"))
    s.serialize((None, "prev", "last", "cluster"), 42)
    assert writer.entered.wait(WAIT)
    assert writer.threads == ["gesmas-snapshot-42"]
    assert s.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 42)
    assert s.getTransmissionData("follower") is None      # nothing sent from a moving file
    assert pickle.loads((tmp_path / "snapshot.bin").read_bytes()) == "the previous one"
    s.serialize((None, "other",), 43)                      # one at a time: ignored
    writer.release.set()
    assert s.wait(WAIT)
    assert s.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 42)
    assert s.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING
    assert pickle.load(open(path, "rb")) == {"raft": ("prev", "last", "cluster")}
    assert s.written == 1 and writer.threads == ["gesmas-snapshot-42"]
    data = s.getTransmissionData("follower")              # sent from the new file
    assert data is not None and data[1] is True


def test_a_failed_write_leaves_the_previous_file_and_compacts_nothing(tmp_path):
    writer = Writer(fail=True)
    path, s = make(tmp_path, writer)
    (tmp_path / "snapshot.bin").write_bytes(pickle.dumps("the previous one"))
    s.serialize((None, 1, 2, 3), 7)
    writer.release.set()
    assert s.wait(WAIT)
    assert s.checkSerializing() == (SERIALIZER_STATE.FAILED, 7)
    assert pickle.loads((tmp_path / "snapshot.bin").read_bytes()) == "the previous one"
    assert s.written == 0


def test_a_snapshot_that_cannot_be_gathered_fails_at_once(tmp_path):
    def prepare(raft_data):
        raise RuntimeError("the state machine failed")
    writer = Writer()
    _, s = make(tmp_path, writer, prepare)
    s.serialize((None, 1, 2, 3), 9)
    assert s.checkSerializing() == (SERIALIZER_STATE.FAILED, 9)
    assert writer.threads == []


def test_a_snapshot_received_meanwhile_is_never_replaced_by_the_older_one(tmp_path):
    writer = Writer()
    path, s = make(tmp_path, writer)
    s.serialize((None, 1, 2, 3), 10)
    assert writer.entered.wait(WAIT)
    received = pickle.dumps("from the leader, at index 500")
    assert s.setTransmissionData((received, True, False)) is False
    assert s.setTransmissionData((b"", False, True)) is True      # installed now
    writer.release.set()
    assert s.wait(WAIT)
    assert pickle.load(open(path, "rb")) == "from the leader, at index 500"
    # the cancelled job compacted nothing: pysyncobj must not drop entries up to 10
    assert s.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING
    assert not (tmp_path / "snapshot.bin.tmp").exists()
