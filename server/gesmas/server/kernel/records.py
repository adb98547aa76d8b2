"""The kernel's records: commands' answers, its configuration, its state (the one record its
parts share), sessions, objects and pending calls (the requests it runs: request.py). Data,
and the few checks that read nothing else; no part of the kernel is imported here."""
from __future__ import annotations

import contextvars
import io
import itertools
import pickle
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from . import codec
from .auth import AuthState, Usage
from .epochdict import EpochDict
from .errors import Code, Error, KernelError
from .frametable import FrameTable
from .names import SortedNames
from .registry import ClassVersion
from .request import Request
from .sched import SAVING


@dataclass(frozen=True)
class Completion:
    """The answer to the call identified by `tag`: a plain value, or an error."""

    tag: str
    value: Any = None
    error: Error | None = None


@dataclass(frozen=True)
class Config:
    step_budget: int = 200_000        # steps per run of a request between two waits
    max_waiters: int = 1_000_000      # blocked requests, all objects together
    max_results: int = 10_000         # unacknowledged results kept per session
    max_result_bytes: int = 1 << 20   # encoded size of one call's result
    max_object_bytes: int = 64 << 20  # pickled size of one object's state, checked at checkpoints
    max_source: int = 256 * 1024      # characters of one class source
    # class names only the replicas' own uploads (auth.SYSTEM) may define
    reserved_classes: frozenset[str] = frozenset()
    # per-user quotas for users without their own value (kernel/auth.py; root has none);
    # callers without a login share one. Objects: room for a million-object cluster (a
    # standard object holds ~0.3 KB of state and costs ~1 KB of memory on each replica).
    default_quota: tuple[tuple[str, int], ...] = (
        ("sessions", 10_000), ("objects", 2_000_000), ("waiters", 100_000),
        ("state_bytes", 1 << 30), ("source_bytes", 4 << 20))
    # Log indices the operator declared poison (a command that kills the process whatever the
    # kernel does): they complete with INTERNAL without running. Same list on every replica.
    skip_entries: frozenset[int] = frozenset()
    # Test-only failpoint (kernel/failpoints.py): the dialect gets `native_stall(n)`, one C
    # call that holds the GIL for a long time. The server sets it from the environment.
    failpoint_native_stall: bool = False


class State:
    """What the kernel knows, shared by its parts (kernel.py makes them): the log's position
    and time, the sessions, the objects and what became of dropped ones, users and what they
    use. A checkpoint saves it and the state digest hashes it (checkpoint.py). Each part says
    which fields it changes; nothing but data and the quota check lives here."""

    __slots__ = ("index", "now", "sessions", "objects", "dropped", "over_limit", "auth",
                 "usage", "default_quota", "session_changes", "frames", "hooked_touched")

    def __init__(self, config: Config) -> None:
        self.index = 0                           # the log index of the last command applied
        self.now = 0.0                           # kernel time: commands' ts, made monotonic
        self.sessions: dict[int, Session] = {}
        self.objects = ObjectTable()
        # A cache, not part of the state: each object's entry in the last checkpoint taken or
        # loaded (checkpoint.py), None until the next one saves it. Kept in the order of
        # `objects` (lifecycle.py and checkpoint.py add and remove names in both alike).
        # each object's checkpoint frame: bytes, None until saved, or a capture.Slot while
        # the open capture saves it
        # (frametable.py: in pages, which a format-7 capture keeps joined)
        self.frames = FrameTable()
        self.dropped: dict[str, str] = {}   # objects a checkpoint had to drop -> why (bounded)
        self.over_limit: dict[str, int] = {}   # objects over max_object_bytes -> their size
        # since a Checkpoint with hooked_touched: sessions remember only the objects whose
        # class has a session-end hook (Session.remember)
        self.hooked_touched = False
        self.auth = AuthState()
        self.usage = Usage()
        self.default_quota = dict(config.default_quota)
        # output besides completions, for the host (the leader's duties): sessions opened
        # (id, ttl, secret) and ended (id, None, "") by the last apply
        self.session_changes: list[tuple[int, float | None, str]] = []

    def within(self, user: str, what: str, extra: int = 1) -> None:
        """Raise RESOURCE_EXHAUSTED if `user` would go over its `what` quota."""
        limit = self.auth.quota(user, what, self.default_quota)
        if limit is None:
            return
        used = (self.auth.source_used.get(user, 0) if what == "source_bytes"
                else self.usage.get(user, what))
        if used + extra > limit:
            own = self.auth.users.get(user)
            flag = what.replace("_", "-")
            if own is not None and what in own["quota"]:
                source = "the user's own quota"
            elif user:
                source = (f"the default quota; `gesmas user quota {user} --{flag} N` sets "
                          "its own")
            else:
                source = ("the default quota, shared by every caller without a login: log in "
                          "as a user to have a quota of its own")
            who = f"user {user!r}" if user else "anonymous callers"
            raise KernelError(Code.RESOURCE_EXHAUSTED,
                              f"quota {what} of {who} exceeded: {used} in use, limit {limit} "
                              f"({source})", "QuotaExceeded")


