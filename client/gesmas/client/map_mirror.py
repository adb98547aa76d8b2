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

import bisect
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gesmas.client.errors import Compacted, GesmasError, Replaced, Unavailable
from gesmas.client.streams import FollowHandle

if TYPE_CHECKING:
    from gesmas.client.proxies import MapProxy

__all__ = ["LOAD_ATTEMPTS", "WATCH_LIMIT", "MapMirror", "MirrorCore"]

_log = logging.getLogger("gesmas.client")

#: Events per watch answer the mirror asks for (the map's own cap per answer is 100,000).
WATCH_LIMIT = 1000
#: Attempts at a consistent load before the last Compacted is raised.
LOAD_ATTEMPTS = 5


Entry = tuple[Any, int, int]             # value, version, mod_revision
Event = dict[str, Any]
Listener = Callable[[Event], None]
#: A step of loading: (a Map reader's name, its arguments), answered by the caller.
Read = tuple[str, tuple[Any, ...]]
#: What a load gives: the entries under the prefix, their revision, the map's `created`.
Loaded = tuple[dict[str, Entry], int, int]


class MirrorCore:
    """What both mirrors hold and how they read and load it, without a lock or a thread."""

    def __init__(self, name: str, prefix: str, page: int) -> None:
        if type(prefix) is not str:
            raise TypeError(f"a prefix must be a str, not {prefix!r:.60}")
        if type(page) is not int or not 1 <= page <= 10_000:
            raise ValueError(f"page must be an int from 1 to 10000, not {page!r:.60}")
        self.name = name
        self.prefix = prefix
        self._page = page
        self._data: dict[str, Entry] = {}
        self._sorted: list[str] | None = None             # the keys sorted, made on demand
        self._revision = 0
        self._created: int | None = None   # the map's, once loaded (the log index that made it)
        self._error: BaseException | None = None
        self._closed = False
        self._listeners: list[Listener] = []

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name!r} prefix={self.prefix!r} "
                f"revision={self._revision} keys={len(self._data)}>")

    def _locked(self) -> AbstractContextManager[Any]:
        """What a read holds (the sync mirror's lock; nothing on an event loop)."""
        return contextlib.nullcontext()

    # -- reads -----------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """Every change under the prefix up to this map revision is held."""
        with self._locked():
            self._live()
            return self._revision

    def get(self, key: str, default: Any = None) -> Any:
        e = self._entry(key)
        return default if e is None else e[0]

    def entry(self, key: str) -> dict[str, Any] | None:
        """{"value", "version", "mod_revision"} or None."""
        e = self._entry(key)
        return None if e is None else {"value": e[0], "version": e[1], "mod_revision": e[2]}

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under ``prefix`` (within the mirror's), sorted."""
        with self._locked():
            return self._under(prefix)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """(key, value) of the keys under ``prefix``, sorted by key, at one revision."""
        with self._locked():
            data = self._data
            return [(k, data[k][0]) for k in self._under(prefix)]

    def __getitem__(self, key: str) -> Any:
        e = self._entry(key)
        if e is None:
            raise KeyError(key)
        return e[0]

    def __contains__(self, key: object) -> bool:
        return type(key) is str and self._entry(key) is not None

    def __len__(self) -> int:
        with self._locked():
            self._live()
            return len(self._data)

    def _entry(self, key: str) -> Entry | None:
        self._check(key)
        with self._locked():
            self._live()
            return self._data.get(key)

    def _check(self, key: Any) -> None:
        if type(key) is not str:
            raise TypeError(f"a key must be a str, not {key!r:.60}")
        if not key.startswith(self.prefix):
            raise ValueError(f"key {key[:60]!r} is not under this mirror's prefix "
                             f"{self.prefix!r}")

    def _under(self, prefix: str) -> list[str]:
        """The sorted keys under ``prefix``."""
        self._live()
        if type(prefix) is not str:
            raise TypeError(f"a prefix must be a str, not {prefix!r:.60}")
        if self._sorted is None:
            self._sorted = sorted(self._data)
        keys = self._sorted
        i = bisect.bisect_left(keys, max(prefix, self.prefix))
        out = []
        while i < len(keys) and keys[i].startswith(prefix) and keys[i].startswith(self.prefix):
            out.append(keys[i])
            i += 1
        return out

    def _live(self) -> None:
        """Raise if reads can no longer be answered."""
        if self._closed:
            raise ValueError(f"the mirror of map {self.name!r} is closed")
        err = self._error
        if err is not None:
            message = (f"the mirror of map {self.name!r} stopped following it: "
                       f"{getattr(err, 'message', err)}")
            if isinstance(err, GesmasError):
                raise type(err)(message, err.type, err.leader_hint) from err
            raise Unavailable(message) from err

    def _add_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise TypeError(f"a listener must be callable, not {listener!r:.60}")
        self._listeners.append(listener)

    # -- loading and applying --------------------------------------------------------------------

    def _loading(self) -> Generator[Read, Any, Loaded]:
        """The steps of one load (each a read the caller makes and sends back the answer
        of); returns (the entries under the prefix, the revision they are at, the map's
        `created`): pages, then every change made since the first page's revision. Raises
        Replaced if a page comes from another map than the first (or, in a reload, than the
        one followed)."""
        data: dict[str, Entry] = {}
        first = last = -1
        made = self._created
        start_after = ""
        while True:
            got = yield "items", (self.prefix, self._page, start_after)
            if made is None:
                made = got["created"]
            elif got["created"] != made:
                raise Replaced(f"map {self.name!r} was deleted and made again (at log index "
                               f"{got['created']}; the one read was made at {made})",
                               "Replaced")
            if first < 0:
                first = got["revision"]
            last = got["revision"]
            for it in got["items"]:
                data[it["key"]] = (it["value"], it["version"], it["mod_revision"])
            if not got["more"]:
                break
            start_after = got["items"][-1]["key"]
        revision = first
        while revision < last:           # changes between the pages: there are some
            got = yield "watch", ("", revision, WATCH_LIMIT, made)
            self._apply(data, got["events"])
            revision = got["revision"]
        return data, revision, made

    def _again(self, e: BaseException, attempt: int) -> bool:
        """Whether a load that raised ``e`` in its ``attempt``-th try is tried again: the
        map no longer keeps the first page's revision, or (the first load only) the map was
        made again while it was read."""
        if attempt >= LOAD_ATTEMPTS - 1:
            return False
        return isinstance(e, Compacted) or (isinstance(e, Replaced) and self._created is None)

    def _follows(self) -> dict[str, Any]:
        """The watch's keyword arguments, from where the mirror is."""
        return {"after_revision": self._revision, "limit": WATCH_LIMIT,
                "created": self._created}

    def _apply(self, data: dict[str, Entry], events: list[Event]) -> list[Event]:
        """Apply ``events`` (in order) to ``data``, those under the prefix; the events that
        changed something."""
        applied = []
        prefix = self.prefix
        for ev in events:
            key = ev["key"]
            if not key.startswith(prefix):
                continue
            if ev["type"] == "put":
                data[key] = (ev["value"], ev["version"], ev["revision"])
            elif data.pop(key, None) is None:
                continue
            applied.append(ev)
        return applied

    def _answer(self, got: Any) -> list[Event]:
        """Take a watch answer; the events applied."""
        before = len(self._data)
        applied = self._apply(self._data, got["events"])
        if applied and (len(self._data) != before or
                        any(ev["type"] == "delete" for ev in applied)):
            self._sorted = None           # a key came or went
        self._revision = max(self._revision, got["revision"])
        return applied

    def _replace(self, data: dict[str, Entry], revision: int) -> list[Event]:
        """Take a new load; what differs from the entries held, as events."""
        old = self._data
        self._data, self._sorted = data, None
        self._revision = max(self._revision, revision)
        changes = []
        for key in sorted(old.keys() | data.keys()):
            was, now = old.get(key), data.get(key)
            if now is None:
                changes.append({"revision": revision, "type": "delete", "key": key,
                                "value": None, "version": 0})
            elif was is None or was[2] != now[2]:
                changes.append({"revision": now[2], "type": "put", "key": key,
                                "value": now[0], "version": now[1]})
        return changes

    def _tell(self, listeners: list[Listener], events: list[Event]) -> None:
        for ev in events:
            for listener in listeners:
                try:
                    listener(ev)
                except Exception:
                    _log.exception("a listener of the mirror of map %r raised", self.name)

    def _fail(self, e: BaseException) -> None:
        if not self._closed:
            self._error = e


def _load(core: MirrorCore, read: Callable[[str, tuple[Any, ...]], Any]) -> Loaded:
    """A load with ``read`` answering its steps, again while ``core._again`` says so."""
    for attempt in range(LOAD_ATTEMPTS):
        steps = core._loading()
        try:
            step = next(steps)
            while True:
                step = steps.send(read(*step))
        except StopIteration as done:
            result: Loaded = done.value
            return result
        except (Compacted, Replaced) as e:
            if not core._again(e, attempt):
                raise
    raise AssertionError("unreachable")


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
