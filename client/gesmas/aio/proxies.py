"""The asyncio client's object proxies: ``await proxy.method(...)`` invokes the method; the
lock and semaphore proxies are async context managers, a readers-writer lock's ``read()``
and ``write()`` too (``gesmas.aio.Client`` makes them). What the sync proxies offer as
properties that call the server (a barrier's ``parties``, ``n_waiting``, ``broken``) are
awaited methods here: ``await barrier.parties()``."""
from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from gesmas.client.errors import Timeout, queue_timeout
from gesmas.client.proxies import Fence, FencedHold, Hold, blocking_flag
from gesmas.aio.map_mirror import AsyncMapMirror

if TYPE_CHECKING:  # pragma: no cover
    from gesmas.aio import Client

__all__ = ["BarrierProxy", "LeaderElectionProxy", "LockProxy", "MapProxy", "ObjectProxy",
           "QueueProxy",
           "ReadWriteLockProxy", "SemaphoreProxy", "PROXIES"]


class ObjectProxy:
    """A named object; ``await proxy.method(*args, timeout=None, **kwargs)``."""

    def __init__(self, client: Client, class_name: str, object_name: str,
                 create: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> None:
        self.client = client
        self.class_name = class_name
        self.object_name = object_name
        self._create = create

    def __repr__(self) -> str:
        return f"<aio {type(self).__name__} {self.class_name} {self.object_name!r}>"

    async def invoke(self, method: str, /, *args: Any, timeout: float | None = None,
                     **kwargs: Any) -> Any:
        return await self.client._invoke(self.class_name, self.object_name, method, args,
                                         kwargs, timeout, self._create)

    def follow(self, method: str, argument: str, key: str, /, *args: Any,
               timeout: float | None = None, consistency: str | None = None,
               **kwargs: Any) -> AsyncIterator[Any]:
        """As the sync proxy's: ``async for answer in proxy.follow(...)``."""
        return self.client._follow(self.class_name, self.object_name, method, args, kwargs,
                                   argument, key, timeout, self._create, consistency)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
            return await self.invoke(method, *args, timeout=timeout, **kwargs)

        call.__name__ = call.__qualname__ = method
        return call


class QueueProxy(ObjectProxy):
    """A Queue; timeouts as the sync proxy's: ``QueueEmpty`` (also ``queue.Empty``) for
    ``consume`` / ``reserve``, ``QueueFull`` (also ``queue.Full``) for ``produce``."""

    async def invoke(self, method: str, /, *args: Any, timeout: float | None = None,
                     **kwargs: Any) -> Any:
        try:
            return await super().invoke(method, *args, timeout=timeout, **kwargs)
        except Timeout as e:
            error = queue_timeout(method, e)
            if error is e:
                raise
            raise error from None


class LockProxy(FencedHold, ObjectProxy):
    """``async with c.lock(name) as fence:`` acquires, yields the fencing token, releases.
    ``held`` / ``fence.held``: whether the hold is still sure (as the sync proxy's)."""

    async def acquire(self, blocking: bool = True, timeout: float | None = None
                      ) -> Fence | Literal[False]:
        """The fencing token; ``acquire(False)`` does not wait and answers False if the lock
        is taken (as the sync proxy's)."""
        if not blocking_flag(blocking, timeout):
            fence = await self.try_acquire()
            return False if fence is None else fence
        return await self._acquire(timeout)

    async def _acquire(self, timeout: float | None) -> Fence:
        fence: Fence = self._took(await self.invoke("acquire", timeout=timeout))
        return fence

    async def try_acquire(self) -> Fence | None:
        fence: Fence | None = self._took(await self.invoke("try_acquire"))
        return fence

    async def release(self) -> None:
        if self.fence is not None:
            self.fence.hold.released = True
        await self.invoke("release")

    async def locked(self) -> bool:
        """Whether any session holds the lock."""
        return await self.invoke("holder") is not None

    async def __aenter__(self) -> Fence:
        return await self._acquire(None)

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class SemaphoreProxy(ObjectProxy):
    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> Any:
        """As the sync proxy's: ``acquire(False)`` answers True or False without waiting."""
        if not blocking_flag(blocking, timeout):
            return bool(await self.invoke("try_acquire"))
        return await self.invoke("acquire", timeout=timeout)

    async def release(self, n: int = 1) -> None:
        await self.invoke("release", n)

    async def __aenter__(self) -> Any:
        return await self.invoke("acquire")

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class BarrierProxy(ObjectProxy):
    """threading.Barrier's interface, awaited: ``wait``, ``abort``, ``reset``, and
    ``parties()``, ``n_waiting()``, ``broken()`` (one call each)."""

    async def wait(self, timeout: float | None = None) -> int:
        index: int = await self.invoke("wait", timeout=timeout)
        return index

    async def abort(self) -> None:
        await self.invoke("abort")

    async def reset(self) -> None:
        await self.invoke("reset")

    async def parties(self) -> int:
        n: int = await self.invoke("size")
        return n

    async def n_waiting(self) -> int:
        n: int = await self.invoke("n_waiting")
        return n

    async def broken(self) -> bool:
        return bool(await self.invoke("broken"))


class ReadWriteLockProxy(ObjectProxy):
    """``async with rw.read(): ...`` (shared) and ``async with rw.write(): ...``
    (exclusive), as the sync proxy's ``with``."""

    @asynccontextmanager
    async def read(self, timeout: float | None = None) -> AsyncIterator[Any]:
        token = await self.invoke("acquire_read", timeout=timeout)
        try:
            yield token
        finally:
            await self.invoke("release_read")

    @asynccontextmanager
    async def write(self, timeout: float | None = None) -> AsyncIterator[Any]:
        token = await self.invoke("acquire_write", timeout=timeout)
        try:
            yield token
        finally:
            await self.invoke("release_write")


class LeaderElectionProxy(ObjectProxy):
    """``await campaign(value)`` / ``resign()``; ``leading`` says whether this client still
    surely leads (as the sync proxy's)."""

    _hold: Hold | None = None

    async def campaign(self, value: Any = None, timeout: float | None = None) -> Fence:
        """The term, as a ``Fence`` (as the sync proxy's)."""
        won = await self.invoke("campaign", value, timeout=timeout)
        self._hold = Hold(self.client.lease)
        return Fence(won["term"], self._hold)

    async def resign(self) -> Any:
        if self._hold is not None:
            self._hold.released = True
        return await self.invoke("resign")

    @property
    def leading(self) -> bool:
        return self._hold is not None and self._hold.held

    async def leader(self) -> Any:
        """{"session", "value", "term"} of the current leader, or None."""
        return await self.invoke("leader")

    async def observe(self, known_term: Any = None, timeout: float | None = None) -> Any:
        """Wait until the leadership differs from ``known_term``; returns the new one."""
        return await self.invoke("observe", known_term, timeout=timeout)

    async def watch(self, known_term: Any = None, timeout: float | None = None) -> Any:
        """``observe`` that also names the term of a vacancy: {"term", "leader"}."""
        return await self.invoke("watch", known_term, timeout=timeout)


class MapProxy(ObjectProxy):
    """A Map, as the sync proxy's (gesmas.client.proxies.MapProxy): the reads take
    ``consistency=``; ``watch(prefix)`` without a revision waits for a change after now;
    ``async for event in m.watch_iter(prefix)`` yields every change."""

    async def _read(self, method: str, *args: Any, consistency: str | None = None,
                    timeout: float | None = None) -> Any:
        return await self.client._invoke(self.class_name, self.object_name, method, args,
                                         {}, timeout, self._create, consistency)

    async def get(self, key: str, default: Any = None, *,
                  consistency: str | None = None) -> Any:
        return await self._read("get", key, default, consistency=consistency)

    async def entry(self, key: str, *, consistency: str | None = None) -> Any:
        return await self._read("entry", key, consistency=consistency)

    async def items(self, prefix: str = "", limit: int = 100, start_after: str = "", *,
                    consistency: str | None = None) -> Any:
        return await self._read("items", prefix, limit, start_after, consistency=consistency)

    async def keys(self, prefix: str = "", limit: int = 100, start_after: str = "", *,
                   consistency: str | None = None) -> Any:
        return await self._read("keys", prefix, limit, start_after, consistency=consistency)

    async def revision(self, *, consistency: str | None = None) -> int:
        rev: int = await self._read("revision", consistency=consistency)
        return rev

    async def size(self, *, consistency: str | None = None) -> int:
        n: int = await self._read("size", consistency=consistency)
        return n

    async def put(self, key: str, value: Any, ephemeral: bool = False) -> Any:
        return await self.invoke("put", key, value, ephemeral)

    async def delete(self, key: str) -> bool:
        return bool(await self.invoke("delete", key))

    async def cas(self, key: str, expect_version: int, value: Any) -> bool:
        return bool(await self.invoke("cas", key, expect_version, value))

    async def txn(self, compares: Sequence[Any], success: Sequence[Any],
                  failure: Sequence[Any] = ()) -> Any:
        return await self.invoke("txn", list(compares), list(success), list(failure))

    async def stat(self, *, consistency: str | None = None) -> Any:
        return await self._read("stat", consistency=consistency)

    async def _from(self, after_revision: int | None, created: int | None,
                    consistency: str | None) -> tuple[int, tuple[int, ...]]:
        """As the sync proxy's: a watch's start, and its ``created`` argument if any."""
        if after_revision is None:
            st = await self.stat(consistency=consistency)
            after_revision = st["revision"]
            if created is None:
                created = st["created"]
        return after_revision, () if created is None else (created,)

    async def watch(self, prefix: str = "", after_revision: int | None = None, *,
                    limit: int = 1000, timeout: float | None = None,
                    consistency: str | None = None, created: int | None = None) -> Any:
        after_revision, more = await self._from(after_revision, created, consistency)
        return await self._read("watch", prefix, after_revision, limit, *more,
                                consistency=consistency, timeout=timeout)

    async def watch_stream(self, prefix: str = "", after_revision: int | None = None, *,
                           limit: int = 1000, timeout: float | None = None,
                           consistency: str | None = None,
                           created: int | None = None) -> AsyncIterator[Any]:
        """As the sync proxy's: every ``watch`` answer after ``after_revision`` (None: now),
        one followed call that the replica answers at each change."""
        after_revision, more = await self._from(after_revision, created, consistency)
        extra = {"created": more[0]} if more else {}
        answers = self.follow("watch", "after_revision", "revision", prefix, limit=limit,
                              after_revision=after_revision, timeout=timeout,
                              consistency=consistency, **extra)
        try:
            async for got in answers:
                yield got
        finally:
            await answers.aclose()          # type: ignore[attr-defined]

    async def watch_iter(self, prefix: str = "", after_revision: int | None = None, *,
                         timeout: float | None = None,
                         created: int | None = None) -> AsyncIterator[Any]:
        answers = self.watch_stream(prefix, after_revision, timeout=timeout, created=created)
        try:
            async for got in answers:
                for event in got["events"]:
                    yield event
        finally:
            await answers.aclose()          # type: ignore[attr-defined]

    async def mirror(self, prefix: str = "", *, page: int = 1000,
                     consistency: str | None = None) -> AsyncMapMirror:
        """As the sync proxy's: the entries under ``prefix`` held here, kept current by a
        watch on a task of the loop (``gesmas.aio.map_mirror.AsyncMapMirror``); loaded when it
        returns; ``await close()`` ends it."""
        return await AsyncMapMirror(self, prefix, page=page, consistency=consistency)._start()


PROXIES: dict[str, type[ObjectProxy]] = {"Queue": QueueProxy, "Lock": LockProxy,
                                         "Semaphore": SemaphoreProxy,
                                         "Barrier": BarrierProxy,
                                         "ReadWriteLock": ReadWriteLockProxy,
                                         "LeaderElection": LeaderElectionProxy,
                                         "Map": MapProxy}
