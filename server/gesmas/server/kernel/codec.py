"""Commands and their binary encoding.

A command is what the Raft log carries: a frozen dataclass, encoded as one version byte followed
by a tagged value tree (never pickle, so a log entry cannot run code when it is read). The
value encoding covers exactly the plain values objects may take and return: None, bool, int,
float, str, bytes, list and dict with str keys.

Layout of a value: one tag byte, then
  N (None) F/T (bool) | I zigzag-varint | D 8-byte IEEE double | S varint length + UTF-8
  | B varint length + bytes | L varint count + values | M varint count + (str key, value)...
A command: FORMAT_VERSION, then the list [type code, timestamp, tag, field...]. A first byte
of 0xFF is reserved for the replication layer's own log entries (replication/applier.py,
`Abort`): the kernel never sees one, and no command can start with it.

Every command carries the proposer's wall-clock `ts` (made monotonic by the kernel) and a `tag`
naming the pending call that waits for it on the accepting replica ("" for commands nobody
waits for, such as ticks).
"""
from __future__ import annotations

import struct
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from .budget import ResourceLimit

FORMAT_VERSION = 10
#: fields added by version 2 (auth): absent from version-1 entries, read as their defaults
_NEW_IN_2 = frozenset({"user", "secret", "create", "ctor_args", "ctor_kwargs"})
#: fields added by version 3 (Checkpoint.defer). A command whose version-3 fields all hold
#: their defaults is written as version 2, so that a replica of the previous gesmas reads
#: every command but the deferred checkpoints (and stops at those: UnknownFormat)
_NEW_IN_3 = frozenset({"defer"})
#: fields added by version 4 (Cancel.more: many cancels in one entry), written only when
#: set, as version 3's
_NEW_IN_4 = frozenset({"more"})
#: fields added by version 5 (Checkpoint.calls_apart: the waiting calls written after the
#: checkpoint's header, by its capture), written only when set
_NEW_IN_5 = frozenset({"calls_apart"})
#: fields added by version 6 (Checkpoint.listed_after: the capture finds the objects changed
#: since the last checkpoint itself, and lists the deferred ones after the frames), written
#: only when set
_NEW_IN_6 = frozenset({"listed_after"})
#: fields added by version 7 (Checkpoint.touched_in_parts: each session's objects written in
#: parts, the full ones pickled once: checkpoint format 8), written only when set
_NEW_IN_7 = frozenset({"touched_in_parts"})
#: fields added by version 8 (CreateObject.measured, Invoke.measured: an object made by the
#: command is measured at once, lifecycle.py), written only when set
_NEW_IN_8 = frozenset({"measured"})
#: fields added by version 9 (Checkpoint.hooked_touched: from this checkpoint on, a session
#: remembers only the objects it calls whose class has a session-end hook), written only
#: when set
_NEW_IN_9 = frozenset({"hooked_touched"})
#: fields added by version 10 (Checkpoint.keep_gone: with hooked_touched, the sessions keep
#: the names of objects gone by then, as without the rule; version 9's forgets them), written
#: only when set
_NEW_IN_10 = frozenset({"keep_gone"})

_DOUBLE = struct.Struct(">d")


class DecodeError(ValueError):
    """The bytes are not a command of a version this kernel understands."""


class UnknownFormat(DecodeError):
    """The command was written by a gesmas with a newer command format: a replica must stop
    rather than skip or misread it (node.py)."""


class NotPlainValue(TypeError):
    """A value (an argument or result) holds something other than a plain value."""


# -- values -----------------------------------------------------------------------------------