class ObjectTable(EpochDict[str, "ObjectRecord"]):
    """The live objects by name, in creation order as a dict keeps them (the order the
    checkpoint and the digest walk), plus `names`: the same names sorted, for listings by
    page (names.py). Every way to add or remove a key keeps the two alike. Kept in dicts of
    at most 2^15 names (epochdict.py), so that no object made waits for one dict of all the
    objects to grow."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        super().__init__()
        self.names = SortedNames()

    def __setitem__(self, name: str, rec: ObjectRecord) -> None:
        if self.put(name, rec):
            self.names.add(name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.names.discard(name)

    _MISSING: Any = object()

    def pop(self, name: str, default: Any = _MISSING) -> Any:
        rec = super().pop(name, ObjectTable._MISSING)
        if rec is not ObjectTable._MISSING:
            self.names.discard(name)
            return rec
        if default is ObjectTable._MISSING:
            raise KeyError(name)
        return default

    def setdefault(self, name: str, rec: Any = None) -> Any:
        if name not in self:
            self[name] = rec
        return self[name]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, rec in dict(*args, **kwargs).items():
            self[name] = rec

    def popitem(self) -> tuple[str, ObjectRecord]:
        name, rec = super().popitem()
        self.names.discard(name)
        return name, rec

    def clear(self) -> None:
        super().clear()
        self.names = SortedNames()

    def __ior__(self, other: Any) -> ObjectTable:
        self.update(other)
        return self

    def __reduce__(self) -> Any:          # a copy or a pickle gets its sorted names too
        return (_object_table, (list(self.items()),))

    @contextmanager
    def bulk(self) -> Iterator[None]:
        """Many changes (a restore adds every object) without keeping the sorted names
        meanwhile: they are made again at the end, with one sort."""
        self.names = _NOT_KEPT
        try:
            yield
        finally:
            self.names = SortedNames.of(sorted(self))


class _NotKept(SortedNames):
    """The sorted names of an ObjectTable in bulk(): changes are ignored."""

    def add(self, name: str) -> None:
        pass

    def discard(self, name: str) -> None:
        pass


_NOT_KEPT = _NotKept()


def _object_table(items: list[tuple[str, ObjectRecord]]) -> ObjectTable:
    table = ObjectTable()
    table.update(items)
    return table


#: Names per pickled part of a session's `touched` in a checkpoint (Session.__getstate__).
TOUCHED_CHUNK = 4096
#: Set while a checkpoint of format 8 (Checkpoint.touched_in_parts) pickles the sessions.
TOUCHED_IN_PARTS: contextvars.ContextVar[bool] = contextvars.ContextVar("touched_in_parts",
                                                                       default=False)
#: Set while the state digest pickles the sessions (digests.state_digest): the names of the
#: objects with a session-end hook; a session's `touched` is hashed as those of them it
#: holds, so a kernel that remembers only hooked objects (State.hooked_touched) and one that
#: remembers all have the same digest, and the checkpoint that forgets the others keeps it.
DIGEST_HOOKED: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "digest_hooked", default=None)


def unshared_pickle(value: Any) -> bytes:
    """`value` (no cycles) pickled without a memo: the same bytes whether or not two equal
    strings in it are one object, which depends on a replica's history (live or restored,
    when its idle slices ran)."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=5)
    p.fast = True
    p.dump(value)
    return buf.getvalue()


