"""Snapshot files written beside Raft (replication/snapshots.py, override 13): the tick thread
only gathers what a snapshot holds; a thread of its own writes it, and pysyncobj is told
SERIALIZING until the file is in place; a snapshot received from the leader meanwhile wins."""
from __future__ import annotations

import os
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


def test_sending_is_paused_while_a_snapshot_is_written_or_there_is_none(tmp_path):
    """What override 24 asks before pysyncobj's sending loop: no chunk while a job runs
    (until its end is read), nor before any snapshot exists."""
    writer = Writer()
    path, s = make(tmp_path, writer)
    assert s.sending_paused()                              # no file yet
    (tmp_path / "snapshot.bin").write_bytes(pickle.dumps("the previous one"))
    assert not s.sending_paused()
    s.serialize((None, "prev", "last", "cluster"), 42)
    assert writer.entered.wait(WAIT)
    assert s.sending_paused() and s.getTransmissionData("follower") is None
    writer.release.set()
    assert s.wait(WAIT)
    assert s.sending_paused()                              # written, its end not yet read
    assert s.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 42)
    assert not s.sending_paused() and s.getTransmissionData("follower") is not None


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
    # what it wrote is kept to be written over by the next one
    assert pickle.load(open(tmp_path / "snapshot.bin.spare", "rb")) == {"raft": (1, 2, 3)}


def write_over(path: str, payload: object) -> None:
    """The replicas' writer (Replica._write_snapshot), without fsync."""
    from gesmas.server.replication.snapshots import written_over
    with written_over(path, sync=False) as f:
        pickle.dump(payload, f, protocol=5)


def test_written_over_keeps_the_blocks_until_it_ends_and_cuts_the_tail(tmp_path, monkeypatch):
    """written_over opens the file without emptying it (its blocks are written over, not
    freed) and cuts it to what was written at the end, synced every SYNC_EVERY bytes."""
    from gesmas.server.replication import snapshots
    monkeypatch.setattr(snapshots, "SYNC_EVERY", 1000)
    synced: list[int] = []
    monkeypatch.setattr(snapshots.os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_size))
    path = tmp_path / "snap"
    path.write_bytes(b"o" * 10_000)
    with snapshots.written_over(str(path), sync=True) as f:
        assert path.stat().st_size == 10_000          # not emptied first
        f.write(b"n" * 2_500)
    assert path.read_bytes() == b"n" * 2_500
    assert synced == [10_000, 10_000, 2_500]          # at 1,000 and 2,000 bytes, then cut
    with snapshots.written_over(str(tmp_path / "new"), sync=False) as f:
        f.write(b"first")                             # a file that was not there
    assert (tmp_path / "new").read_bytes() == b"first" and len(synced) == 3


def snapshot(s, index: int) -> None:
    s.serialize((None, index, "prev", "cluster"), index)
    assert s.wait(WAIT)
    assert s.checkSerializing() == (SERIALIZER_STATE.SUCCESS, index)


