"""What a Raft message costs on the wire between replicas: encryption and framing.

pysyncobj frames every message as ``zlib.compress(pickle.dumps(message), 3)`` and, with a
cluster secret, wraps it in a Fernet token (AES-CBC + HMAC-SHA256, base64-encoded, a fresh
IV from ``os.urandom``). Measured on a 3-replica cluster with one client (cProfile of the
leader's tick thread, 1000 produces), that work and the GIL hand-offs of its C calls cost
~0.25 ms per message, and one command costs each replica four to eight messages. Messages are
small (a command entry is ~200 bytes), so neither the compression nor the base64 buys anything.

``replication.py`` installs the two replacements below; nothing here imports pysyncobj.

* ``AeadEncryptor`` replaces Fernet with ChaCha20-Poly1305 (one authenticated-encryption call
  each way). The master key comes from the cluster secret exactly as pysyncobj derives its
  Fernet key (PBKDF2-HMAC-SHA256, 100,000 rounds, pysyncobj's salt). Each process run draws a
  random 16-byte ``run salt`` and encrypts under HKDF(master, run salt); nonces are a counter,
  so a (key, nonce) pair is never reused, however long the cluster runs. A token is
  ``version | run salt | timestamp | counter | ciphertext+tag`` and the header is
  authenticated. pysyncobj asks for the timestamp before it decrypts (to refuse replays of
  older tokens); ``extract_timestamp`` therefore verifies the whole token and keeps the
  plaintext for the ``decrypt`` call that follows, so a forged timestamp is never believed.
* ``Framing`` stands in for the ``zlib`` module inside ``pysyncobj.tcp_connection``: a
  message under 8 KiB goes out as ``b"r" + pickle``, a larger one (snapshot chunks, long
  batches of entries) as ``b"z" + zlib level 1``.

Both change the replica-to-replica wire format: every replica of a cluster must run a gesmas
with this module (there is no mixed-version operation).
"""
from __future__ import annotations

import itertools
import os
import struct
import threading
import zlib
from collections import OrderedDict

VERSION = b"\x47"               # 'G'; the first byte of a Fernet token is 0x80
_HEADER = struct.Struct(">16sQQ")  # run salt, timestamp, counter
HEADER_LEN = 1 + _HEADER.size
_INFO = b"gesmas raft transport v1"
_MAX_PEER_KEYS = 64             # run salts remembered (one per peer process run)
COMPRESS_FROM = 8192


def derive_master(password: str | bytes, salt: bytes) -> bytes:
    """pysyncobj's key derivation (``pysyncobj.encryptor.getEncryptor``), raw 32 bytes."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
    if not isinstance(password, bytes):
        password = password.encode()
    return PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=salt,
                      iterations=100000).derive(password)


class AeadEncryptor:
    """The three calls pysyncobj's TcpConnection makes on its encryptor, over ChaCha20-Poly1305.

    Thread-safe: a lock guards the peer-key cache and the verified-plaintext slot.
    """

    def __init__(self, master: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
        self._aead_cls = ChaCha20Poly1305
        self._master = master
        self._salt = os.urandom(16)
        self._send = ChaCha20Poly1305(self._derive(self._salt))
        self._counter = itertools.count(1)
        self._peers: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()
        self._opened: tuple[bytes, bytes] | None = None  # (token, plaintext) just verified

    def _derive(self, salt: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_INFO).derive(
            self._master)

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        n = next(self._counter)
        header = VERSION + _HEADER.pack(self._salt, current_time, n)
        return header + self._send.encrypt(n.to_bytes(12, "big"), data, header)

    def _open(self, token: bytes) -> tuple[int, bytes]:
        if len(token) < HEADER_LEN + 16 or token[:1] != VERSION:
            raise ValueError("not a gesmas transport token")
        header = token[:HEADER_LEN]
        salt, ts, n = _HEADER.unpack_from(header, 1)
        with self._lock:
            aead = self._peers.get(salt)
            if aead is None:
                aead = self._aead_cls(self._derive(salt))
                self._peers[salt] = aead
                while len(self._peers) > _MAX_PEER_KEYS:
                    self._peers.popitem(last=False)
            else:
                self._peers.move_to_end(salt)
        # raises cryptography.exceptions.InvalidTag on any change to header or body
        plain = aead.decrypt(n.to_bytes(12, "big"), token[HEADER_LEN:], header)  # type: ignore[attr-defined]
        return ts, plain

    def extract_timestamp(self, token: bytes) -> int:
        ts, plain = self._open(token)
        with self._lock:
            self._opened = (token, plain)
        return ts

    def decrypt(self, token: bytes, ttl: int | None = None) -> bytes:
        with self._lock:
            opened, self._opened = self._opened, None
        if opened is not None and opened[0] is token:
            return opened[1]
        return self._open(token)[1]


class Framing:
    """Replaces the ``zlib`` name in ``pysyncobj.tcp_connection`` (compress/decompress)."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        if len(data) >= COMPRESS_FROM:
            return b"z" + zlib.compress(data, 1)
        return b"r" + data

    @staticmethod
    def decompress(data: bytes) -> bytes:
        kind = data[:1]
        if kind == b"r":
            return data[1:]
        if kind == b"z":
            return zlib.decompress(data[1:])
        raise ValueError("unknown frame kind")
