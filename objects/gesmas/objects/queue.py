"""Queue: a FIFO queue, unbounded or bounded.

Guarantees
- FIFO: items are consumed in produce order; blocked consumers are served first-come
  first-served, and one produce wakes exactly one consumer (no herd).
- consume is O(1) whatever the queue length.
- Bounded (capacity=N): produce blocks while N items are held (queued or reserved).
- At-least-once: `reserve` hands out an item under a token; `ack(token)` removes it for good.
  If the reserving session ends first, the item returns to the queue in its original position
  relative to the items still queued.
- A call blocks before it changes anything, so a checkpoint needs no undo.
"""
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore, context


class Queue:
    _restartable = ("produce", "consume", "reserve")  # waits a checkpoint leaves in place
    _parked = ("produce", "consume", "reserve")   # waits that hold no greenlet
    _readers = ('size', 'peek', '__len__')  # read-only: served without a log entry
    _constructor_args = ("capacity",)     # a get-or-create naming another one is refused
    def __init__(self, capacity=None):
        if capacity is not None and (type(capacity) is not int or capacity < 1):
            raise ValueError("capacity must be a positive int or None")
        self.capacity = capacity
        self._items = deque()             # (number, item), in FIFO order
        self._filled = Semaphore(0)       # one permit per queued item
        self._free = Semaphore(capacity) if capacity else None
        self._next = 0                    # number of the next item produced
        self._reserved = {}               # token -> (session, number, item)

    def produce(self, item):
        """Append `item`; with a capacity, wait while the queue is full."""
        if self._free is not None:
            self._free.acquire()
        self._next += 1
        self._items.append((self._next, item))
        self._filled.release()

    def consume(self):
        """Remove and return the oldest item, waiting while the queue is empty."""
        self._filled.acquire()
        item = self._items.popleft()[1]
        if self._free is not None:
            self._free.release()
        return item

    def try_consume(self):
        """The oldest item, removed, or None at once if the queue is empty."""
        if not self._filled.try_acquire():
            return None
        item = self._items.popleft()[1]
        if self._free is not None:
            self._free.release()
        return item

    def reserve(self):
        """Take the oldest item under a token (waiting while empty): {"token", "item"}.
        The item comes back if the session ends before `ack(token)`."""
        self._filled.acquire()
        number, item = self._items.popleft()
        self._reserved[number] = (context().session, number, item)
        return {"token": number, "item": item}

    def ack(self, token):
        """Remove a reserved item for good."""
        held = self._reserved.get(token)
        if held is None:
            raise KeyError(f"no reserved item with token {token!r}")
        if held[0] != context().session:
            raise PermissionError(f"item {token} is reserved by another session")
        del self._reserved[token]
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

    def _on_session_end(self, session):
        back = [v for v in self._reserved.values() if v[0] == session]
        if not back:
            return
        for _, number, _ in back:
            del self._reserved[number]
        # Returned items are older than most queued ones: insert each at its place by number.
        items = list(self._items)
        merged = []
        i = 0
        for _, number, item in sorted(back, key=lambda v: v[1]):
            while i < len(items) and items[i][0] < number:
                merged.append(items[i])
                i += 1
            merged.append((number, item))
        merged.extend(items[i:])
        self._items = deque(merged)
        self._filled.release(len(back))
