"""The Raft (replica-to-replica) port against a stranger (tcpconn.py, override 7).

An in-process cluster of 3 replicas with a cluster secret on 127.0.0.1; raw sockets send what
an attacker would: a pickle that would run code, absurd or negative length prefixes, a big
unauthenticated frame. Each connection must be closed at once, nothing unpickled, and the
cluster must still commit afterwards (on every replica: a frozen one would not apply).
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
import zlib

import pytest
from pysyncobj.encryptor import SALT

from gesmas.server.replication import RaftTuning, Replica, tcpconn
from gesmas.server.replication.prevote import PRE_VOTE
from gesmas.server.replication.raftwire import AeadEncryptor, Framing, derive_master
from gesmas.server.replication.types import NotLeader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replication_node import TEST_SECRET, free_ports  # noqa: E402

CLOSE_TIMEOUT = 10.0     # failure timeouts only: a refused connection closes in milliseconds
COMMIT_TIMEOUT = 30.0
BIG = 4 * 2 ** 20        # batch_size_bytes here, so commands up to 4 MiB - 4 KiB are allowed


class DigestSM:
    """Keeps (index, sha256) of every command; a completion is the same pair."""

    def __init__(self, blob=None):
        self.items = list(pickle.loads(blob)) if blob else []
        self.checkpoint_index = None
        self.checkpoint_blob = None

    def apply(self, index, data):
        item = (index, hashlib.sha256(data).hexdigest())
        self.items.append(item)
        return [item]


class InProcessCluster:
    def __init__(self, root, n=3, tuning=RaftTuning(batch_size_bytes=BIG)):
        self.root, self.tuning = root, tuning
        self.addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
        self.cond = threading.Condition()
        self.applied = [set() for _ in range(n)]  # digests each replica applied
        self.failure = None                       # a ProposeFailure, if any
        self.replicas = []
        try:
            for i in range(n):
                self.replicas.append(self._start(i))
        except BaseException:
            self.destroy()
            raise

    def _start(self, i):
        return Replica(self.addrs[i], self.addrs, os.path.join(self.root, f"n{i}"),
                       fresh=DigestSM, restore=DigestSM, on_completions=self._collector(i),
                       on_role_change=self._role_changed, password=TEST_SECRET, fsync=False,
                       tuning=self.tuning)

    def restart(self, i):
        self.replicas[i].destroy()
        self.replicas[i] = self._start(i)

    def _collector(self, i):
        def on_completions(completions):
            with self.cond:
                self.applied[i].update(digest for _, digest in completions)
                self.cond.notify_all()
        return on_completions

    def _role_changed(self, is_leader, leader):
        with self.cond:
            self.cond.notify_all()

    def leader(self):
        with self.cond:
            assert self.cond.wait_for(
                lambda: any(r.is_leader() for r in self.replicas), COMMIT_TIMEOUT), "no leader"
            return next(r for r in self.replicas if r.is_leader())

    def commit(self, data: bytes, among=None) -> None:
        """Propose through a follower (forwarded to the leader), or through the leader when
        only `among` are up; wait until all (or `among`) applied it."""
        digest = hashlib.sha256(data).hexdigest()
        for attempt in range(5):    # a leader elected just now may discard it, a follower
            #                         between two leaders refuses it: propose again
            leader = self.leader()
            proposer = leader if among is not None else \
                next(r for r in self.replicas if r is not leader)
            with self.cond:
                self.failure = None
            try:
                proposer.propose(data, on_failure=self._failed)
            except NotLeader:              # the follower has not heard of the new leader yet
                with self.cond:
                    self.cond.wait(0.2)    # woken early by a role change
                continue
            sets = self.applied if among is None else [self.applied[i] for i in among]
            with self.cond:
                self.cond.wait_for(lambda: self.failure or all(digest in a for a in sets),
                                   COMMIT_TIMEOUT)
                if self.failure is None or \
                        self.failure.reason not in ("leader_changed", "discarded", "no_leader"):
                    break
        self.wait_applied([digest], among)

    def wait_applied(self, digests, among=None, timeout=COMMIT_TIMEOUT):
        sets = self.applied if among is None else [self.applied[i] for i in among]
        with self.cond:
            assert self.cond.wait_for(
                lambda: self.failure or all(d in a for a in sets for d in digests), timeout), \
                f"not applied everywhere: {[sum(d in a for d in digests) for a in sets]}"
            assert self.failure is None, f"proposal failed: {self.failure}"

    def _failed(self, failure):
        with self.cond:
            self.failure = failure
            self.cond.notify_all()

    def destroy(self):
        for r in self.replicas:
            r.destroy()


def warmed(c: InProcessCluster):
    """Yield `c` once every replica is ready and a first command is committed everywhere;
    destroy it afterwards, whatever the test did (the fixtures of this module and of
    test_prevote.py, test_apply_thread.py)."""
    try:
        for r in c.replicas:
            assert r.wait_ready(COMMIT_TIMEOUT)
        c.commit(b"warm-up")
        yield c
    finally:
        c.destroy()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from warmed(InProcessCluster(str(tmp_path_factory.mktemp("raftport"))))


@pytest.fixture
def target(cluster):
    """(host, port) of the leader's Raft port: its tick thread is the one that matters most."""
    host, port = cluster.leader().self_addr.rsplit(":", 1)
    return host, int(port)


