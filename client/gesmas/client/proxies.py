"""Object proxies: a named object on the cluster as a Python object whose methods are remote
calls (``Client.object`` and the typed factories such as ``Client.lock`` return them).

A lock proxy remembers the hold it took (``Hold``: the fencing token and the session's
lease) and says whether it is still surely held: ``lock.held`` is False once the session is
lost (past its ``valid_until``, or the server said it is gone) or the lock released; the
fence that ``with c.lock(name) as fence`` gives is an ``int`` that can tell the same
(``fence.held``, ``fence.valid_until``). An election proxy does the same for leadership.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from gesmas.client.errors import NotFound, Timeout, queue_timeout
from gesmas.client.map_mirror import MapMirror

if TYPE_CHECKING:
    from gesmas.client.client import Client
    from gesmas.client.session import Lease

__all__ = [
    "PROXIES",
    "Fence",
    "FencedHold",
    "Hold",
    "LeaderElectionProxy",
    "LockProxy",
    "MapProxy",
    "ObjectProxy",
    "QueueProxy",
    "ReadWriteLockProxy",
    "SemaphoreProxy",
    "blocking_flag",
]


class ObjectProxy:
    """A named object on the cluster. Any public method is invoked remotely:
    ``proxy.method(*args, timeout=None, **kwargs)``. ``timeout`` is reserved: it bounds how
    long the call may wait (None: no limit, 0: do not wait) and is not passed to the method.
    """

    def __init__(self, client: Client, class_name: str, object_name: str,
                 create: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> None:
        self.client = client
        self.class_name = class_name
        self.object_name = object_name
        self._create = create      # constructor arguments: each call is a get-or-create

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.class_name} {self.object_name!r}>"

    def invoke(self, method: str, /, *args: Any, timeout: float | None = None,
               **kwargs: Any) -> Any:
        """Invoke ``method`` by name (also for methods whose name a proxy attribute hides)."""
        return self.client._invoke(self.class_name, self.object_name, method, args, kwargs,
                                   timeout, self._create)

    def follow(self, method: str, argument: str, key: str, /, *args: Any,
               timeout: float | None = None, consistency: str | None = None,
               **kwargs: Any) -> Iterator[Any]:
        """The answers of the declared reader ``method`` (in its class's ``_readers``), for
        ever: each next one is the call again with the keyword ``argument`` set to the
        previous answer's ``key`` (the answer is a dict). The replica runs it again by
        itself (one message per answer); the cursor must move at each answer. ``timeout``
        bounds each wait; the first call passes ``kwargs[argument]`` if given."""
        return self.client._follow(self.class_name, self.object_name, method, args, kwargs,
                                   argument, key, timeout, self._create, consistency)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            return self.invoke(method, *args, timeout=timeout, **kwargs)

        call.__name__ = call.__qualname__ = method
        return call

    def __len__(self) -> int:
        """``len(proxy)``: the remote object's ``__len__`` (one call); TypeError if its class
        has none."""
        try:
            n = self.invoke("__len__")
        except NotFound as e:
            if "has no method '__len__'" not in e.message:
                raise
            raise TypeError(f"{self.class_name} objects have no len() (the class defines no "
                            f"__len__)") from None
        if type(n) is not int or n < 0:
            raise TypeError(f"{self.class_name}.__len__ returned {n!r}, not an int >= 0")
        return n

    def __bool__(self) -> bool:          # a proxy is true, whatever its object's len()
        return True


def blocking_flag(blocking: Any, timeout: float | None) -> bool:
    """``acquire(blocking, timeout)``'s first argument as threading takes it: True waits (up
    to ``timeout``), False does not wait and answers False if it cannot take at once.
    A number other than 0 or 1 is refused rather than taken for a timeout."""
    if type(blocking) is not bool and not (type(blocking) is int and blocking in (0, 1)):
        raise TypeError(f"blocking must be True or False, not {blocking!r} (a timeout "
                        f"goes by name: acquire(timeout={blocking!r}))")
    if not blocking and timeout is not None:
        raise ValueError("can't specify a timeout for a non-blocking call")
    return bool(blocking)


class QueueProxy(ObjectProxy):
    """A Queue; ``consume`` / ``reserve`` that time out raise ``QueueEmpty`` (also
    ``queue.Empty``), a ``produce`` on a full bounded queue ``QueueFull`` (also
    ``queue.Full``): both are ``Timeout``, as ``queue.Queue`` users expect."""

    def invoke(self, method: str, /, *args: Any, timeout: float | None = None,
               **kwargs: Any) -> Any:
        try:
            return super().invoke(method, *args, timeout=timeout, **kwargs)
        except Timeout as e:
            error = queue_timeout(method, e)
            if error is e:
                raise
            raise error from None


class Hold:
    """A hold taken in a session (a lock grant, a leadership): surely held while the
    session's lease is not lost and the hold not given up. No round trip."""

    def __init__(self, lease: Lease | None) -> None:
        self.lease = lease
        self.released = False

    @property
    def held(self) -> bool:
        lease = self.lease
        return (not self.released and lease is not None
                and lease.state(time.monotonic()) != "lost")

    @property
    def valid_until(self) -> float | None:
        """Until when (``time.monotonic()``) the hold is sure; None once it is not."""
        return self.lease.valid_until if self.held and self.lease is not None else None


