"""Map: a key-value map with versions, a revision, compare-and-set, transactions, entries
bound to a session, and watches: what ZooKeeper and etcd are mostly used for (configuration,
service registries, feature flags).

Guarantees
- Keys are non-empty strings; values any plain value. Each key has a `version` (1 when made,
  +1 per put, gone with the key), a `create_revision` and a `mod_revision`. The map has one
  `revision`: +1 per change (a put, the delete of an existing key, a transaction that changed
  something: its changes share one revision, etcd's mod revision).
- put(key, value, ephemeral=False) -> {"revision", "version"}; delete(key) -> bool;
  get(key, default=None) -> the value; entry(key) -> {"value", "version", "create_revision",
  "mod_revision", "ephemeral"} or None; revision(); size(); stat() -> {"revision", "size",
  "created"}.
- `created`: the log index of the command that made the map. A map deleted and made again
  under the same name starts again at revision 0 with another `created`; pages, watch answers
  and stat() name it, and a watch given `created` of another map raises Replaced (else a
  watch from revision r of the old map would take the new one's changes after r for the
  ones it missed).
- items(prefix="", limit=100, start_after="") / keys(...): in key order, at most `limit`,
  those after `start_after` (the last key of the previous page): {"items"|"keys", "more",
  "revision", "created"}; a page also ends past 256 KiB of keys and values. Ordered by a kept sorted
  list: O(log n + limit) a page, no scan of the map.
- cas(key, expect_version, value) -> bool: put if the key's version is `expect_version`
  (0: the key must not exist).
- txn(compares, success, failure=()) -> {"succeeded", "revision", "results"}: if every compare
  holds the success operations run, else the failure ones; one log entry, atomic: a request
  that is invalid anywhere (a bad operation, a size or key limit, over 512 KiB of keys and
  values, those its gets return included) changes nothing. At most 128 compares and 128
  operations in each branch. A compare is
  [key, target, op, operand]: target "value", "version", "create_revision", "mod_revision"
  or "exists"; op one of == != < > <= >= ("exists": == or != with a bool). A missing key has
  version and revisions 0, and every comparison of its value fails. An operation is
  ["put", key, value] (["put", key, value, True]: ephemeral), ["delete", key] or ["get", key].
- Ephemeral entries belong to the session that last put them: when it ends (expired or closed)
  they are deleted, a revision each (so that a watch answer may end between them). A later
  plain put makes such an entry permanent. A session holds at most 1,000 in one map.
- watch(prefix, after_revision, limit=1000, created=None) -> {"revision", "events", "created"}:
  the changes after
  `after_revision` to keys under `prefix`, oldest first, each {"revision", "type" ("put" or
  "delete"), "key", "value", "version"}; waits while there is none. Watch again from the
  returned "revision": no change is missed and none is seen twice. Served as a reader: the
  wait is the replica's own, nothing of it goes through the log, and a change wakes only
  the watches of prefixes of its key (NotYet(prefix), Context.changed). An answer ends at a
  revision's end past `limit` events or 256 KiB. The last `history` changes are kept (a
  few more: they are dropped by batches, a revision whole): a revision older than that
  raises Compacted, naming the oldest revision a watch may start after (read the state,
  then watch from its revision). A watch scans the changes after its revision (about 4 us
  each, on the replica's apply lock): keep `history` as small as the watchers allow.
- Limits (constructor): max_keys (<= 10^7), max_key_bytes (UTF-8, <= 4096), max_value_bytes
  (strings in UTF-8, bytes as they are, 8 per other item; <= 512 KiB), max_bytes (the keys
  and values held, 32 MiB by default), history (<= 20,000) and history_bytes (the keys and
  values of the changes kept, 16 MiB by default: fewer changes are kept when they are
  large). Under the defaults a map stays below the kernel's 64 MiB an object, past which
  an object takes no more calls, deletes included: a put that would pass max_bytes is
  refused instead, and the map still takes deletes. A map's state counts in its owner's
  state_bytes quota like every object's.
"""
from typing import TYPE_CHECKING
import bisect

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import NotYet, Semaphore, context

