"""pysyncobj's TCP connections between replicas, hardened (overrides 7, 8 and 9 of the package
docstring): reads bounded and authenticated before anything is unpickled, writes that do not
wait for later sends, and strangers that may not linger or pile up on the Raft port.
`_install_tcp_overrides` patches pysyncobj's classes (once, from overrides._install_wire);
`close_stale_handshakes` runs on each tick (replica.py); `_raise_frame_cap` is called by each
Raft node this process makes, for its settings."""
from __future__ import annotations

import errno
import logging
import socket
import struct
import threading
import time
from typing import Any, Optional

from pysyncobj import pickle as _ps_pickle
from pysyncobj import tcp_connection as _tcp_connection
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

log = logging.getLogger(__name__)


# ------------------------------------------ pysyncobj override 7: bounded, authenticated reads
# pysyncobj's TcpConnection appends each recv to a ``bytes`` buffer (quadratic), waits for as
# many bytes as the 4-byte length prefix (struct 'i', so up to 2 GiB, or negative) declares,
# and only then authenticates the frame: one connection that announces 0x7fffffff and streams
# froze a replica's tick thread for minutes before any check, and with no secret it unpickled
# whatever came. The replacements below read into a bytearray, judge the length as soon as
# its 4 bytes are in, buffer at most one cap (plus one recv) before parsing, and refuse any
# frame that is not authenticated before unpickling it.
#
# PREAUTH_FRAME_CAP: until a connection has delivered one frame that decrypted *and* carried
# this connection's random key (pysyncobj's handshake: the reply on an outgoing connection,
# the node address on an incoming one), a frame may not exceed 64 KiB. The handshake frames
# measure 144-215 bytes (AEAD header 41 + tag 16 + a pickled 32-byte key, (key, key) or
# (key, address)); requiring the connection's key, not just a valid tag, keeps a replayed
# handshake frame from unlocking the large cap.
# Large cap (``_frame_cap``): the biggest frame a peer legitimately sends. ``_send_grouped``
# packs a node's messages into frames of ~batch_size_bytes (appendEntriesBatchSizeBytes)
# unless one message alone is bigger; the biggest single messages are an append_entries
# (pysyncobj stops adding entries once they reach batch_size_bytes, so < 2 x batch_size_bytes
# of commands; pickle adds ~40 bytes an entry, at most doubling it for commands of 40 bytes
# or more), a snapshot chunk (snapshot_chunk_bytes) and a forwarded command (<
# max_command_bytes). So a frame stays under ~4 x max(batch_size_bytes, snapshot_chunk_bytes)
# (measured: 1.1 MiB with RaftTuning's 1 MiB defaults, for a follower catching up 40 MiB);
# the cap is 16 x that maximum and at least 64 MiB: a wide margin, and still a bound on what
# a peer can make a replica buffer. A peer that has the secret can do anything anyway (it
# sends pickles): this cap catches bugs; the small one stops strangers.
PREAUTH_FRAME_CAP = 64 * 1024
_MIN_FRAME_CAP = 64 * 1024 * 1024
_frame_cap = _MIN_FRAME_CAP
_frame_lock = threading.Lock()
_LENGTH = struct.Struct("i")    # pysyncobj's prefix: native int
_REFUSAL_LOG_PERIOD = 10.0      # at most one warning per period (one per connection at most)


def _raise_frame_cap(batch_size_bytes: int, snapshot_chunk_bytes: int) -> None:
    """Let this process's replicas read the frames a peer with these settings sends."""
    global _frame_cap
    with _frame_lock:
        _frame_cap = max(_frame_cap, 16 * max(batch_size_bytes, snapshot_chunk_bytes))


class _RefusalLog:
    """One warning per refused connection, at most one per period; the rest are counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0
        self._suppressed = 0

    def warn(self, conn, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._suppressed += 1
                return
            self._next = now + _REFUSAL_LOG_PERIOD
            suppressed, self._suppressed = self._suppressed, 0
        try:
            peer = "%s:%s" % conn._TcpConnection__socket.getpeername()[:2]
        except (AttributeError, OSError):
            peer = "?"
        log.warning("Raft port: closed the connection with %s: %s%s", peer, reason,
                    f" ({suppressed} more connections refused since the last warning)"
                    if suppressed else "")


_refusals = _RefusalLog()


def _refuse(conn, reason: str) -> None:
    _refusals.warn(conn, reason)
    conn.disconnect()


def _cap(conn) -> int:
    sock = conn._TcpConnection__socket
    return _frame_cap if sock is not None and conn._gesmas_trusted_socket is sock \
        else PREAUTH_FRAME_CAP


def _frame_length(conn, buf: bytearray, cap: int) -> Optional[int]:
    """The length the next frame declares; None (and the connection closed) if out of bounds,
    -1 while fewer than 4 bytes are in."""
    if len(buf) < 4:
        return -1
    (length,) = _LENGTH.unpack_from(buf)
    if not 0 <= length <= cap:
        _refuse(conn, f"frame length {length} outside 0..{cap}"
                + (" (not yet authenticated)" if cap == PREAUTH_FRAME_CAP else ""))
        return None
    return length


def _process_read(self) -> bool:
    """Replaces ``TcpConnection.__processRead``: one recv, appended to a bytearray. Like
    pysyncobj it is called until the socket is drained, except that it stops (returns False)
    once the buffer holds more than a frame of ``cap`` bytes, and that it closes the
    connection as soon as the next frame's length prefix is out of bounds."""
    sock = self._TcpConnection__socket
    try:
        incoming = sock.recv(self._TcpConnection__recvBufferSize)
    except socket.error as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        self.disconnect()
        return False
    buf = self._TcpConnection__readBuffer
    if not isinstance(buf, bytearray):  # pysyncobj resets it to bytes() on (dis)connect
        buf = self._TcpConnection__readBuffer = bytearray(buf)
    buf += incoming
    cap = _cap(self)
    # the rest waits in the socket; the (level-triggered) poll reports it again after parsing
    return _frame_length(self, buf, cap) is not None and len(buf) <= 4 + cap