def test_each_snapshot_is_written_over_the_blocks_of_the_one_before_last(tmp_path):
    """A replaced snapshot is kept as the spare, and the next one is written over it in
    place and cut to its length (nothing freed, so nothing for the filesystem to trim), and
    the file in place is always exactly one whole snapshot."""
    sizes = {1: 300_000, 2: 200_000, 3: 1_000, 4: 50_000}
    path, s = make(tmp_path, write_over,
                   prepare=lambda raft_data: {"index": raft_data[0],
                                              "blob": bytes([raft_data[0]]) * sizes[raft_data[0]]})
    spare = tmp_path / "snapshot.bin.spare"

    def exactly(p, index):
        return p.read_bytes() == pickle.dumps({"index": index,
                                               "blob": bytes([index]) * sizes[index]}, protocol=5)
    snapshot(s, 1)
    assert exactly(tmp_path / "snapshot.bin", 1) and not spare.exists()
    snapshot(s, 2)                                   # the first is kept, not freed
    assert exactly(tmp_path / "snapshot.bin", 2) and exactly(spare, 1)
    for index in (3, 4):
        kept = spare.stat().st_ino
        snapshot(s, index)
        assert (tmp_path / "snapshot.bin").stat().st_ino == kept     # written over in place
        assert exactly(tmp_path / "snapshot.bin", index)             # no tail of the longer one
        assert exactly(spare, index - 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.bin", "snapshot.bin.spare"]
    assert path == str(tmp_path / "snapshot.bin")


def test_a_spare_that_is_a_second_name_of_the_snapshot_is_never_written_over(tmp_path):
    """A crash between keeping the replaced snapshot (a hard link) and the rename leaves
    the spare a second name of the snapshot in place: written over, that snapshot would be
    destroyed while it is the only one. The name is dropped and the new one written afresh."""
    (tmp_path / "snapshot.bin").write_bytes(pickle.dumps("in place"))
    os.link(tmp_path / "snapshot.bin", tmp_path / "snapshot.bin.spare")
    (tmp_path / "snapshot.bin.tmp").write_bytes(b"a write the crash cut short")
    held = open(tmp_path / "snapshot.bin", "rb")     # the inode of the one in place
    try:
        path, s = make(tmp_path, write_over)
        snapshot(s, 5)
        assert pickle.load(open(path, "rb")) == {"raft": (5, "prev", "cluster")}
        held.seek(0)
        assert pickle.load(held) == "in place"      # its blocks untouched
        assert os.fstat(held.fileno()).st_nlink == 1    # now only the spare
        assert os.path.samefile(tmp_path / "snapshot.bin.spare", f"/proc/self/fd/{held.fileno()}")
    finally:
        held.close()
    assert not (tmp_path / "snapshot.bin.tmp").exists()


def test_a_snapshot_is_synced_to_disk_a_megabyte_at_a_time(tmp_path, monkeypatch):
    """PacedFile: the file holds exactly what was written, whatever the sizes of the writes
    (pickle writes small frames, and each large bytes object whole), and its data is synced
    each time SYNC_EVERY more bytes have been written, so the fsync at the end has at most
    that much left (a whole snapshot written back at once held the journal's fsyncs for
    50-70 ms). Without fsync (--unsafe-no-fsync), nothing is synced."""
    from gesmas.server.replication import snapshots
    monkeypatch.setattr(snapshots, "SYNC_EVERY", 1000)
    synced: list[int] = []
    path = tmp_path / "snap"
    with open(path, "wb") as f:
        monkeypatch.setattr(snapshots.os, "fdatasync",
                            lambda fd: synced.append(f.tell()) if fd == f.fileno() else None)
        paced = snapshots.PacedFile(f, sync=True)
        payload = {"blob": bytes(range(256)) * 13, "commands": [(i, b"c" * i) for i in range(60)],
                   "more": bytearray(b"x" * 2500)}
        pickle.dump(payload, paced, protocol=5)
        assert paced.write(memoryview(b"tail")) == 4
        paced.flush_to_disk()
    data = path.read_bytes()
    assert pickle.loads(data) == payload and data.endswith(b"tail")
    assert synced[:-1] == list(range(1000, len(data), 1000))   # every 1000 bytes written
    assert synced[-1] == len(data)                             # and the rest at the end
    synced.clear()
    with open(path, "wb") as f:
        paced = snapshots.PacedFile(f, sync=False)
        paced.write(b"y" * 5000)
        paced.flush_to_disk()
    assert synced == [] and path.read_bytes() == b"y" * 5000


def test_a_received_snapshot_is_synced_chunk_by_chunk(tmp_path, monkeypatch):
    """The chunks of a snapshot from the leader are synced as they are written (the last
    one by the load, which fsyncs the whole file before reading it); the file is the
    concatenation of the chunks."""
    from gesmas.server.replication import snapshots
    synced: list[int] = []
    monkeypatch.setattr(snapshots.os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_size))
    path, s = make(tmp_path, Writer())
    chunks = [b"a" * 300, b"b" * 200, b"c" * 100]
    assert s.setTransmissionData((chunks[0], True, False)) is False
    assert s.setTransmissionData((chunks[1], False, False)) is False
    assert synced == [300, 500]
    assert s.setTransmissionData((chunks[2], False, True)) is True
    assert (tmp_path / "snapshot.bin").read_bytes() == b"".join(chunks)
    assert synced == [300, 500]
    unsynced = BackgroundSerializer(str(tmp_path / "other.bin"), 1 << 16, lambda d: d,
                                    Writer(), lambda p: None, sync=False)
    assert unsynced.setTransmissionData((b"z" * 10, True, False)) is False
    assert synced == [300, 500]