class Fence(int):
    """A fencing token (an ``int``) that also tells whether its hold is still sure."""

    hold: Hold

    def __new__(cls, value: int, hold: Hold) -> Fence:
        fence = super().__new__(cls, value)
        fence.hold = hold
        return fence

    @property
    def held(self) -> bool:
        return self.hold.held

    @property
    def valid_until(self) -> float | None:
        return self.hold.valid_until

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickled or copied (to another process, say), a fence is its number: the hold it
        # reports on is this client's live session
        return (int, (int(self),))


class FencedHold:
    """What a lock proxy, sync or asyncio, knows of its hold: the last fencing token it got
    (``fence``), whether the hold is still sure (``held``) and until when (``valid_until``).
    The proxy passes each acquire's answer through ``_took``."""

    fence: Fence | None = None
    client: Any

    def _took(self, value: Any) -> Any:
        if value is None:
            return None
        self.fence = Fence(value, Hold(self.client.lease))
        return self.fence

    @property
    def held(self) -> bool:
        return self.fence is not None and self.fence.held

    @property
    def valid_until(self) -> float | None:
        return self.fence.valid_until if self.fence is not None else None


class LockProxy(FencedHold, ObjectProxy):
    """``with client.lock(name) as fence:`` acquires, yields the fencing token, releases.

    ``held`` says whether this client still surely holds the lock (no round trip: False
    once released, or once the session is lost, which happens before the server can
    expire it and grant the lock to another); ``fence`` is the last token it got."""

    def acquire(self, blocking: bool = True, timeout: float | None = None
                ) -> Fence | Literal[False]:
        """Take the lock; returns the fencing token (the log index of the grant), waiting up
        to ``timeout`` (None: for ever; Timeout after it). ``acquire(False)`` (or
        ``blocking=False``) does not wait: the token, or False if the lock is taken, as
        ``threading.Lock.acquire(False)`` answers."""
        if not blocking_flag(blocking, timeout):
            fence = self.try_acquire()
            return False if fence is None else fence
        return self._acquire(timeout)

    def _acquire(self, timeout: float | None) -> Fence:
        fence: Fence = self._took(self.invoke("acquire", timeout=timeout))
        return fence

    def try_acquire(self) -> Fence | None:
        """The fencing token if the lock was free, else None, without waiting."""
        fence: Fence | None = self._took(self.invoke("try_acquire"))
        return fence

    def release(self) -> None:
        if self.fence is not None:
            self.fence.hold.released = True
        self.invoke("release")

    def is_owner(self) -> bool:
        return bool(self.invoke("is_owner"))

    def locked(self) -> bool:
        """Whether any session holds the lock (``threading.Lock.locked()``)."""
        return self.invoke("holder") is not None

    def __enter__(self) -> Fence:
        return self._acquire(None)

    def __exit__(self, *exc: object) -> None:
        self.release()


class SemaphoreProxy(ObjectProxy):
    """``with client.semaphore(name, permits=4): ...`` holds one permit."""

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> Any:
        """Take a permit, waiting up to ``timeout``: the permits this session now holds (an
        owned semaphore) or True. ``acquire(False)`` does not wait: True or False, as
        ``threading.Semaphore.acquire(False)`` answers."""
        if not blocking_flag(blocking, timeout):
            return bool(self.invoke("try_acquire"))
        return self.invoke("acquire", timeout=timeout)

    def release(self, n: int = 1) -> None:
        self.invoke("release", n)

    def __enter__(self) -> Any:
        return self.invoke("acquire")

    def __exit__(self, *exc: object) -> None:
        self.invoke("release")


class BarrierProxy(ObjectProxy):
    """threading.Barrier's interface: ``wait(timeout=None)``, ``abort()``, ``reset()`` and
    the properties ``parties``, ``n_waiting``, ``broken`` (each a call)."""

    def wait(self, timeout: float | None = None) -> int:
        index: int = self.invoke("wait", timeout=timeout)
        return index

    def abort(self) -> None:
        self.invoke("abort")

    def reset(self) -> None:
        self.invoke("reset")

    @property
    def parties(self) -> int:
        n: int = self.invoke("size")
        return n

    @property
    def n_waiting(self) -> int:
        n: int = self.invoke("n_waiting")
        return n

    @property
    def broken(self) -> bool:
        return bool(self.invoke("broken"))