def _put_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _encode(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is str:
        b = v.encode("utf-8")
        out.append(0x53)  # S
        _put_varint(out, len(b))
        out += b
    elif t is int:
        out.append(0x49)  # I
        _put_varint(out, (v << 1) if v >= 0 else ((-v) << 1) - 1)
    elif v is None:
        out.append(0x4E)  # N
    elif t is bool:
        out.append(0x54 if v else 0x46)  # T / F
    elif t is bytes or t is bytearray:
        out.append(0x42)  # B
        _put_varint(out, len(v))
        out += v
    elif t is float:
        out.append(0x44)  # D
        out += _DOUBLE.pack(v)
    elif t is list or t is tuple:
        out.append(0x4C)  # L
        _put_varint(out, len(v))
        for item in v:
            _encode(item, out)
    elif t is dict:
        out.append(0x4D)  # M
        _put_varint(out, len(v))
        for k, item in v.items():
            if type(k) is not str:
                raise NotPlainValue(f"map key of type {type(k).__name__} is not a str")
            _encode(k, out)
            _encode(item, out)
    else:
        raise NotPlainValue(f"{t.__name__} is not a plain value")


def may_exceed(v: Any, limit: int) -> bool:
    """False when `v` surely takes at most `limit` bytes encoded (cheap: no walk of a scalar,
    a str or bytes); True when `encoded_size` has to tell."""
    t = type(v)
    if t is bytes:
        return len(v) > limit - 16
    if t is str:
        return 4 * len(v) > limit - 16
    return t is list or t is dict


def encoded_size(v: Any) -> int:
    """Bytes `v` takes encoded (a plain value)."""
    out = bytearray()
    _encode(v, out)
    return len(out)


def encode_value(v: Any) -> bytes:
    out = bytearray()
    _encode(v, out)
    return bytes(out)


#: Lists and maps one value in a log entry or a result may nest. The wire takes fewer
#: (gesmas.protocol.values.MAX_DEPTH: protobuf's parser counts messages, three a dict level):
#: a result deeper than that is refused when its answer is encoded. This limit stays where
#: the logs already written were read with, so that they replay alike.
MAX_NESTING = 100


def _decode(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
    tag = buf[pos]
    pos += 1
    if tag == 0x53 or tag == 0x42 or tag == 0x49 or tag == 0x4C or tag == 0x4D:
        n = 0
        shift = 0
        while True:
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        if tag == 0x53:
            end = pos + n
            if end > len(buf):
                raise DecodeError("truncated string")
            return buf[pos:end].decode("utf-8"), end
        if tag == 0x49:
            return ((n >> 1) if not n & 1 else -((n + 1) >> 1)), pos
        if tag == 0x42:
            end = pos + n
            if end > len(buf):
                raise DecodeError("truncated bytes")
            return bytes(buf[pos:end]), end
        if tag == 0x4C or tag == 0x4D:
            if depth >= MAX_NESTING:
                raise DecodeError(f"value nested more than {MAX_NESTING} levels deep")
            depth += 1
        if tag == 0x4C:
            items = []
            for _ in range(n):
                item, pos = _decode(buf, pos, depth)
                items.append(item)
            return items, pos
        d = {}
        for _ in range(n):
            k, pos = _decode(buf, pos, depth)
            if type(k) is not str:
                raise DecodeError("map key is not a string")
            d[k], pos = _decode(buf, pos, depth)
        return d, pos
    if tag == 0x4E:
        return None, pos
    if tag == 0x54:
        return True, pos
    if tag == 0x46:
        return False, pos
    if tag == 0x44:
        return _DOUBLE.unpack_from(buf, pos)[0], pos + 8
    raise DecodeError(f"unknown value tag 0x{tag:02x} at byte {pos - 1}")


def _decode_checked(buf: bytes, pos: int, what: str) -> tuple[Any, int]:
    """_decode, with every way malformed bytes can fail turned into DecodeError."""
    try:
        return _decode(buf, pos)
    except DecodeError:
        raise
    except (IndexError, struct.error):
        raise DecodeError(f"truncated {what}") from None
    except (UnicodeDecodeError, RecursionError, TypeError, ValueError) as e:
        raise DecodeError(f"malformed {what}: {type(e).__name__}") from None


def decode_value(buf: bytes) -> Any:
    v, pos = _decode_checked(buf, 0, "value")
    if pos != len(buf):
        raise DecodeError(f"{len(buf) - pos} trailing bytes after value")
    return v


MAX_COPY = 1 << 20     # values (nodes) one plain_copy may visit


class TooLarge(ValueError):
    """A value has more parts than a copy may visit (shared sub-values count every time)."""


def plain_copy(v: Any, path: str = "value") -> Any:
    """A deep copy of `v` as plain values (tuples become lists), or NotPlainValue naming the
    path of the first part that is not a plain value, or TooLarge past MAX_COPY parts (a
    structure that shares sub-values can be exponentially big unfolded). Results leave the
    kernel through this so a stored result cannot change when the object later mutates."""
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    from .charge import unfold
    try:    # shared parts: measured over the distinct containers before any copy is made
        big = unfold(v, MAX_COPY, charged=False) > MAX_COPY
    except ResourceLimit as exc:
        raise TooLarge(f"{path}: {exc}") from None
    if big:
        raise TooLarge(f"{path}: more than {MAX_COPY} values (shared parts counted each "
                       "time they are reached)")
    return _copy(v, path, [MAX_COPY])


def _copy(v: Any, path: str, left: list[int], depth: int = 0) -> Any:
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if t is bytes or t is bytearray:
        return bytes(v)
    if t is list or t is tuple or t is dict:
        left[0] -= 1 + len(v)
        if left[0] < 0:
            raise TooLarge(f"{path}: more than {MAX_COPY} values")
        if depth >= MAX_NESTING:
            where = path if len(path) < 80 else path[:40] + "..." + path[-20:]
            raise TooLarge(f"{where}: nested more than {MAX_NESTING} levels deep")
        depth += 1
        if t is dict:
            out = {}
            for k, x in v.items():
                if type(k) is not str:
                    raise NotPlainValue(f"{path}: map key of type {type(k).__name__} is not "
                                        "a str")
                out[k] = _copy(x, f"{path}[{k!r}]", left, depth)
            return out
        return [_copy(x, f"{path}[{i}]", left, depth) for i, x in enumerate(v)]
    raise NotPlainValue(f"{path}: {t.__name__} is not a plain value "
                        "(use None, bool, int, float, str, bytes, list or dict)")


# -- commands ---------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Command:
    """`user` is the authenticated user the gateway vouches for ("" for none; auth.SYSTEM for
    the replicas' own commands); the kernel's permission checks use it (kernel/auth.py)."""
    CODE: ClassVar[int] = 0
    ts: float = 0.0
    tag: str = ""
    user: str = ""


@dataclass(frozen=True, kw_only=True)
class OpenSession(Command):
    """Open a session; its id is the log index of this command. `secret` (random, drawn by
    the gateway) must accompany every later use of the session: the id alone is not enough."""
    CODE: ClassVar[int] = 1
    ttl: float = 10.0
    secret: str = ""


@dataclass(frozen=True, kw_only=True)
class CloseSession(Command):
    """The client ends its session: waiters are aborted, session hooks run."""
    CODE: ClassVar[int] = 2
    session: int = 0
    secret: str = ""


@dataclass(frozen=True, kw_only=True)
class ExpireSession(Command):
    """Proposed by the leader when a session's TTL passed without keep-alive."""
    CODE: ClassVar[int] = 3
    session: int = 0


@dataclass(frozen=True, kw_only=True)
class RegisterClass(Command):
    CODE: ClassVar[int] = 4
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class CreateObject(Command):
    """Get-or-create the object `name` of class `class_name`. `measured`: a new object's
    state is measured as it is made (Lifecycle.make), rather than by the next checkpoint."""
    CODE: ClassVar[int] = 5
    session: int = 0
    class_name: str = ""
    name: str = ""
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    secret: str = ""
    measured: bool = False


@dataclass(frozen=True, kw_only=True)
class Invoke(Command):
    """Call `method` on object `name`. (session, seq) identifies the call for exactly-once;
    `ack` is the client's low-water mark: it has received every result with seq <= ack.
    `class_name`, when not empty, must match the object's class. `timeout` (seconds) bounds
    every wait inside the call; None waits for ever, 0 never waits. With `create`, a missing
    object is first made with `ctor_args`/`ctor_kwargs` (get-or-create in one command), and
    measured as it is made if `measured` (as CreateObject's)."""
    CODE: ClassVar[int] = 6
    session: int = 0
    seq: int = 0
    ack: int = 0
    class_name: str = ""
    name: str = ""
    method: str = ""
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    timeout: float | None = None
    secret: str = ""
    create: bool = False
    ctor_args: list = field(default_factory=list)
    ctor_kwargs: dict = field(default_factory=dict)
    measured: bool = False


@dataclass(frozen=True, kw_only=True)
class DeleteObject(Command):
    CODE: ClassVar[int] = 7
    name: str = ""


@dataclass(frozen=True, kw_only=True)
class Tick(Command):
    """Advance kernel time to `ts`, timing out the waits that are due."""
    CODE: ClassVar[int] = 8


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Command):
    """Interrupt every waiter, serialize the quiescent state, re-run the waiters (DESIGN §5).
    `defer`: the standard classes' objects are saved after the entry (kernel/capture.py).
    `calls_apart`: the waiting calls too, one pickle each after the header (format 6).
    `listed_after`: and the entry hands the set of changed objects to the capture as it is,
    which lists the deferred ones after the frames (format 7; needs `calls_apart`).
    `touched_in_parts`: and each session's objects (`Session.touched`) are written in parts,
    the full ones pickled once (format 8; needs `listed_after`).
    `hooked_touched`: from this entry on, each session remembers only the objects it called
    whose class has a session-end hook (`Session.touched`: the objects whose hook runs when
    it ends), and forgets the others it remembered (State.hooked_touched).
    `keep_gone`: and the names it remembers of objects gone by then are kept (an object made
    again under one gets the session's hook, as without the rule); a version-9 entry, which
    has not the field, forgets them (records.Session.forget_unhooked)."""
    CODE: ClassVar[int] = 9
    defer: bool = False
    calls_apart: bool = False
    listed_after: bool = False
    touched_in_parts: bool = False
    hooked_touched: bool = False
    keep_gone: bool = False


@dataclass(frozen=True, kw_only=True)
class Query(Command):
    """A read through the log: `what` is one of 'classes', 'class', 'objects', 'stats'."""
    CODE: ClassVar[int] = 10
    what: str = ""
    arg: Any = None


@dataclass(frozen=True, kw_only=True)
class Cancel(Command):
    """The caller that waits for (session, seq) under `call_tag` went away (its RPC was
    cancelled). Its tag is dropped; if no other caller waits for the call (a retry through
    another replica joins it with its own tag) and the call still waits, it is withdrawn and
    forgotten, so a later retry of the same (session, seq) runs it afresh. If the call already
    finished, nothing happens and a retry gets the stored result."""
    CODE: ClassVar[int] = 11
    session: int = 0
    seq: int = 0
    call_tag: str = ""
    secret: str = ""
    #: further cancels in the same entry, each [session, seq, call_tag, secret, user] (a
    #: stream that breaks with thousands of waiting calls withdraws them in a few entries)
    more: list = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Auth(Command):
    """An operation on users, roles or the auth flag (kernel/auth.py `AuthState.apply`)."""
    CODE: ClassVar[int] = 12
    op: str = ""
    args: dict = field(default_factory=dict)


COMMANDS: dict[int, type[Command]] = {
    c.CODE: c for c in (OpenSession, CloseSession, ExpireSession, RegisterClass, CreateObject,
                        Invoke, DeleteObject, Tick, Checkpoint, Query, Cancel, Auth)
}
_FIELDS: dict[type, tuple[str, ...]] = {
    c: tuple(f.name for f in fields(c) if f.name not in ("ts", "tag")) for c in COMMANDS.values()
}
_FIELDS_V9: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_10) for c, names in _FIELDS.items()
}
_FIELDS_V8: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_9) for c, names in _FIELDS_V9.items()
}
_FIELDS_V7: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_8) for c, names in _FIELDS_V8.items()
}
_FIELDS_V6: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_7) for c, names in _FIELDS_V7.items()
}
_FIELDS_V5: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_6) for c, names in _FIELDS_V6.items()
}
_FIELDS_V4: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_5) for c, names in _FIELDS_V5.items()
}
_FIELDS_V3: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_4) for c, names in _FIELDS_V4.items()
}
_FIELDS_V2: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_3) for c, names in _FIELDS_V3.items()
}
_FIELDS_V1: dict[type, tuple[str, ...]] = {
    c: tuple(n for n in names if n not in _NEW_IN_2) for c, names in _FIELDS_V2.items()
}
_BY_VERSION = {1: _FIELDS_V1, 2: _FIELDS_V2, 3: _FIELDS_V3, 4: _FIELDS_V4, 5: _FIELDS_V5,
               6: _FIELDS_V6, 7: _FIELDS_V7, 8: _FIELDS_V8, 9: _FIELDS_V9,
               FORMAT_VERSION: _FIELDS}
