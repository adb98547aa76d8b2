"""The backup file: what `gesmas backup FILE` writes and `gesmas server --restore FILE` reads.

Layout (all integers big-endian):

    b"GESMAS-BACKUP\\n"                  magic, 14 bytes
    u32 header length, header bytes     the header: a JSON object (utf-8)
    u32 CRC-32 of the header bytes
    checkpoint bytes                    exactly header["size"] of them

The header: ``format`` (of this file, FORMAT), ``checkpoint_format`` (the kernel's),
``index`` (K, the log index the state is at), ``state_digest`` (Status' digest of the state
at K), ``sha256`` (hex, of the checkpoint bytes), ``size``, ``members`` (the Raft addresses
of the cluster that was backed up), ``node_id`` (the replica that took it), ``created``
(Unix time). A reader checks the magic, the header's CRC, its fields, the length and the
SHA-256 of the checkpoint: a truncated or altered file is refused with the reason, before
anything is done with it. Whether the checkpoint loads and gives the digest is checked by
the restoring server, which runs the kernel (gesmas.server.backup).

Written atomically (`write`): a temporary file next to the target, fsynced, renamed over
it, the directory fsynced; a crash leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

MAGIC = b"GESMAS-BACKUP\n"
FORMAT = 1
_U32 = struct.Struct(">I")
MAX_HEADER = 1 << 20          # a header is a few hundred bytes; more is not a backup file


class BadBackup(ValueError):
    """The file is not a complete, intact gesmas backup; the message says what is wrong."""


@dataclass(frozen=True)
class Header:
    index: int
    state_digest: str
    sha256: str
    size: int
    checkpoint_format: int
    members: list[str] = field(default_factory=list)
    node_id: str = ""
    created: float = 0.0
    format: int = FORMAT


def header_for(blob: bytes, **fields: Any) -> Header:
    """A header for checkpoint `blob` (its size and SHA-256 computed here)."""
    return Header(sha256=hashlib.sha256(blob).hexdigest(), size=len(blob), **fields)


def dumps(header: Header, blob: bytes) -> bytes:
    raw = json.dumps(asdict(header), sort_keys=True).encode()
    return MAGIC + _U32.pack(len(raw)) + raw + _U32.pack(zlib.crc32(raw)) + blob


def write(path: str, header: Header, blob: bytes, fsync: bool = True) -> None:
    """Write the backup file at `path` atomically (module docstring)."""
    check(header, blob)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gesmas-backup-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(dumps(header, blob))
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read(path: str) -> tuple[Header, bytes]:
    """The header and checkpoint of the backup file at `path`, checked (BadBackup)."""
    try:
        with open(path, "rb") as f:
            return _read(f, os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise BadBackup(f"cannot read backup {path}: {e.strerror or e}") from None


def _read(f: BinaryIO, total: int) -> tuple[Header, bytes]:
    if f.read(len(MAGIC)) != MAGIC:
        raise BadBackup("not a gesmas backup file (it does not start with GESMAS-BACKUP)")
    head = f.read(_U32.size)
    if len(head) < _U32.size:
        raise BadBackup("truncated: the file ends inside its header")
    (length,) = _U32.unpack(head)
    if length > MAX_HEADER:
        raise BadBackup(f"header length {length} is not plausible (damaged file)")
    raw = f.read(length)
    crc = f.read(_U32.size)
    if len(raw) < length or len(crc) < _U32.size:
        raise BadBackup("truncated: the file ends inside its header")
    if zlib.crc32(raw) != _U32.unpack(crc)[0]:
        raise BadBackup("the header's CRC does not match: the file is damaged")
    header = _header(raw)
    start = len(MAGIC) + 2 * _U32.size + length
    if total != start + header.size:
        what = "truncated" if total < start + header.size else "has trailing bytes"
        raise BadBackup(f"{what}: {total - start} checkpoint bytes, the header says "
                        f"{header.size}")
    blob = f.read(header.size)
    check(header, blob)
    return header, blob


def _header(raw: bytes) -> Header:
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise BadBackup(f"the header is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise BadBackup("the header is not a JSON object")
    if d.get("format") != FORMAT:
        raise BadBackup(f"backup file format {d.get('format')!r} is not {FORMAT}, the one this "
                        "gesmas reads")
    kinds: dict[str, type | tuple[type, ...]] = {
        "index": int, "state_digest": str, "sha256": str, "size": int, "checkpoint_format": int,
        "members": list, "node_id": str, "created": (int, float)}
    for name, kind in kinds.items():
        if not isinstance(d.get(name), kind) or isinstance(d.get(name), bool):
            raise BadBackup(f"header field {name!r} is missing or of the wrong type")
    unknown = d.keys() - kinds.keys() - {"format"}
    if unknown:
        raise BadBackup(f"unknown header fields {sorted(unknown)} (a newer gesmas wrote it?)")
    if not all(isinstance(m, str) for m in d["members"]):
        raise BadBackup("header field 'members' must list Raft addresses")
    return Header(**d)


def check(header: Header, blob: bytes) -> None:
    """Refuse a header that does not describe `blob`, or describes no usable state."""
    if header.index < 2:
        raise BadBackup(f"index {header.index}: a backup is at log index 2 or later")
    if header.size != len(blob):
        raise BadBackup(f"the checkpoint has {len(blob)} bytes, the header says {header.size}")
    if hashlib.sha256(blob).hexdigest() != header.sha256:
        raise BadBackup("the checkpoint's SHA-256 does not match the header: the file is "
                        "damaged")
    if not header.state_digest:
        raise BadBackup("the header has no state digest")