class ReadWriteLockProxy(ObjectProxy):
    """``with rw.read(): ...`` (shared) and ``with rw.write(): ...`` (exclusive)."""

    @contextmanager
    def read(self, timeout: float | None = None) -> Iterator[Any]:
        token = self.invoke("acquire_read", timeout=timeout)
        try:
            yield token
        finally:
            self.invoke("release_read")

    @contextmanager
    def write(self, timeout: float | None = None) -> Iterator[Any]:
        token = self.invoke("acquire_write", timeout=timeout)
        try:
            yield token
        finally:
            self.invoke("release_write")


class LeaderElectionProxy(ObjectProxy):
    """Campaign to lead, resign, ask who leads, or wait for a change. ``leading`` says
    whether this client still surely leads (as ``LockProxy.held``)."""

    _hold: Hold | None = None

    def campaign(self, value: Any = None, timeout: float | None = None) -> Fence:
        """Block until this session leads (or ``timeout``); ``value`` is published. Returns
        the term (the log index of the election, strictly increasing: a fencing token), as
        a ``Fence`` that also tells whether the leadership is still sure."""
        won = self.invoke("campaign", value, timeout=timeout)
        self._hold = Hold(self.client.lease)
        return Fence(won["term"], self._hold)

    def resign(self) -> Any:
        if self._hold is not None:
            self._hold.released = True
        return self.invoke("resign")

    @property
    def leading(self) -> bool:
        return self._hold is not None and self._hold.held

    def leader(self) -> Any:
        return self.invoke("leader")

    def observe(self, known_term: Any = None, timeout: float | None = None) -> Any:
        """Block until the leadership differs from ``known_term``; returns the new one."""
        return self.invoke("observe", known_term, timeout=timeout)

    def watch(self, known_term: Any = None, timeout: float | None = None) -> Any:
        """``observe`` that also names the term of a vacancy: {"term", "leader"} (leader as
        ``leader()`` answers, None while nobody leads), at once if the term differs from
        ``known_term``, else at the next change. Pass the term it gave to wait again."""
        return self.invoke("watch", known_term, timeout=timeout)