#: per command type: (version, its new fields and their defaults), newest first
_NEWER = {c: tuple((v, {f.name: (f.default if f.default_factory is MISSING
                                 else f.default_factory()) for f in fields(c) if f.name in new})
                   for v, new in ((10, _NEW_IN_10), (9, _NEW_IN_9), (8, _NEW_IN_8), (7, _NEW_IN_7), (6, _NEW_IN_6),
                                  (5, _NEW_IN_5), (4, _NEW_IN_4), (3, _NEW_IN_3)))
          for c in COMMANDS.values()}


def _version(cmd: Command) -> int:
    """The oldest format that holds `cmd`: version 2 unless a field of a later one is set."""
    for version, new in _NEWER[type(cmd)]:
        if any(getattr(cmd, n) != d for n, d in new.items()):
            return version
    return 2


def encode(cmd: Command) -> bytes:
    t = type(cmd)
    version = _version(cmd)
    items = [t.CODE, float(cmd.ts), cmd.tag]
    items.extend(getattr(cmd, name) for name in _BY_VERSION[version][t])
    out = bytearray((version,))
    _encode(items, out)
    return bytes(out)


_CHECKPOINT_HEADS = tuple(bytes((v, 0x4C, 3 + len(names[Checkpoint]), 0x49,
                                 Checkpoint.CODE << 1)) for v, names in _BY_VERSION.items())


def is_checkpoint(data: bytes) -> bool:
    """Whether `data` encodes a `Checkpoint` command (from its first 5 bytes: the version,
    the list tag and length, the type code), without decoding it."""
    return data[:5] in _CHECKPOINT_HEADS


def decode(data: bytes) -> Command:
    if not data:
        raise DecodeError("empty command")
    if data[0] not in _BY_VERSION:
        raise UnknownFormat(f"command format version {data[0]} is not supported (this gesmas "
                            f"reads versions 1 to {FORMAT_VERSION}): upgrade this replica")
    items, pos = _decode_checked(data, 1, "command")
    if pos != len(data) or type(items) is not list or len(items) < 3:
        raise DecodeError("malformed command envelope")
    cls = COMMANDS.get(items[0]) if type(items[0]) is int else None
    if cls is None:
        raise DecodeError(f"unknown command type {items[0]!r}")
    names = _BY_VERSION[data[0]][cls]
    if len(items) != 3 + len(names):
        raise DecodeError(f"{cls.__name__}: expected {len(names)} fields, got {len(items) - 3}")
    try:
        return cls(ts=items[1], tag=items[2], **dict(zip(names, items[3:])))
    except TypeError as e:
        raise DecodeError(f"{cls.__name__}: {e}") from None