def test_a_chunk_that_cannot_be_synced_does_not_stop_the_transmission(tmp_path, monkeypatch,
                                                                       caplog):
    """A failed sync of a received chunk is logged and the chunks go on being written; the
    load's fsync of the whole file decides whether the snapshot is durable."""
    from gesmas.server.replication import snapshots

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(snapshots.os, "fdatasync", broken)
    path, s = make(tmp_path, Writer())
    assert s.setTransmissionData((b"a" * 10, True, False)) is False
    assert s.setTransmissionData((b"b" * 10, False, True)) is True
    assert (tmp_path / "snapshot.bin").read_bytes() == b"a" * 10 + b"b" * 10
    assert "syncing a received snapshot chunk failed" in caplog.text


def _sent(s, node):
    """Every chunk of one transfer of `node`'s, unread: [(chunk, is_first, is_last)]."""
    out = []
    while True:
        data = s.getTransmissionData(node)
        out.append(data)
        if data[2]:
            return out


def test_a_snapshot_is_sent_in_chunks_read_from_the_file_only_when_they_go(tmp_path):
    """A leader's transfer holds no snapshot bytes: each chunk is a place in the file, read
    by the transport when it frames it. The chunks are pysyncobj's (first flagged, the
    last empty and flagged), and two followers' transfers are their own."""
    path, s = make(tmp_path, write_over)
    blob = os.urandom(int(2.5 * (1 << 16)))
    (tmp_path / "snapshot.bin").write_bytes(blob)
    chunks = _sent(s, "f1")
    assert [(len(c), first, last) for c, first, last in chunks] == \
        [(1 << 16, True, False), (1 << 16, False, False), (1 << 15, False, False),
         (0, False, True)]
    assert not any(isinstance(c, (bytes, bytearray)) for c, _, _ in chunks)
    other = s.getTransmissionData("f2")
    assert other[1] is True and other[0].read() == blob[:1 << 16]
    assert b"".join(c.read() for c, _, _ in chunks) == blob
    assert s.getTransmissionData("f1")[1] is True            # ended: a new one starts over


def test_the_spare_is_not_written_over_while_chunks_of_it_wait_to_be_sent(tmp_path):
    """Chunks read later must read the snapshot they were taken from. The snapshot in place
    is only renamed away; it becomes the spare, which the snapshot after next writes over:
    while chunks of it may still be read, a new file is written instead. Once they are
    gone, the spare is written over again (nothing freed: module docstring)."""
    sizes = {1: 150_000, 2: 90_000, 3: 120_000, 4: 60_000}
    path, s = make(tmp_path, write_over,
                   prepare=lambda raft_data: {"index": raft_data[0],
                                              "blob": bytes([raft_data[0]]) * sizes[raft_data[0]]})
    snapshot(s, 1)
    first = (tmp_path / "snapshot.bin").read_bytes()
    chunks = _sent(s, "follower")                     # queued, not read yet
    snapshot(s, 2)                                    # the first is now the spare
    snapshot(s, 3)                                    # would be written over it
    assert b"".join(c.read() for c, _, _ in chunks) == first
    second = (tmp_path / "snapshot.bin.spare").stat().st_ino
    del chunks
    assert len(s._sources) == 0                       # the file is closed
    snapshot(s, 4)
    assert (tmp_path / "snapshot.bin").stat().st_ino == second   # written over, as before
    assert pickle.load(open(path, "rb")) == {"index": 4, "blob": b"\x04" * 60_000}
