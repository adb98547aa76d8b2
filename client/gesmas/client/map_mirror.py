"""A Map's entries under a prefix, held in the client and kept current by one watch stream
(``MapProxy.mirror``): reads of configuration, registries and flags without a round trip.

Configuration and feature flags are read far more often than they change. A read through
the cluster costs a gRPC round trip (~0.5 ms on a quiet host, more under load); a mirror
answers from a dict, and pays one watch answer per change instead (ZooKeeper users keep
such a copy with Curator's caches, Kubernetes with its informers: list, then watch from the
list's revision).

Loading. The entries are read by pages (``items``), each page at the revision the replica
had then. Every change made since the first page's revision is then replayed in order (the
whole map's changes, which the map keeps: ``watch("", r)`` answers at once while there are
some after r), up to the last page's revision or later: a key changed meanwhile ends with
its last change, one not changed has the value every page saw, so the mirror holds the
map's state at one revision, restricted to the prefix. It then follows ``watch(prefix)``
from there. A map that no longer keeps the first page's revision (``Compacted``, a busy
map read slowly) is read again, and so is one deleted and made again between the pages
(they name the map they come from: its ``created``).

What a reader sees: a state the map had (each answer of the watch ends at a revision's
end), never older than one seen before (monotonic), a few milliseconds behind the cluster
(a change's watch answer). A write through the mirror (``put``, ``delete``) returns once
the mirror holds it (read your writes). Failover is the watch stream's: it follows again
from its last revision elsewhere, missing nothing; if the mirror falls so far behind that
the map no longer keeps its revision (``history``), it reads the map again, and tells its
listeners what changed meanwhile.

A mirror ends with ``close`` (or its client's close); reads of a closed mirror raise
ValueError, reads of one whose watch failed raise that error: its session expired, a
permission taken away, the map deleted (NotFound) or deleted and made again (``Replaced``:
the watch names the map it follows by its ``created``, so a new map of the same name is
never taken for it). ``MapMirror`` runs its watch on a thread
of its own; the asyncio client's (``gesmas.aio.map_mirror.AsyncMapMirror``) on a task,
with the same reads and awaited writes.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gesmas.client.errors import Compacted
from gesmas.client.mirror_core import (LOAD_ATTEMPTS, WATCH_LIMIT, Listener, Loaded,
                                       MirrorCore)
from gesmas.client.streams import FollowHandle

if TYPE_CHECKING:
    from gesmas.client.proxies import MapProxy

__all__ = ["LOAD_ATTEMPTS", "WATCH_LIMIT", "MapMirror", "MirrorCore"]


def _load(core: MirrorCore, read: Callable[[str, tuple[Any, ...]], Any]) -> Loaded:
    """A load (``MirrorCore._load_steps``) with ``read`` answering its reads."""
    steps = core._load_steps()
    try:
        step = next(steps)
        while True:
            try:
                got = read(*step)
            except Exception as e:
                step = steps.throw(e)
            else:
                step = steps.send(got)
    except StopIteration as done:
        result: Loaded = done.value
        return result


class MapMirror(MirrorCore):
    """The entries of a Map under ``prefix``, in this process, current within a watch
    answer's delay (see the module's text). Reads: ``get``, ``entry``, ``keys``,
    ``items``, ``m[key]``, ``key in m``, ``len(m)``, ``revision``; writes that the mirror
    holds when they return: ``put``, ``delete``; ``wait(revision)``; ``listen(fn)``: ``fn``
    is called with each change after the mirror holds it. A context manager (``close``).
    Reads are safe from any thread."""

    def __init__(self, proxy: MapProxy, prefix: str = "", *, page: int = 1000,
                 consistency: str | None = None) -> None:
        super().__init__(proxy.object_name, prefix, page)
        self._proxy = proxy
        self._consistency = consistency
        self._cond = threading.Condition()
        self._handle = FollowHandle()
        self._data, self._revision, self._created = _load(self, self._read)  # errors: raised
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"gesmas-mirror-{self.name}")
        self._thread.start()

    def _locked(self) -> AbstractContextManager[Any]:
        return self._cond

    def put(self, key: str, value: Any, ephemeral: bool = False) -> Any:
        """The map's ``put`` ({"revision", "version"}), returned once the mirror holds it."""
        self._check(key)
        result = self._proxy.put(key, value, ephemeral)
        self.wait(result["revision"])
        return result

    def delete(self, key: str) -> bool:
        """The map's ``delete``, returned once the mirror holds it (one transaction, which
        names the delete's revision)."""
        self._check(key)
        got = self._proxy.txn([], [["delete", key]])
        deleted = bool(got["results"][0]["deleted"])
        if deleted:
            self.wait(got["revision"])
        return deleted

    def wait(self, revision: int, timeout: float | None = None) -> bool:
        """Wait until the mirror holds ``revision``, the revision of a change under its
        prefix (a put's or a transaction's answer: a change elsewhere in the map never
        reaches it); False after ``timeout``."""
        if type(revision) is not int:
            raise TypeError(f"revision must be an int, not {revision!r:.60}")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a mirror's listener cannot wait for the mirror (it runs on "
                               "the thread that brings the changes)")
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._live()
                if self._revision >= revision:
                    return True
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)

    def listen(self, listener: Listener) -> None:
        """Call ``listener(event)`` for each change after the mirror holds it, on the
        mirror's thread, in order: {"revision", "type" ("put" or "delete"), "key", "value",
        "version"}. One that raises is logged and goes on being called. After a reload
        (the mirror fell behind what the map keeps) it is told what differs."""
        with self._cond:
            self._add_listener(listener)

    def close(self) -> None:
        """End the watch; later reads raise ValueError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._handle.stop()

    def __enter__(self) -> MapMirror:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, method: str, args: tuple[Any, ...]) -> Any:
        return self._proxy._read(method, *args, consistency=self._consistency)

    def _run(self) -> None:
        proxy = self._proxy
        while True:
            try:
                # followed without the proxy's get-or-create: the load made the map, and a
                # map deleted meanwhile ends the mirror (NotFound); one made again, Replaced
                answers = proxy.client._follow(
                    proxy.class_name, proxy.object_name, "watch", (self.prefix,),
                    self._follows(), "after_revision", "revision", None, None,
                    self._consistency, self._handle)
                for got in answers:
                    with self._cond:
                        applied = self._answer(got)
                        listeners = list(self._listeners)
                        self._cond.notify_all()
                    self._tell(listeners, applied)
                return                            # closed
            except Compacted:                     # fell behind what the map keeps
                if self._handle.stopped:
                    return
                try:
                    data, revision, _ = _load(self, self._read)   # the same map, or raised
                except BaseException as e:
                    self._stop(e)
                    return
                with self._cond:
                    changes = self._replace(data, revision)
                    listeners = list(self._listeners)
                    self._cond.notify_all()
                self._tell(listeners, changes)
            except BaseException as e:
                self._stop(e)
                return

    def _stop(self, e: BaseException) -> None:
        with self._cond:
            self._fail(e)
            self._cond.notify_all()
