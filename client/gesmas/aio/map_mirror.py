"""The asyncio client's Map mirror (``await m.mirror(prefix)``): the sync mirror's state,
reads and load (``gesmas.client.map_mirror``, whose text says what it holds and when), with
its watch on a task of the event loop and awaited writes."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gesmas.client.errors import Compacted
from gesmas.client.mirror_core import Listener, Loaded, MirrorCore

if TYPE_CHECKING:
    from gesmas.aio.proxies import MapProxy

__all__ = ["AsyncMapMirror"]


async def _load_async(core: MirrorCore, read: Callable[[str, tuple[Any, ...]], Any]
                      ) -> Loaded:
    """``map_mirror._load`` with an awaited ``read``."""
    steps = core._load_steps()
    try:
        step = next(steps)
        while True:
            try:
                got = await read(*step)
            except Exception as e:
                step = steps.throw(e)
            else:
                step = steps.send(got)
    except StopIteration as done:
        result: Loaded = done.value
        return result


class AsyncMapMirror(MirrorCore):
    """``MapMirror`` for the asyncio client (``await m.mirror(prefix)``): the same reads,
    plain calls; ``await put``, ``await delete``, ``await wait``; the watch runs on a task
    of the loop, and listeners are called on it. ``await close()`` (or ``async with``)."""

    def __init__(self, proxy: MapProxy, prefix: str = "", *, page: int = 1000,
                 consistency: str | None = None) -> None:
        super().__init__(proxy.object_name, prefix, page)
        self._proxy = proxy
        self._consistency = consistency
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _start(self) -> AsyncMapMirror:
        self._data, self._revision, self._created = await _load_async(self, self._read)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def put(self, key: str, value: Any, ephemeral: bool = False) -> Any:
        self._check(key)
        result = await self._proxy.put(key, value, ephemeral)
        await self.wait(result["revision"])
        return result

    async def delete(self, key: str) -> bool:
        self._check(key)
        got = await self._proxy.txn([], [["delete", key]])
        deleted = bool(got["results"][0]["deleted"])
        if deleted:
            await self.wait(got["revision"])
        return deleted

    async def wait(self, revision: int, timeout: float | None = None) -> bool:
        if type(revision) is not int:
            raise TypeError(f"revision must be an int, not {revision!r:.60}")
        if asyncio.current_task() is self._task:
            raise RuntimeError("a mirror's listener cannot wait for the mirror (it runs on "
                               "the task that brings the changes)")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self._live()
            if self._revision >= revision:
                return True
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def listen(self, listener: Listener) -> None:
        self._add_listener(listener)

    async def close(self) -> None:
        self._closed = True
        self._changed.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> AsyncMapMirror:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read(self, method: str, args: tuple[Any, ...]) -> Any:
        return await self._proxy._read(method, *args, consistency=self._consistency)

    async def _run(self) -> None:
        proxy = self._proxy
        while True:                      # without get-or-create, as the sync mirror's
            answers = proxy.client._follow(
                proxy.class_name, proxy.object_name, "watch", (self.prefix,),
                self._follows(), "after_revision", "revision", None, None,
                self._consistency)
            try:
                async for got in answers:
                    applied = self._answer(got)
                    self._changed.set()
                    self._tell(list(self._listeners), applied)
                return
            except Compacted:
                try:
                    data, revision, _ = await _load_async(self, self._read)
                except Exception as e:
                    self._stop(e)
                    return
                changes = self._replace(data, revision)
                self._changed.set()
                self._tell(list(self._listeners), changes)
            except Exception as e:
                self._stop(e)
                return
            finally:
                await answers.aclose()          # type: ignore[attr-defined]

    def _stop(self, e: BaseException) -> None:
        self._fail(e)
        self._changed.set()
