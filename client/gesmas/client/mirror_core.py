"""What the sync and asyncio Map mirrors share (``gesmas.client.map_mirror`` says what a
mirror holds and when): the entries, their reads, and the load as a generator of reads that
each mirror's driver answers, its own way (a call, an awaited call)."""
from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any

from gesmas.client.errors import Compacted, GesmasError, Replaced, Unavailable

__all__ = ["LOAD_ATTEMPTS", "WATCH_LIMIT", "Entry", "Event", "Listener", "Loaded",
           "MirrorCore", "Read"]

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

    def _load_steps(self) -> Generator[Read, Any, Loaded]:
        """`_loading`, again while `_again` says so: the reads of a whole load. A driver
        sends each read's answer, or throws in the error the read raised."""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                return (yield from self._loading())
            except (Compacted, Replaced) as e:
                if not self._again(e, attempt):
                    raise
        raise AssertionError("unreachable")

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
