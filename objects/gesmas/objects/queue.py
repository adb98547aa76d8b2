"""Queue: a FIFO queue, unbounded or bounded.

Guarantees
- FIFO: items are consumed in produce order; blocked consumers are served first-come
  first-served, and one produce wakes exactly one consumer (no herd).
- consume is O(1) whatever the queue length.
- Bounded (capacity=N): produce blocks while N items are held (queued or reserved).
- At-least-once: `reserve` hands out an item under a token; `ack(token)` removes it for good.
  If the reserving session ends first, the item returns to the queue in its original position
  relative to the items still queued.
- At most `max_bytes` of items held (queued or reserved; 48 MiB by default; strings in
  UTF-8, bytes as they are, 8 per other item, and 64 an item for its place in the queue,
  as the kernel measures an object): a produce that would pass it is refused with a
  ValueError, and consumers go on. Under the default a queue stays below the kernel's 64
  MiB an object, past which an object takes no more calls: its items could then be
  neither consumed nor acked, only deleted with it.
- A call blocks before it changes anything, so a checkpoint needs no undo.
"""
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore, context

_ENTRY = 64          # an item's place in the queue (its tuple, number, size), as measured


class Queue:
    _restartable = ("produce", "consume", "reserve")  # waits a checkpoint leaves in place
    _parked = ("produce", "consume", "reserve")   # waits that hold no greenlet
    _readers = ('size', 'peek', '__len__')  # read-only: served without a log entry
    _constructor_args = ("capacity", "max_bytes")  # a get-or-create naming others is refused
    def __init__(self, capacity=None, *, max_bytes=48 << 20):
        if capacity is not None and (type(capacity) is not int or capacity < 1):
            raise ValueError("capacity must be a positive int or None")
        if type(max_bytes) is not int or not 1 <= max_bytes <= 1 << 40:
            raise ValueError(f"max_bytes must be an int from 1 to {1 << 40}, not "
                             f"{max_bytes!r:.60}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._items = deque()             # (number, item, size), in FIFO order
        self._filled = Semaphore(0)       # one permit per queued item
        self._free = Semaphore(capacity) if capacity else None
        self._next = 0                    # number of the next item produced
        self._reserved = {}               # token -> (session, number, item, size)
        self._bytes = 0                   # the sizes of the items held, queued and reserved

    def produce(self, item):
        """Append `item`; with a capacity, wait while the queue is full. Refused (ValueError)
        if the items held would pass max_bytes."""
        if self._free is not None:
            self._free.acquire()
        size = self._size([item], self.max_bytes - self._bytes - _ENTRY)
        if size is None:
            if self._free is not None:
                self._free.release()      # not taken: the next producer has it
            raise ValueError(f"the queue is full: with this item its items would pass "
                             f"max_bytes ({self.max_bytes}); consume some, or make the "
                             "queue with a larger max_bytes")
        size += _ENTRY
        self._next += 1
        self._items.append((self._next, item, size))
        self._bytes += size
        self._filled.release()

    def consume(self):
        """Remove and return the oldest item, waiting while the queue is empty."""
        self._filled.acquire()
        entry = self._items.popleft()
        self._bytes -= entry[2]
        if self._free is not None:
            self._free.release()
        return entry[1]

    def try_consume(self):
        """The oldest item, removed, or None at once if the queue is empty."""
        if not self._filled.try_acquire():
            return None
        entry = self._items.popleft()
        self._bytes -= entry[2]
        if self._free is not None:
            self._free.release()
        return entry[1]

    def reserve(self):
        """Take the oldest item under a token (waiting while empty): {"token", "item"}.
        The item comes back if the session ends before `ack(token)`."""
        self._filled.acquire()
        number, item, size = self._items.popleft()
        self._reserved[number] = (context().session, number, item, size)
        return {"token": number, "item": item}

    def ack(self, token):
        """Remove a reserved item for good."""
        held = self._reserved.get(token)
        if held is None:
            raise KeyError(f"no reserved item with token {token!r}")
        if held[0] != context().session:
            raise PermissionError(f"item {token} is reserved by another session")
        del self._reserved[token]
        self._bytes -= held[3]
        if self._free is not None:
            self._free.release()
        return True

    def size(self):
        """Items queued (reserved items not counted)."""
        return len(self._items)

    def __len__(self):
        """`len(proxy)`: the same as size()."""
        return len(self._items)

    def peek(self):
        """The oldest item without removing it; IndexError if the queue is empty (a queued
        None is told from no item at all)."""
        if not self._items:
            raise IndexError("peek at an empty queue")
        return self._items[0][1]

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

    def _on_session_end(self, session):
        back = [v for v in self._reserved.values() if v[0] == session]
        if not back:
            return
        for _, number, _, _ in back:
            del self._reserved[number]
        # Returned items are older than most queued ones: insert each at its place by number.
        items = list(self._items)
        merged = []
        i = 0
        for _, number, item, size in sorted(back, key=lambda v: v[1]):
            while i < len(items) and items[i][0] < number:
                merged.append(items[i])
                i += 1
            merged.append((number, item, size))
        merged.extend(items[i:])
        self._items = deque(merged)
        self._filled.release(len(back))