def _process_parse_message(self):
    """Replaces ``TcpConnection.__processParseMessage``: the same checks in the same order
    (AEAD tag and timestamp, then unpickle, then the connection's random key), but a frame is
    never unpickled unless it decrypted, and every refusal is logged (rate-limited)."""
    buf = self._TcpConnection__readBuffer
    length = _frame_length(self, buf, _cap(self))
    if length is None or length < 0 or len(buf) - 4 < length:
        return None
    data = bytes(buf[4:4 + length])
    del buf[:4 + length]
    encryptor = self.encryptor
    if encryptor is None:  # Replica always sets a secret; never unpickle an unauthenticated frame
        _refuse(self, "no cluster secret on this connection")
        return None
    try:
        timestamp = encryptor.extract_timestamp(data)  # verifies the whole token
        data = encryptor.decrypt(data)
    except Exception:
        _refuse(self, "frame failed authentication (wrong cluster secret or not a replica)")
        return None
    if timestamp < self.recvLastTimestamp:
        _refuse(self, "replayed frame (timestamp went backwards)")
        return None
    self.recvLastTimestamp = timestamp
    try:
        message = _ps_pickle.loads(_tcp_connection.zlib.decompress(data))
        if self.recvRandKey:
            if not (isinstance(message, tuple) and len(message) == 2):
                raise ValueError("a message without the connection key (sent before the "
                                 "handshake finished?)")
            rand_key, message = message
            if rand_key != self.recvRandKey:
                raise ValueError("wrong connection key")
            self._gesmas_trusted_socket = self._TcpConnection__socket
    except Exception as exc:
        _refuse(self, f"authenticated frame refused ({exc!r:.100})")
        return None
    return message


# ------------------------------------------- pysyncobj override 8: writes that do not wait
_original_send = _tcp_connection.TcpConnection.send
_READ_WRITE = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR


def _send(self, message) -> None:
    """Replaces ``TcpConnection.send``: what the kernel did not take at once goes out as soon
    as the socket is writable. pysyncobj asks the poller for WRITE only from a WRITE event, so
    a frame bigger than the socket buffer went out one buffer per later ``send`` (~one per
    heartbeat, ~2.5 MB/s): a 3 MiB command held the heartbeats behind it past the election
    timeout, and 20 MiB of commands left a cluster electing forever."""
    _original_send(self, message)
    fileno = self._TcpConnection__fileno
    if self._TcpConnection__writeBuffer and fileno is not None \
            and self.state != CONNECTION_STATE.DISCONNECTED:
        self._TcpConnection__poller.subscribe(fileno, self._TcpConnection__processConnection,
                                              _READ_WRITE)


# ------------------------------------- pysyncobj override 9: strangers may not linger or pile up
# An incoming connection stays in TCPTransport._unknownConnections until its first frame names
# a node; pysyncobj checks a connection's timeout only when it has activity, so connections
# that never send (or trickle a byte now and then) held a file descriptor each, for ever.
HANDSHAKE_TIMEOUT = 5.0          # seconds an incoming connection has to authenticate
MAX_UNKNOWN = 256                # incoming connections not yet authenticated, at most
_original_new_incoming = TCPTransport._onNewIncomingConnection


def _on_new_incoming(self, conn) -> None:
    conn._gesmas_accepted = time.monotonic()
    _original_new_incoming(self, conn)
    if len(self._unknownConnections) > MAX_UNKNOWN:
        oldest = min(self._unknownConnections, key=lambda c: c._gesmas_accepted)
        _refuse(oldest, f"more than {MAX_UNKNOWN} connections waiting to authenticate")


def close_stale_handshakes(transport: Any, now: float) -> None:
    """Close the incoming connections that have not authenticated within HANDSHAKE_TIMEOUT
    (called on the tick thread, every tick)."""
    unknown = getattr(transport, "_unknownConnections", None)
    if not unknown:
        return
    for conn in [c for c in unknown
                 if now - getattr(c, "_gesmas_accepted", now) > HANDSHAKE_TIMEOUT]:
        _refuse(conn, f"no authenticated handshake within {HANDSHAKE_TIMEOUT:g} s")


def _install_tcp_overrides() -> None:
    """Overrides 7, 8 and 9; called by ``_install_wire`` (under its lock)."""
    cls = _tcp_connection.TcpConnection
    cls._gesmas_trusted_socket = None  # the socket whose peer has proved the connection key
    cls._TcpConnection__processRead = _process_read
    cls._TcpConnection__processParseMessage = _process_parse_message
    cls.send = _send
    TCPTransport._onNewIncomingConnection = _on_new_incoming