_TARGETS = ("value", "version", "create_revision", "mod_revision", "exists")
_OPS = ("==", "!=", "<", ">", "<=", ">=")
_MAX_TXN_OPS = 128                        # etcd's default for --max-txn-ops
# Bounds that keep every answer under the kernel's 1 MiB result limit and every call within
# its step budget: a page or a watch answer stops past _PAGE_BYTES of keys and values (it
# has at least one item or revision); a transaction's keys, values and the values its gets
# return stay under _TXN_BYTES (so its revision fits in one watch answer); a session holds
# at most _MAX_EPHEMERAL ephemeral entries in one map (its end deletes them in one call).
_PAGE_BYTES = 256 * 1024
_TXN_BYTES = 512 * 1024
_MAX_EPHEMERAL = 1000
_CHUNK = 256                              # the keys in order: lists of _CHUNK to 2 * _CHUNK


class Compacted(LookupError):
    """watch() after a revision whose changes are no longer kept."""


class Replaced(LookupError):
    """watch(created=...) of a map that was deleted and made again since."""


class Map:
    _restartable = ("watch",)  # waits a checkpoint leaves in place
    _readers = ("get", "entry", "items", "keys", "size", "revision", "stat", "watch")  # no log
    _made = 0           # maps restored from checkpoints written before `created` was kept
    _constructor_args = ("max_keys", "max_key_bytes", "max_value_bytes", "history",
                         "history_bytes", "max_bytes")

    def __init__(self, max_keys=100_000, max_key_bytes=1024, max_value_bytes=256 * 1024,
                 history=1000, history_bytes=16 << 20, max_bytes=32 << 20):
        for name, v, low, top in (("max_keys", max_keys, 1, 10_000_000),
                                  ("max_key_bytes", max_key_bytes, 1, 4096),
                                  ("max_value_bytes", max_value_bytes, 1, _TXN_BYTES),
                                  ("history", history, 1, 20_000),
                                  ("history_bytes", history_bytes, _TXN_BYTES, 1 << 32),
                                  ("max_bytes", max_bytes, 1, 1 << 40)):
            if type(v) is not int or not low <= v <= top:
                raise ValueError(f"{name} must be an int from {low} to {top}, not {v!r}")
        self.max_keys = max_keys
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.history = history
        self.history_bytes = history_bytes   # at least one transaction's: a revision fits
        self.max_bytes = max_bytes
        self._bytes = 0          # the sizes of the entries held
        self._history_held = 0   # the sizes of the changes kept
        # key -> [value, version, create_rev, mod_rev, session or None, size of key and value]
        self._data = {}
        self._chunks = []        # the keys, sorted, in lists of at most _CHUNK * 2
        self._maxes = []         # the last key of each of those lists
        self._owned = {}         # session -> {key: None}: its ephemeral keys
        self._rev = 0
        self._events = []        # [rev, type, key, value, version, size], oldest first
        self._event_revs = []    # their revisions (bisect)
        self._floor = 0          # changes after this revision are kept
        self._changed = Semaphore(0)      # watches through the log wait here
        self._made = context().request    # the log index of the command that made it

    # -- reading -------------------------------------------------------------------------------

    def get(self, key, default=None):
        e = self._data.get(self._key(key))
        return default if e is None else e[0]

    def entry(self, key):
        e = self._data.get(self._key(key))
        if e is None:
            return None
        return {"value": e[0], "version": e[1], "create_revision": e[2],
                "mod_revision": e[3], "ephemeral": e[4] is not None}

    def revision(self):
        return self._rev

    def size(self):
        return len(self._data)

    def stat(self):
        return {"revision": self._rev, "size": len(self._data), "created": self._made}

    def items(self, prefix="", limit=100, start_after=""):
        keys, more = self._page(prefix, limit, start_after, True)
        out = []
        for k in keys:
            e = self._data[k]
            out.append({"key": k, "value": e[0], "version": e[1], "mod_revision": e[3]})
        return {"items": out, "more": more, "revision": self._rev, "created": self._made}

    def keys(self, prefix="", limit=100, start_after=""):
        keys, more = self._page(prefix, limit, start_after, False)
        return {"keys": keys, "more": more, "revision": self._rev, "created": self._made}

    def watch(self, prefix="", after_revision=0, limit=1000, created=None):
        self._prefix(prefix)
        if type(after_revision) is not int or after_revision < 0:
            raise ValueError(f"after_revision must be an int >= 0, not {after_revision!r}")
        self._limit(limit, 100_000)
        if created is not None and type(created) is not int:
            raise TypeError(f"created must be an int (a page's, a watch answer's or stat()'s "
                            f"'created') or None, not {created!r:.60}")
        while True:
            if created is not None and created != self._made:
                raise Replaced(f"this map was made at log index {self._made}, not {created}: "
                               "the map watched was deleted and made again; read the state, "
                               "then watch from its revision")
            if after_revision < self._floor:
                raise Compacted(f"revision {after_revision} is compacted: this map keeps the "
                                f"changes after revision {self._floor} (its last "
                                f"{self.history}); read the state, then watch from its "
                                "revision")
            events, last = self._since(prefix, after_revision, limit)
            if events:
                return {"revision": last, "events": events, "created": self._made}
            try:
                self._changed.acquire()   # through the log: wait here
            except NotYet:                # a reader: run again once a key under it changed
                raise NotYet(prefix)

    # -- writing -------------------------------------------------------------------------------

    def put(self, key, value, ephemeral=False):
        key = self._key(key)
        if type(ephemeral) is not bool:     # "no" would be true: an entry gone with its session
            raise TypeError(f"ephemeral must be a bool, not {ephemeral!r:.60}")
        size = len(key) + self._value(value)
        if key not in self._data and len(self._data) >= self.max_keys:
            self._full()
        self._bytes_room(key, size)
        owner = None
        if ephemeral:
            owner = self._session()
            self._ephemeral_room(owner, [key])
        self._rev += 1
        version = self._put(key, value, owner, size)
        self._wake()
        return {"revision": self._rev, "version": version}

    def delete(self, key):
        key = self._key(key)
        if key not in self._data:
            return False
        self._rev += 1
        self._delete(key)
        self._wake()
        return True

    def cas(self, key, expect_version, value):
        key = self._key(key)
        if type(expect_version) is not int or expect_version < 0:
            raise ValueError(f"expect_version must be an int >= 0 (0: the key must not "
                             f"exist), not {expect_version!r}")
        size = len(key) + self._value(value)
        e = self._data.get(key)
        if (0 if e is None else e[1]) != expect_version:
            return False
        if e is None and len(self._data) >= self.max_keys:
            self._full()
        self._bytes_room(key, size)
        self._rev += 1
        self._put(key, value, None, size)
        self._wake()
        return True

    def txn(self, compares, success, failure=()):
        compares = self._list(compares, "compares")
        success = self._ops(success, "success")
        failure = self._ops(failure, "failure")
        checked = [self._compare_of(c) for c in compares]
        held = True
        for c in checked:
            if not self._holds(c):
                held = False
                break
        ops = success if held else failure
        self._room(ops)                   # all checks before the first change
        changed = False                   # the first change takes the new revision
        results = []
        for op in ops:
            kind, key = op[0], op[1]
            if kind == "get":
                results.append(self.entry(key))
                continue
            if kind == "delete" and key not in self._data:
                results.append({"deleted": False})
                continue
            if not changed:
                self._rev += 1
                changed = True
            if kind == "put":
                owner = self._session() if op[3] else None
                results.append({"version": self._put(key, op[2], owner, op[4])})
            else:
                self._delete(key)
                results.append({"deleted": True})
        if changed:
            self._wake()
        return {"succeeded": held, "revision": self._rev, "results": results}

    # -- the entries ---------------------------------------------------------------------------

    def _put(self, key, value, owner, size):
        e = self._data.get(key)
        if e is None:
            e = [value, 1, self._rev, self._rev, None, size]
            self._data[key] = e
            self._insort(key)
            self._bytes += size
        else:
            self._bytes += size - e[5]
            e[0] = value
            e[1] += 1
            e[3] = self._rev
            e[5] = size
        if e[4] != owner:
            if e[4] is not None:
                self._disown(e[4], key)
            if owner is not None:
                self._owned.setdefault(owner, {})[key] = None
            e[4] = owner
        self._event("put", key, value, e[1], size)
        return e[1]

    def _delete(self, key):
        e = self._data.pop(key)
        self._bytes -= e[5]
        self._unsort(key)
        if e[4] is not None:
            self._disown(e[4], key)
        self._event("delete", key, None, 0, len(key))

    # -- the keys in order: a list of sorted lists, so that a key made or deleted moves at
    # most 2 * _CHUNK others. One sorted list of 100,000 keys cost ~1,500 steps a key (the
    # dialect charges an insert or a delete by the items it moves), so a transaction of 128
    # new keys, or a session's end deleting its 1,000 ephemeral keys, ran out of the call's
    # 200,000 steps.

    def _insort(self, key):
        chunks, maxes = self._chunks, self._maxes
        if not chunks:
            chunks.append([key])
            maxes.append(key)
            return
        j = bisect.bisect_left(maxes, key)
        if j == len(maxes):
            j -= 1                        # past every key: the last list
        chunk = chunks[j]
        bisect.insort(chunk, key)
        if len(chunk) > 2 * _CHUNK:
            chunks.insert(j + 1, chunk[_CHUNK:])
            del chunk[_CHUNK:]
            maxes.insert(j + 1, chunks[j + 1][-1])
        maxes[j] = chunk[-1]

    def _unsort(self, key):
        chunks, maxes = self._chunks, self._maxes
        j = bisect.bisect_left(maxes, key)
        chunk = chunks[j]
        del chunk[bisect.bisect_left(chunk, key)]
        if chunk:
            maxes[j] = chunk[-1]
        else:
            del chunks[j]
            del maxes[j]

    def _disown(self, session, key):
        keys = self._owned.get(session)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._owned[session]

    def _on_session_end(self, session):
        keys = self._owned.pop(session, None)
        if not keys:
            return
        for key in keys:                  # a revision each: a watch answer may end between
            self._rev += 1
            self._delete(key)
        self._wake()

    # -- the history ---------------------------------------------------------------------------

    def _event(self, kind, key, value, version, size):
        context().changed(key)            # waiting watches of other prefixes sleep on
        self._events.append([self._rev, kind, key, value, version, size])
        self._event_revs.append(self._rev)
        self._history_held += size
        over = len(self._events) - self.history
        if over > max(16, self.history // 8) or self._history_held > self.history_bytes:
            self._trim(over)              # by batches: O(1) a change

    def _trim(self, over):
        """Drop the oldest changes: the `over` past `history`, and more while those left
        hold over 7/8 of history_bytes; a revision is kept whole (the last one always)."""
        events, revs = self._events, self._event_revs
        n = max(over, 0)
        left = self._history_held
        for i in range(n):
            left -= events[i][5]
        keep = self.history_bytes - self.history_bytes // 8
        while left > keep and n < len(events) - 1:
            left -= events[n][5]
            n += 1
        while 0 < n < len(events) and revs[n] == revs[n - 1]:
            n -= 1                        # a revision is kept whole
            left += events[n][5]
        if n > 0:
            self._floor = revs[n - 1]
            del events[:n]
            del revs[:n]
            self._history_held = left

    def _since(self, prefix, after, limit):
        """The events after revision `after` under `prefix` (at most `limit`, whole
        revisions), and the revision to watch from next."""
        out = []
        events = self._events
        i = bisect.bisect_right(self._event_revs, after)
        n = len(events)
        last = self._rev
        size = 0
        while i < n:
            ev = events[i]
            if out and (len(out) >= limit or size > _PAGE_BYTES) and \
                    ev[0] != out[-1]["revision"]:
                last = out[-1]["revision"]
                break
            if ev[2].startswith(prefix):
                out.append({"revision": ev[0], "type": ev[1], "key": ev[2], "value": ev[3],
                            "version": ev[4]})
                size += ev[5]
            i += 1
        return out, last

    def _wake(self):
        if self._changed.waiters:
            self._changed.release(self._changed.waiters)

    # -- checks --------------------------------------------------------------------------------

    def _session(self):
        me = context().session
        if not me:
            raise ValueError("an ephemeral entry needs a session: call with one")
        return me

    def _key(self, key):
        if type(key) is not str or not key:
            raise TypeError(f"a key must be a non-empty str, not {key!r:.60}")
        if len(key) * 4 > self.max_key_bytes and len(key.encode("utf-8")) > self.max_key_bytes:
            raise ValueError(f"key {key[:40]!r}... is longer than this map's max_key_bytes "
                             f"({self.max_key_bytes} bytes in UTF-8)")
        return key

    def _prefix(self, prefix):
        if type(prefix) is not str:
            raise TypeError(f"a prefix must be a str, not {prefix!r:.60}")

    def _limit(self, limit, top):
        if type(limit) is not int or not 1 <= limit <= top:
            raise ValueError(f"limit must be an int from 1 to {top}, not {limit!r:.60}")

    def _value(self, value):
        """The value's size; refused over max_value_bytes (the walk stops there)."""
        size = self._size([value], self.max_value_bytes)
        if size is None:
            raise ValueError(f"the value is larger than this map's max_value_bytes "
                             f"({self.max_value_bytes})")
        return size

    def _size(self, parts, room):
        """The size of the values in the list `parts` (strings in UTF-8, bytes as they are,
        8 per other item), or None past `room` (the walk stops there). About a step a part:
        the lists to walk are taken in order by index, as popping them from a stack would
        charge the stack's length each time (the dialect counts a pop as moving what follows
        it). Map, Queue and Group hold the same method: each standard class is a source of
        its own, and a source imports none of the others."""
        size = 0
        todo = [parts]
        i = 0
        while i < len(todo):
            items = todo[i]
            i += 1
            for x in items:
                t = type(x)
                if t is str:
                    size += len(x) if x.isascii() else len(x.encode("utf-8"))
                elif t is bytes:
                    size += len(x)
                else:
                    size += 8
                    if t is list:
                        todo.append(x)
                    elif t is dict:
                        todo.append(list(x.keys()))
                        todo.append(list(x.values()))
                if size > room:
                    return None
        return size

    def _full(self):
        raise ValueError(f"the map is full: it holds max_keys ({self.max_keys}) keys")

    def _bytes_room(self, key, size):
        """Refuse a put that would take the entries held past max_bytes (one that makes
        them smaller is taken)."""
        e = self._data.get(key)
        held = self._bytes + size - (0 if e is None else e[5])
        if held > self.max_bytes and held > self._bytes:
            self._too_big(held)

    def _too_big(self, held):
        raise ValueError(f"the map is full: its keys and values would take {held} bytes, over "
                         f"max_bytes ({self.max_bytes}); delete entries, or make the map "
                         "with a larger max_bytes")

    def _ephemeral_room(self, me, keys):
        mine = self._owned.get(me, {})
        new = len(mine)
        for k in keys:
            if k not in mine:
                new += 1
        if new > _MAX_EPHEMERAL:
            raise ValueError(f"this session would hold more than {_MAX_EPHEMERAL} ephemeral "
                             "entries in this map")

    def _page(self, prefix, limit, start_after, sized):
        self._prefix(prefix)
        self._limit(limit, 10_000)
        if type(start_after) is not str:
            raise TypeError(f"start_after must be a str, not {start_after!r:.60}")
        chunks, maxes = self._chunks, self._maxes
        if start_after >= prefix:         # the keys after start_after
            j = bisect.bisect_right(maxes, start_after)
            i = bisect.bisect_right(chunks[j], start_after) if j < len(chunks) else 0
        else:                             # the keys from prefix on
            j = bisect.bisect_left(maxes, prefix)
            i = bisect.bisect_left(chunks[j], prefix) if j < len(chunks) else 0
        out = []
        size = 0
        while j < len(chunks):
            keys = chunks[j]
            while i < len(keys):
                key = keys[i]
                if not key.startswith(prefix):
                    return out, False
                if len(out) == limit or size > _PAGE_BYTES:
                    return out, True
                out.append(key)
                size += self._data[key][5] if sized else len(key)
                i += 1
            j += 1
            i = 0
        return out, False

    def _list(self, x, what):
        if type(x) is tuple:
            x = list(x)
        if type(x) is not list:
            raise TypeError(f"{what} must be a list, not {x!r:.60}")
        if len(x) > _MAX_TXN_OPS:
            raise ValueError(f"{what}: at most {_MAX_TXN_OPS} entries in a transaction, not "
                             f"{len(x)}")
        return x

    def _ops(self, ops, what):
        out = []
        for op in self._list(ops, what):
            if type(op) is not list or not op or op[0] not in ("put", "delete", "get"):
                raise ValueError(f"{what}: an operation is ['put', key, value(, ephemeral)], "
                                 f"['delete', key] or ['get', key], not {op!r:.80}")
            size = {"put": (3, 4), "delete": (2, 2), "get": (2, 2)}[op[0]]
            if not size[0] <= len(op) <= size[1]:
                raise ValueError(f"{what}: {op[0]} takes {size[0] - 1} argument(s), not "
                                 f"{op!r:.80}")
            key = self._key(op[1])
            if op[0] == "put":
                size = len(key) + self._value(op[2])
                ephemeral = op[3] if len(op) == 4 else False
                if type(ephemeral) is not bool:
                    raise TypeError(f"{what}: a put's fourth item (ephemeral) must be a bool")
                if ephemeral:
                    self._session()
                out.append(["put", key, op[2], ephemeral, size])
            else:
                out.append([op[0], key])
        return out

    def _room(self, ops):
        """Refuse operations that would leave more than max_keys keys, give a session too
        many ephemeral entries, or change or return more than _TXN_BYTES."""
        there = {}                        # key -> the size it will have, None: deleted
        total = 0
        ephemeral = []
        for op in ops:
            key = op[1]
            if op[0] == "put":
                there[key] = op[4]
                total += op[4]
                if op[3]:
                    ephemeral.append(key)
            elif op[0] == "delete":
                there[key] = None
                total += len(key)
            elif key in there:
                total += there[key] or 0
            elif key in self._data:
                total += self._data[key][5]
        if total > _TXN_BYTES:
            raise ValueError(f"the transaction's keys and values (those its gets return "
                             f"included) are over {_TXN_BYTES} bytes")
        if ephemeral:
            self._ephemeral_room(self._session(), ephemeral)
        n = len(self._data)
        for key in there:
            if there[key] is not None and key not in self._data:
                n += 1
            elif there[key] is None and key in self._data:
                n -= 1
        if n > self.max_keys:
            self._full()
        held = self._bytes
        for key in there:
            if key in self._data:
                held -= self._data[key][5]
            if there[key] is not None:
                held += there[key]
        if held > self.max_bytes and held > self._bytes:
            self._too_big(held)

    def _compare_of(self, c):
        if type(c) is not list or len(c) != 4:
            raise ValueError(f"a compare is [key, target, op, operand], not {c!r:.80}")
        key, target, op, operand = c
        self._key(key)
        if target not in _TARGETS:
            raise ValueError(f"compare target {target!r:.40} is not one of {', '.join(_TARGETS)}")
        if op not in _OPS:
            raise ValueError(f"compare op {op!r:.20} is not one of {' '.join(_OPS)}")
        if target == "exists" and (type(operand) is not bool or op not in ("==", "!=")):
            raise ValueError("an 'exists' compare is [key, 'exists', '==' or '!=', bool]")
        if target in ("version", "create_revision", "mod_revision") and \
                type(operand) is not int:
            raise ValueError(f"a {target} compare takes an int, not {operand!r:.40}")
        return c

    def _holds(self, c):
        key, target, op, operand = c
        e = self._data.get(key)
        if target == "exists":
            have = e is not None
        elif target == "value":
            if e is None:
                return False
            have = e[0]
        else:
            have = 0 if e is None else e[{"version": 1, "create_revision": 2,
                                          "mod_revision": 3}[target]]
        try:
            if op == "==":
                return have == operand
            if op == "!=":
                return have != operand
            if op == "<":
                return have < operand
            if op == ">":
                return have > operand
            if op == "<=":
                return have <= operand
            return have >= operand
        except TypeError:
            raise ValueError(f"compare {c!r:.80}: the value and the operand cannot be "
                             "ordered") from None