class Session:
    __slots__ = ("id", "ttl", "results", "acked", "dropped", "touched", "inflight", "user",
                 "secret", "opened", "_touched_parts")

    def __init__(self, sid: int, ttl: float, user: str = "", secret: str = "",
                 opened: float = 0.0) -> None:
        self.id = sid
        self.ttl = ttl
        self.opened = opened                     # kernel time when it was opened
        self.user = user                         # who opened it (auth), "" for nobody
        self.secret = secret                     # must accompany every use of the session
        self.results: dict[int, tuple[Any, Error | None]] = {}
        self.acked = 0
        self.dropped = 0                         # highest seq whose result was evicted
        self.touched: dict[str, None] = {}       # objects used, in first-use order (remember)
        self.inflight: dict[int, Request] = {}   # seq -> request; a checkpoint writes
                                                 # them as its pending calls instead
        # `touched` as a checkpoint writes it: the pickles of its names TOUCHED_CHUNK at a
        # time, in order, the full ones made once (a cache, not state: `touched` only grows)
        self._touched_parts: list[bytes] = []

    def remember(self, name: str, rec: ObjectRecord, hooked_only: bool) -> None:
        """This session calls `rec`, named `name` in the command (the string kept: a
        checkpoint of format 7 or older pickles `touched` with a memo, so which string
        object it holds shows in the bytes): remember it, so that its session-end hook runs
        when the session ends (sessions.py). With `hooked_only` (State.hooked_touched), only
        an object whose class has such a hook: a session that called 10^6 Counters kept their
        10^6 names (~33 bytes each in memory, ~18 in every checkpoint) for nothing."""
        if not hooked_only or rec.cls.ends_with_sessions():
            self.touched[name] = None

    def forget_unhooked(self, objects: Any, keep_gone: bool) -> None:
        """Forget, in order, the remembered objects that exist in `objects` without a
        session-end hook (a Checkpoint with hooked_touched); the checkpoint parts of the
        names are made again. With `keep_gone` (Checkpoint.keep_gone, version 10) a name
        whose object is gone is kept, as a kernel without the rule keeps it: an object made
        again under it gets this session's hook as it would there, whichever side of the
        checkpoint the deletion was. Version 9's entry forgot those names, so a log with
        that checkpoint between a deletion and the object made again ran other hooks and
        had another state digest than the log without it (the kernel's property test found
        it); its entries still do, as they did. Left as the rule's one edge: a name called
        while its object had no hook, made again with a class that has one, does not get
        the hook of the sessions that called the old object."""
        kept: dict[str, None] = {}
        for name in self.touched:
            rec = objects.get(name)
            if (rec is None and keep_gone) or (rec is not None and rec.cls.ends_with_sessions()):
                kept[name] = None
        if len(kept) != len(self.touched):
            self.touched = kept
            self._touched_parts = []

    def touched_parts(self) -> list[bytes]:
        """`touched` as a checkpoint writes it: its names in order, in lists of
        TOUCHED_CHUNK, each pickled on its own. Only the last, partial list is pickled at
        every checkpoint; a full one was pickled once. A session that called 2x10^5 objects
        wrote all their names at every checkpoint's entry (~30-40 ms); now only those it
        called first since. The parts depend only on the names and their order, so every
        replica, restored or not, writes the same bytes."""
        parts, touched = self._touched_parts, self.touched
        full = len(touched) // TOUCHED_CHUNK
        if len(parts) < full:
            rest = itertools.islice(touched, len(parts) * TOUCHED_CHUNK, None)
            while len(parts) < full:
                parts.append(unshared_pickle(list(itertools.islice(rest, TOUCHED_CHUNK))))
        if len(touched) == full * TOUCHED_CHUNK:
            return list(parts)
        tail = list(itertools.islice(touched, full * TOUCHED_CHUNK, None))
        return [*parts, unshared_pickle(tail)]

    def __getstate__(self) -> tuple[Any, ...]:
        inflight = [] if SAVING.get() else \
            [(seq, r.index, r.tags) for seq, r in self.inflight.items()]
        hooked = DIGEST_HOOKED.get()
        touched: Any = self.touched
        if hooked is not None:                   # the state digest
            touched = {n: None for n in touched if n in hooked}
        elif TOUCHED_IN_PARTS.get():             # format 8
            touched = self.touched_parts()
        return (self.id, self.ttl, self.results, self.acked, self.dropped, touched,
                inflight, self.user, self.secret, self.opened)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        if len(state) == 7:                      # a checkpoint from before auth
            state = (*state, "", "")
        if len(state) == 9:                      # ... from before the open time
            state = (*state, 0.0)
        (self.id, self.ttl, self.results, self.acked, self.dropped, touched,
         inflight, self.user, self.secret, self.opened) = state
        if inflight:
            raise ValueError("a checkpoint cannot hold requests in flight")
        self.inflight = {}
        self._touched_parts = []
        if type(touched) is list:                # format 8: parts (touched_parts)
            self.touched = {}
            for part in touched:
                self.touched.update(dict.fromkeys(pickle.loads(part)))
            full = len(self.touched) // TOUCHED_CHUNK
            self._touched_parts = touched[:full]    # the same bytes it would make again
        else:                                    # a dict, as checkpoints wrote it before
            self.touched = touched