class MapProxy(ObjectProxy):
    """A Map: a key-value map with versions, a map-wide revision, cas, transactions,
    ephemeral entries and watches (objects/kvmap.py says what each call answers).

    The reads (``get``, ``entry``, ``items``, ``keys``, ``size``, ``revision``, ``watch``)
    take no log entry; each takes ``consistency=`` ("linearizable" or "sequential") to
    override the client's. ``watch(prefix)`` without a revision waits for the next change
    after now; ``watch_iter(prefix)`` yields every change, one event at a time, for ever.
    As a dict: ``m[key]`` (KeyError when missing), ``m[key] = value``, ``del m[key]``
    (KeyError when missing), ``key in m``, ``len(m)``: one call each."""

    def _read(self, method: str, *args: Any, consistency: str | None = None,
              timeout: float | None = None) -> Any:
        return self.client._invoke(self.class_name, self.object_name, method, args, {},
                                   timeout, self._create, consistency)

    def get(self, key: str, default: Any = None, *, consistency: str | None = None) -> Any:
        return self._read("get", key, default, consistency=consistency)

    def entry(self, key: str, *, consistency: str | None = None) -> Any:
        """{"value", "version", "create_revision", "mod_revision", "ephemeral"} or None."""
        return self._read("entry", key, consistency=consistency)

    def items(self, prefix: str = "", limit: int = 100, start_after: str = "", *,
              consistency: str | None = None) -> Any:
        """One page: {"items": [{"key", "value", "version", "mod_revision"}], "more",
        "revision"}; the next page starts after the last key."""
        return self._read("items", prefix, limit, start_after, consistency=consistency)

    def keys(self, prefix: str = "", limit: int = 100, start_after: str = "", *,
             consistency: str | None = None) -> Any:
        return self._read("keys", prefix, limit, start_after, consistency=consistency)

    def revision(self, *, consistency: str | None = None) -> int:
        rev: int = self._read("revision", consistency=consistency)
        return rev

    def size(self, *, consistency: str | None = None) -> int:
        n: int = self._read("size", consistency=consistency)
        return n

    def put(self, key: str, value: Any, ephemeral: bool = False) -> Any:
        """{"revision", "version"}; ``ephemeral``: deleted when this client's session ends."""
        return self.invoke("put", key, value, ephemeral)

    def __getitem__(self, key: str) -> Any:
        e = self.entry(key)
        if e is None:
            raise KeyError(key)
        return e["value"]

    def __setitem__(self, key: str, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: str) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def __contains__(self, key: str) -> bool:
        return self.entry(key) is not None

    def __len__(self) -> int:
        return self.size()

    def delete(self, key: str) -> bool:
        return bool(self.invoke("delete", key))

    def cas(self, key: str, expect_version: int, value: Any) -> bool:
        """Put if the key's version is ``expect_version`` (0: only if it does not exist)."""
        return bool(self.invoke("cas", key, expect_version, value))

    def txn(self, compares: Sequence[Any], success: Sequence[Any],
            failure: Sequence[Any] = ()) -> Any:
        """{"succeeded", "revision", "results"}: ``success`` if every compare holds, else
        ``failure``; atomic, one log entry."""
        return self.invoke("txn", list(compares), list(success), list(failure))

    def stat(self, *, consistency: str | None = None) -> Any:
        """{"revision", "size", "created"}: ``created`` is the log index that made the map
        (another one once it is deleted and made again)."""
        return self._read("stat", consistency=consistency)

    def _from(self, after_revision: int | None, created: int | None,
              consistency: str | None) -> tuple[int, tuple[int, ...]]:
        """A watch's start: ``after_revision``, else now (with now's ``created``); and the
        ``created`` argument, if any."""
        if after_revision is None:
            st = self.stat(consistency=consistency)
            after_revision = st["revision"]
            if created is None:
                created = st["created"]
        return after_revision, () if created is None else (created,)

    def watch(self, prefix: str = "", after_revision: int | None = None, *,
              limit: int = 1000, timeout: float | None = None,
              consistency: str | None = None, created: int | None = None) -> Any:
        """{"revision", "events", "created"}: the changes under ``prefix`` after
        ``after_revision`` (None: after now), waiting up to ``timeout`` while there is none
        (Timeout after it). Watch again from the answer's "revision": nothing is missed or
        seen twice. A revision older than the map keeps raises ``Compacted`` (a
        LookupError); with ``created`` (that of the answer the revision came from; now's
        when ``after_revision`` is None), a map deleted and made again since raises
        ``Replaced`` (a LookupError)."""
        after_revision, more = self._from(after_revision, created, consistency)
        return self._read("watch", prefix, after_revision, limit, *more,
                          consistency=consistency, timeout=timeout)

    def watch_stream(self, prefix: str = "", after_revision: int | None = None, *,
                     limit: int = 1000, timeout: float | None = None,
                     consistency: str | None = None,
                     created: int | None = None) -> Iterator[Any]:
        """The answers ``watch`` would give, one after the other, for ever: every change
        under ``prefix`` after ``after_revision`` (None: now), in order, none twice. One
        watch call that the replica answers again at each change (a watch stream: no
        message to re-arm it); after a failure it goes on elsewhere from the last answer's
        revision. ``timeout`` bounds each wait (Timeout). ``created`` as for ``watch``: the
        stream ends with ``Replaced`` if the map is deleted and made again."""
        after_revision, more = self._from(after_revision, created, consistency)
        extra = {"created": more[0]} if more else {}
        return self.follow("watch", "after_revision", "revision", prefix, limit=limit,
                           after_revision=after_revision, timeout=timeout,
                           consistency=consistency, **extra)

    def watch_iter(self, prefix: str = "", after_revision: int | None = None, *,
                   timeout: float | None = None, created: int | None = None) -> Iterator[Any]:
        """Every change under ``prefix`` after ``after_revision`` (None: now), one event at
        a time, in order, for ever (``watch_stream``); ``timeout`` bounds each wait."""
        for got in self.watch_stream(prefix, after_revision, timeout=timeout,
                                     created=created):
            yield from got["events"]

    def mirror(self, prefix: str = "", *, page: int = 1000,
               consistency: str | None = None) -> MapMirror:
        """The entries under ``prefix`` held in this process and kept current by one watch
        stream (``map_mirror.MapMirror``): reads without a round trip, a few ms behind the
        cluster, never going back; its ``put`` and ``delete`` return once it holds them.
        Loaded before it returns (``page`` entries a call); ``close()`` ends it."""
        return MapMirror(self, prefix, page=page, consistency=consistency)


#: Standard class name -> proxy class that ``Client.object`` returns for it.
PROXIES: dict[str, type[ObjectProxy]] = {
    "Queue": QueueProxy,
    "Lock": LockProxy,
    "Semaphore": SemaphoreProxy,
    "Barrier": BarrierProxy,
    "ReadWriteLock": ReadWriteLockProxy,
    "LeaderElection": LeaderElectionProxy,
    "Map": MapProxy,
}
