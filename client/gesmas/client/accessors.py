"""The standard classes by name, as methods of ``Client``: ``c.queue("jobs")`` is
``c.object("Queue", "jobs")``, typed where the class has a proxy of its own."""
from __future__ import annotations

from typing import Any, TypeVar

from gesmas.client.proxies import (BarrierProxy, LeaderElectionProxy, LockProxy,
                                   MapProxy, ObjectProxy, QueueProxy, ReadWriteLockProxy,
                                   SemaphoreProxy)

T = TypeVar("T")


class StandardObjects:
    """A base class of ``Client``: accessors for the standard classes."""

    def object(self, class_name: str, name: str, /, *args: Any, **kwargs: Any) -> ObjectProxy:
        raise NotImplementedError     # Client.object

    def queue(self, name: str, **kwargs: Any) -> QueueProxy:
        """A FIFO queue: ``produce(item)``, ``consume()``; ``capacity=None`` bounds its items,
        ``max_bytes=`` (48 MiB) their size.
        A timed-out consume raises QueueEmpty (also queue.Empty), produce QueueFull."""
        return self._typed("Queue", name, QueueProxy, kwargs)

    def lock(self, name: str, **kwargs: Any) -> LockProxy:
        """A lock (``reentrant=False``): ``with c.lock(n) as fence: ...``."""
        return self._typed("Lock", name, LockProxy, kwargs)

    def semaphore(self, name: str, **kwargs: Any) -> SemaphoreProxy:
        """A counting semaphore (``permits=``): leased to sessions by default;
        ``owned=False`` is threading.Semaphore's semantics (any session releases, e.g. a
        producer what a consumer acquires), ``owned=False, bounded=True``
        threading.BoundedSemaphore's. ``release(n)`` gives back n permits."""
        return self._typed("Semaphore", name, SemaphoreProxy, kwargs)

    def barrier(self, name: str, **kwargs: Any) -> BarrierProxy:
        """A cyclic barrier (``parties=``) with threading.Barrier's semantics: ``wait()``
        returns the arrival index; a party that times out, ``abort()`` or a waiting party's
        session ending breaks it (every waiter, and every later ``wait()``, gets
        BrokenBarrierError, catchable as threading.BrokenBarrierError) until ``reset()``;
        ``broken``, ``n_waiting``, ``parties``."""
        return self._typed("Barrier", name, BarrierProxy, kwargs)

    def double_barrier(self, name: str, **kwargs: Any) -> ObjectProxy:
        """A double barrier (``parties=``): ``enter()`` / ``leave()``."""
        return self.object("DoubleBarrier", name, **kwargs)

    def latch(self, name: str, **kwargs: Any) -> ObjectProxy:
        """A count-down latch (``count=``): ``count_down()``, ``wait()``."""
        return self.object("CountDownLatch", name, **kwargs)

    def rwlock(self, name: str, **kwargs: Any) -> ReadWriteLockProxy:
        """A readers-writer lock: ``with rw.read(): ...`` / ``with rw.write(): ...``."""
        return self._typed("ReadWriteLock", name, ReadWriteLockProxy, kwargs)

    def election(self, name: str, **kwargs: Any) -> LeaderElectionProxy:
        """A leader election: ``campaign()``, ``resign()``, ``leader()``, ``observe()``."""
        return self._typed("LeaderElection", name, LeaderElectionProxy, kwargs)

    def counter(self, name: str, **kwargs: Any) -> ObjectProxy:
        """A counter (``initial=0``)."""
        return self.object("Counter", name, **kwargs)

    def map(self, name: str, **kwargs: Any) -> MapProxy:
        """A key-value map with versions, cas, transactions, ephemeral entries and watches
        (``max_keys=``, ``max_key_bytes=``, ``max_value_bytes=``, ``max_bytes=``,
        ``history=``, ``history_bytes=``)."""
        return self._typed("Map", name, MapProxy, kwargs)

    def _typed(self, class_name: str, name: str, cls: type[T], kwargs: dict[str, Any]) -> T:
        proxy = self.object(class_name, name, **kwargs)
        assert isinstance(proxy, cls)
        return proxy
