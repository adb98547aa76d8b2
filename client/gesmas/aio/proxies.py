"""The asyncio client's object proxies: ``await proxy.method(...)`` invokes the method; the
lock and semaphore proxies are async context managers (``gesmas.aio.Client`` makes them)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from gesmas.client.errors import Timeout, queue_timeout
from gesmas.client.proxies import Fence, FencedHold, Hold, blocking_flag

if TYPE_CHECKING:  # pragma: no cover
    from gesmas.aio import Client

__all__ = ["BarrierProxy", "LeaderElectionProxy", "LockProxy", "ObjectProxy", "QueueProxy",
           "SemaphoreProxy", "PROXIES"]


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
    async def wait(self, timeout: float | None = None) -> int:
        index: int = await self.invoke("wait", timeout=timeout)
        return index


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


PROXIES: dict[str, type[ObjectProxy]] = {"Queue": QueueProxy, "Lock": LockProxy, "Semaphore": SemaphoreProxy,
                                         "Barrier": BarrierProxy,
                                         "LeaderElection": LeaderElectionProxy}