@pytest.fixture(autouse=True)
def fresh_refusal_log(monkeypatch):
    """The refusal warning is rate-limited process-wide; each test starts with a clean slate."""
    monkeypatch.setattr(tcpconn, "_refusals", tcpconn._RefusalLog())


def _frame(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack("i", len(payload) if length is None else length) + payload


def _wait_closed(sock: socket.socket, timeout: float = CLOSE_TIMEOUT) -> None:
    """Read until the server closes the connection (EOF or reset); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the replica did not close the connection"
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            continue
        try:
            if not sock.recv(65536):
                return
        except (ConnectionResetError, BrokenPipeError):
            return


def _send_until_closed(sock: socket.socket, data: bytes, stream: bool = False) -> None:
    """Send `data` (then, with `stream`, garbage forever) until the server closes the
    connection; fail if it has not after CLOSE_TIMEOUT."""
    deadline = time.monotonic() + CLOSE_TIMEOUT
    sock.settimeout(CLOSE_TIMEOUT)  # a server that stops reading without closing: fail
    chunk = os.urandom(65536)
    try:
        sock.sendall(data)
        while stream:
            assert time.monotonic() < deadline, "the replica did not close the connection"
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # EOF (or reset) is waiting: _wait_closed reads it
            sock.sendall(chunk)
    except (ConnectionResetError, BrokenPipeError):
        return
    _wait_closed(sock, max(0.1, deadline - time.monotonic()))


def _connect(addr) -> socket.socket:
    return socket.create_connection(addr, timeout=CLOSE_TIMEOUT)


class _Marker:
    """Unpickling this creates the file `path` (what a stranger's pickle could do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_is_never_loaded_and_the_connection_is_closed(cluster, target, tmp_path,
                                                                caplog):
    marker = str(tmp_path / "pwned")
    evil = pickle.dumps(_Marker(marker))
    assert not os.path.exists(marker)
    wrong_key = AeadEncryptor(derive_master("not the secret", SALT))
    payloads = [
        evil,                                              # bare pickle
        zlib.compress(evil, 3),                            # pysyncobj's own framing
        Framing.compress(evil),                            # gesmas' framing, no encryption
        wrong_key.encrypt_at_time(Framing.compress(evil), int(time.monotonic())),
    ]
    clients = []
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        for payload in payloads:
            with _connect(target) as s:
                clients.append("%s:%s" % s.getsockname()[:2])
                s.sendall(_frame(payload))
                _wait_closed(s)
            assert not os.path.exists(marker)
    refusals = [r for r in caplog.records if "Raft port" in r.getMessage()]
    # once per connection at most, and rate-limited: one warning for these four connections
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    assert clients[0] in refusals[0].getMessage()
    assert "failed authentication" in refusals[0].getMessage()
    cluster.commit(b"after pickles")
    assert not os.path.exists(marker)


def test_a_huge_length_prefix_is_refused_before_buffering(cluster, target, caplog):
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        with _connect(target) as s:
            client = "%s:%s" % s.getsockname()[:2]
            _send_until_closed(s, struct.pack("i", 0x7FFFFFFF), stream=True)
    [refusal] = [r.getMessage() for r in caplog.records if "Raft port" in r.getMessage()]
    assert client in refusal and "2147483647" in refusal and "not yet authenticated" in refusal
    cluster.commit(b"after a huge length")


def test_a_negative_length_prefix_is_refused(cluster, target, caplog):
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        with _connect(target) as s:
            _send_until_closed(s, struct.pack("i", -5) + b"x" * 64)
    assert "frame length -5 outside" in caplog.text
    with _connect(target) as s:
        _send_until_closed(s, struct.pack("i", -0x80000000), stream=True)
    cluster.commit(b"after a negative length")


def test_a_big_unauthenticated_frame_is_refused(cluster, target, caplog):
    size = 2 ** 20
    assert size > tcpconn.PREAUTH_FRAME_CAP
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        with _connect(target) as s:
            _send_until_closed(s, _frame(os.urandom(size)))
    # refused on its length prefix, before its body was buffered
    assert f"frame length {size} outside 0..{tcpconn.PREAUTH_FRAME_CAP}" in caplog.text
    # just under the pre-authentication cap: buffered, then refused for its missing tag
    with _connect(target) as s:
        _send_until_closed(s, _frame(os.urandom(tcpconn.PREAUTH_FRAME_CAP)))
    cluster.commit(b"after a big frame")


def test_many_refused_connections_log_one_warning(cluster, target, caplog):
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        for _ in range(20):
            with _connect(target) as s:
                _send_until_closed(s, _frame(b"garbage" * 10))
    assert len([r for r in caplog.records if "Raft port" in r.getMessage()]) == 1


def test_legitimate_frames_bigger_than_a_mebibyte_still_flow(cluster):
    """A 3 MiB incompressible command: forwarded follower -> leader (one frame of > 3 MiB),
    then sent to both followers; every replica applies it."""
    assert tcpconn._frame_cap >= 16 * BIG
    for i in range(2):
        cluster.commit(bytes([i]) + os.urandom(3 * 2 ** 20))  # 0xff first marks an abort
    cluster.commit(b"small again")


def test_a_restarted_follower_catches_up_over_many_bounded_frames(tmp_path, monkeypatch,
                                                                  caplog):
    """A catching-up follower is sent the whole log tail in one tick; the leader must split
    it into frames of ~batch_size_bytes (``_size_runs``), or the reader's cap (here lowered
    to 8 MiB) would refuse the one big frame and the follower would never catch up."""
    monkeypatch.setattr(tcpconn, "_frame_cap", 8 * 2 ** 20)
    tuning = RaftTuning(batch_size_bytes=2 ** 18, snapshot_chunk_bytes=2 ** 18)
    c = InProcessCluster(str(tmp_path), tuning=tuning)
    try:
        assert all(r.wait_ready(COMMIT_TIMEOUT) for r in c.replicas)
        c.commit(b"warm-up")
        assert tcpconn._frame_cap == 8 * 2 ** 20  # 16 x 256 KiB did not raise it
        leader = c.leader()
        down = next(i for i, r in enumerate(c.replicas) if r is not leader)
        up = [i for i in range(3) if i != down]
        c.replicas[down].destroy()
        # 12 MB in all; the first byte is never 0xff, which marks the replication layer's
        # own abort entries (applier.py): 1 random command in 256 was swallowed as one
        commands = [bytes([k]) + os.urandom(200_000) for k in range(60)]
        with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
            for data in commands:
                c.commit(data, among=up)
            c.restart(down)
            c.wait_applied([hashlib.sha256(d).hexdigest() for d in commands], among=[down])
        assert not [r for r in caplog.records if "Raft port" in r.getMessage()]
    finally:
        c.destroy()


def test_silent_strangers_are_closed_and_cannot_pile_up(cluster, target, monkeypatch, caplog):
    """A connection that never authenticates is closed after HANDSHAKE_TIMEOUT; beyond
    MAX_UNKNOWN of them the oldest is closed at once."""
    monkeypatch.setattr(tcpconn, "HANDSHAKE_TIMEOUT", 0.5)
    monkeypatch.setattr(tcpconn, "MAX_UNKNOWN", 8)
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        with _connect(target) as s:
            s.sendall(b"\x00")                 # one byte of a length prefix, then silence
            _wait_closed(s)
        socks = [_connect(target) for _ in range(20)]
        try:
            closed = 0
            for s in socks[:12]:               # the oldest were closed to make room
                readable, _, _ = select.select([s], [], [], CLOSE_TIMEOUT)
                if readable:
                    closed += 1
            assert closed >= 12 - 8 - 1
            for s in socks:                    # and the rest time out
                _wait_closed(s)
        finally:
            for s in socks:
                s.close()
    assert "no authenticated handshake" in caplog.text
    cluster.commit(b"after silent strangers")


class _PeerEnd:
    """The far end of a replica's outgoing Raft connection, speaking pysyncobj's handshake
    by hand: frames are read and decrypted with the cluster secret."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.enc = AeadEncryptor(derive_master(TEST_SECRET, SALT))
        self.buf = bytearray()
        self.frames: list = []          # decrypted, not yet taken

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        assert data, "the replica closed the connection"
        self.buf += data
        while len(self.buf) >= 4:
            (length,) = struct.unpack_from("i", self.buf)
            if len(self.buf) < 4 + length:
                break
            token = bytes(self.buf[4:4 + length])
            del self.buf[:4 + length]
            self.enc.extract_timestamp(token)
            self.frames.append(pickle.loads(Framing.decompress(self.enc.decrypt(token))))

    def arrived(self) -> list:
        """The frames that have arrived so far (without waiting); takes them."""
        while select.select([self.sock], [], [], 0)[0]:
            self._recv()
        out, self.frames = self.frames, []
        return out

    def next(self, timeout: float = COMMIT_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            assert left > 0, "no frame from the replica"
            if select.select([self.sock], [], [], left)[0]:
                self._recv()
        return self.frames.pop(0)

    def send(self, message) -> None:
        token = self.enc.encrypt_at_time(Framing.compress(pickle.dumps(message)),
                                         int(time.monotonic()))
        self.sock.sendall(_frame(token))


def _messages(message) -> list:
    """The Raft messages in one (possibly batched) message."""
    if isinstance(message, dict) and message.get("type") == "gesmas_batch":
        return [m for part in message["messages"] for m in _messages(part)]
    return [message]


def _two_peers_sorting_below_the_replica():
    """Two listening sockets played as peers, and an address for the replica that sorts above
    both (pysyncobj connects only to peers whose address sorts below its own). Three sockets
    are bound and the one whose address sorts highest is given up for the replica: drawing
    ports until one happened to sort higher failed when both peers drew ports like 59xxx."""
    socks = []
    for _ in range(3):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    socks.sort(key=lambda s: "127.0.0.1:%d" % s.getsockname()[1])
    mine = socks.pop()
    addr = "127.0.0.1:%d" % mine.getsockname()[1]
    mine.close()
    for sock in socks:
        sock.listen(4)
        sock.settimeout(COMMIT_TIMEOUT)
    return socks, ["127.0.0.1:%d" % s.getsockname()[1] for s in socks], addr


def test_no_message_leaves_before_the_handshake_has_finished(tmp_path):
    """pysyncobj's handshake on an outgoing connection: the replica sends its random key, the
    peer answers (that key, its own key), and from then on every frame is (peer's key,
    message). The connection counts as up from the TCP connect, and a candidate sends
    request_vote to every peer (a follower forwards commands to the leader) whether or not
    its handshake has finished: such a message went out without a key, and the peer refused
    it ("Raft port: ... authenticated frame refused (ValueError('too many values to
    unpack'))", seen once during a rolling restart). Here the replica has two peers, both
    played by this test: one finishes the handshake (so the replica asks for pre-votes,
    prevote.py: it stands for election only once a majority would vote for it), the other
    holds its answer back while the replica asks twice. Nothing may reach the second but the
    key; once it answers, every frame carries its key."""
    listeners, peer_addrs, addr = _two_peers_sorting_below_the_replica()
    replica = Replica(addr, [addr] + peer_addrs, str(tmp_path / "r"), fresh=DigestSM,
                      restore=DigestSM, on_completions=lambda c: None, password=TEST_SECRET,
                      fsync=False, new_cluster=True,
                      tuning=RaftTuning(connection_timeout=60.0))
    conns = []
    try:
        ends = []
        for sock in listeners:
            conn, _ = sock.accept()
            conns.append(conn)
            ends.append(_PeerEnd(conn))
        keys = [end.next() for end in ends]
        assert all(isinstance(k, bytes) and len(k) == 32 for k in keys)   # each key, alone
        mine = [os.urandom(32), os.urandom(32)]
        ends[0].send((keys[0], mine[0]))                     # the first peer answers
        assert ends[0].next() == (mine[0], addr)             # and is told who it is
        rounds = replica._raft._gesmas_prevote.rounds
        deadline = time.monotonic() + COMMIT_TIMEOUT
        while replica._raft._gesmas_prevote.rounds < rounds + 2:   # two pre-votes for each
            assert time.monotonic() < deadline, "the replica does not ask for pre-votes"
            assert ends[1].arrived() == [], "a message left before the handshake finished"
            time.sleep(0.05)
        assert ends[1].arrived() == [], "a message left before the handshake finished"
        ends[1].send((keys[1], mine[1]))                     # the second answers now
        assert ends[1].next() == (mine[1], addr)
        deadline = time.monotonic() + COMMIT_TIMEOUT
        votes: list = []
        while not votes:                                     # what it held back, keyed
            got_key, message = ends[1].next(max(0.1, deadline - time.monotonic()))
            assert got_key == mine[1]
            votes = [m for m in _messages(message) if m.get("type") == PRE_VOTE]
    finally:
        replica.destroy()
        for c in conns + listeners:
            c.close()


def test_a_frame_without_the_connection_key_is_refused_by_name(cluster, target, caplog):
    """What the peer saw: after the handshake's first frame, a frame that is not (key,
    message) closes the connection, with a warning that says what was missing."""
    enc = AeadEncryptor(derive_master(TEST_SECRET, SALT))

    def frame(message) -> bytes:
        return _frame(enc.encrypt_at_time(Framing.compress(pickle.dumps(message)),
                                          int(time.monotonic())))
    with caplog.at_level(logging.WARNING, logger=tcpconn.__name__):
        with _connect(target) as s:
            s.sendall(frame(os.urandom(32)))                  # an outgoing side's key
            s.sendall(frame({"type": "request_vote", "term": 1, "last_log_index": 0,
                             "last_log_term": 0}))            # sent before the answer
            _wait_closed(s)
    assert "without the connection key" in caplog.text
    cluster.commit(b"after a keyless frame")


def test_messages_held_for_a_silent_handshake_are_dropped_when_it_times_out(tmp_path):
    """A peer that accepts the connection but never answers the handshake (a stopped
    process: the kernel still accepts) must not make the replica hold messages for ever: at
    connectionTimeout the connection is closed, as a send would have found (holding them, no
    send checked it any more), and the messages are dropped as for any disconnected peer."""
    listeners, peer_addrs, addr = _two_peers_sorting_below_the_replica()
    replica = Replica(addr, [addr] + peer_addrs, str(tmp_path / "r"), fresh=DigestSM,
                      restore=DigestSM, on_completions=lambda c: None, password=TEST_SECRET,
                      fsync=False, new_cluster=True,
                      tuning=RaftTuning(connection_timeout=2.0))
    conns = []
    try:
        ends = []
        for sock in listeners:
            conn, _ = sock.accept()
            conns.append(conn)
            ends.append(_PeerEnd(conn))
        keys = [end.next() for end in ends]
        mine = os.urandom(32)
        ends[0].send((keys[0], mine))                        # one peer answers, and keeps
        assert ends[0].next() == (mine, addr)                # reading what it gets
        silent = conns[1]                                    # the other never answers
        deadline = time.monotonic() + COMMIT_TIMEOUT
        while True:                                          # closed by the replica
            assert time.monotonic() < deadline, "the silent handshake was never closed"
            # the first peer stays in touch (a stale vote answer, ignored), so that the
            # replica keeps standing for election and has messages for the silent one
            ends[0].send((keys[0], {"type": "response_vote", "term": 0}))
            ends[0].arrived()
            if select.select([silent], [], [], 0.1)[0]:
                try:
                    data = silent.recv(65536)
                except ConnectionResetError:
                    break
                assert not data, "a message left before the handshake finished"
                break
    finally:
        replica.destroy()
        for c in conns + listeners:
            c.close()