class ObjectRecord:
    __slots__ = ("name", "cls", "instance", "steps", "owner", "size", "runs", "measured_at")

    def __init__(self, name: str, cls: ClassVersion, instance: Any, owner: str = "") -> None:
        self.name = name
        self.cls = cls
        self.instance = instance
        self.steps = 0       # steps its calls spent since its size was last measured
        self.owner = owner   # the user that created it (its quotas count it)
        self.size = 0        # its state's size when last measured
        self.runs = 0        # runs of its calls so far in this process (readers' copies)
        self.measured_at = 0  # the log index of its last measure, if since made or loaded


@dataclass(frozen=True)
class PendingCall:
    """A call waiting at a checkpoint: re-run when the checkpoint is restored, and right
    after the checkpoint too if it was interrupted (see Checkpoints.take)."""

    index: int
    cmd: codec.Invoke
    tags: tuple[str, ...]
    deadline: float | None
    deadlines: tuple[float | None, ...]
    raw: bytes | None = None            # the command as the log holds it, if known

    def saved(self) -> tuple[Any, ...]:
        """How a checkpoint writes it (format 3): the command's log bytes when known, which
        pickle ~3x faster than the decoded command."""
        return (self.index, self.raw if self.raw is not None else self.cmd, self.tags,
                self.deadline, self.deadlines)

    @classmethod
    def load(cls, saved: tuple[Any, ...]) -> PendingCall:
        index, cmd, tags, deadline, deadlines = saved
        if type(cmd) is bytes:
            raw, cmd = cmd, codec.decode(cmd)
            if not isinstance(cmd, codec.Invoke):
                raise ValueError(f"a pending call at {index} is not an Invoke")
            return cls(index, cmd, tuple(tags), deadline, tuple(deadlines), raw)
        return cls(index, cmd, tuple(tags), deadline, tuple(deadlines))
