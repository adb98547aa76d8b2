"""One connection (session) of each system for bench/paper.py: the operations each
experiment times, as the gesmas client and as kazoo recipes on ZooKeeper."""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any


from paper_common import ITEM, MAP, OP_TIMEOUT, ROUTE_ENV, SESSION_TTL

# -- adapters: one connection (session) each ---------------------------------------------------

def rotate(xs: list[str], k: int) -> list[str]:
    k %= len(xs)
    return xs[k:] + xs[:k]


class GesmasConn:
    name = "gesmas"

    def __init__(self, addrs: list[str], idx: int, consistency: str = "linearizable",
                 route: str | None = None, kv: bool | str = False) -> None:
        from gesmas.client import Client
        self.c = Client(rotate(addrs, idx), session_ttl=SESSION_TTL,
                        route=route or os.environ.get(ROUTE_ENV, "leader"),
                        consistency=consistency)
        self._objs: dict[tuple[str, str], Any] = {}
        self._kv = bool(kv)
        self._map_name = kv if isinstance(kv, str) else MAP

    # reads (bench/paper.py's "reads"): Counter.get is a declared reader, served without a
    # log entry with the client's consistency; Counter.add is a write (a log entry). With
    # `kv` (bench/paper_map.py): a key of the Map MAP (or the Map named), Map.get and put.
    def _ctr(self, key: str) -> Any:
        k = ("c", key)
        if k not in self._objs:
            self._objs[k] = self.c.counter(key)
        return self._objs[k]

    def map(self) -> Any:
        k = ("m", self._map_name)
        if k not in self._objs:
            self._objs[k] = self.c.map(self._map_name)
        return self._objs[k]

    def read(self, key: str) -> Any:
        if self._kv:
            return self.map().get(key)
        return self._ctr(key).get(timeout=OP_TIMEOUT)

    def write(self, key: str, value: bytes = ITEM) -> None:
        if self._kv:
            self.map().put(key, value)
            return
        self._ctr(key).add(1, timeout=OP_TIMEOUT)

    def _q(self, name: str) -> Any:
        k = ("q", name)
        if k not in self._objs:
            self._objs[k] = self.c.queue(name)
        return self._objs[k]

    def produce(self, q: str) -> None:
        self._q(q).produce(ITEM, timeout=OP_TIMEOUT)

    def consume(self, q: str, timeout: float) -> Any:
        from gesmas.client import Timeout
        try:
            return self._q(q).consume(timeout=timeout)
        except Timeout:
            return None

    def size(self, q: str) -> int:
        return int(self._q(q).size(timeout=OP_TIMEOUT))

    def acquire(self, name: str, timeout: float) -> Any:
        k = ("l", name)
        if k not in self._objs:
            self._objs[k] = self.c.lock(name)
        return self._objs[k].acquire(timeout=timeout)

    def release(self, name: str) -> None:
        self._objs[("l", name)].release()

    def barrier(self, name: str, parties: int, rnd: int, timeout: float) -> None:
        k = ("b", name)
        if k not in self._objs:
            self._objs[k] = self.c.barrier(name, parties=parties)
        self._objs[k].wait(timeout=timeout)

    def delete(self, q: str) -> None:
        self.c.delete_object(q)

    def close(self) -> None:
        self.c.close()


class ZkConn:
    name = "zookeeper"

    def __init__(self, hosts: list[str], idx: int, consistency: str = "linearizable",
                 route: str | None = None, kv: bool | str = False) -> None:
        from kazoo.client import KazooClient
        self.c = KazooClient(hosts=",".join(rotate(hosts, idx)), randomize_hosts=False,
                             timeout=30.0)
        self.c.start(timeout=60)
        self._objs: dict[tuple[str, str], Any] = {}
        self._sync = consistency == "linearizable"

    # reads: getData (the server's own state: ZooKeeper's cheapest read), or sync + getData
    # (sync makes the server catch up with the leader first: the linearizable read)
    def read(self, key: str) -> Any:
        path = f"/paper/read/{key}"
        if self._sync:
            self.c.sync(path)
        return self.c.get(path)[0]

    def write(self, key: str, value: bytes = ITEM) -> None:
        self.c.set(f"/paper/read/{key}", value)

    def setup_read(self, key: str) -> None:
        self.c.ensure_path(f"/paper/read/{key}")
        self.write(key)

    def _q(self, name: str) -> Any:
        from kazoo.recipe.queue import LockingQueue
        k = ("q", name)
        if k not in self._objs:
            self._objs[k] = LockingQueue(self.c, f"/paper/q/{name}")
        return self._objs[k]

    def produce(self, q: str) -> None:
        self._q(q).put(ITEM)

    def consume(self, q: str, timeout: float) -> Any:
        lq = self._q(q)
        v = lq.get(timeout)
        if v is None:
            return None
        if not lq.consume():
            raise RuntimeError("LockingQueue.consume failed (lock lost)")
        return v

    def consume_paper(self, q: str) -> Any:
        """The GESMAS paper's ZooKeeper consume, cheaper than LockingQueue's (no lock node):
        list the entries, sort them, get and delete the first; a delete that finds the node
        gone lost a race with another consumer, so try the next. None when empty."""
        from kazoo.exceptions import NoNodeError
        lq = self._q(q)
        path = lq._entries_path
        for child in sorted(self.c.get_children(path)):
            try:
                data, _ = self.c.get(f"{path}/{child}")
                self.c.delete(f"{path}/{child}")
            except NoNodeError:
                continue
            return data
        return None

    def size(self, q: str) -> int:
        return len(self._q(q))

    def acquire(self, name: str, timeout: float) -> Any:
        from kazoo.recipe.lock import Lock
        k = ("l", name)
        if k not in self._objs:
            self._objs[k] = Lock(self.c, f"/paper/lock/{name}")
        return True if self._objs[k].acquire(timeout=timeout) else None

    def release(self, name: str) -> None:
        self._objs[("l", name)].release()

    def barrier(self, name: str, parties: int, rnd: int, timeout: float) -> None:
        from kazoo.recipe.barrier import DoubleBarrier
        b = DoubleBarrier(self.c, f"/paper/bar/{name}/r{rnd}", parties)
        b.enter()             # no timeout in kazoo: bounded by the worker's deadline
        if not b.participating:
            raise RuntimeError("DoubleBarrier.enter failed")

    def barrier_state(self, name: str, rnd: int) -> str:
        """What a party stuck in round `rnd` should have seen (for the report)."""
        path = f"/paper/bar/{name}/r{rnd}"
        children = self.c.get_children(path) if self.c.exists(path) else []
        arrived = len([ch for ch in children if ch != "ready"])
        return f"{arrived} arrivals, 'ready' node {'exists' if 'ready' in children else 'absent'}"

    def fill(self, q: str, n: int, budget: float) -> int:
        """n items straight into the LockingQueue's entries (create_async, 1000 in flight)."""
        lq = self._q(q)
        lq._ensure_paths()
        path = f"{lq._entries_path}/entry-100-"
        pending: deque[Any] = deque()
        done = 0
        deadline = time.monotonic() + budget
        for _ in range(n):
            if time.monotonic() >= deadline:
                break
            pending.append(self.c.create_async(path, ITEM, sequence=True))
            if len(pending) >= 1000:
                pending.popleft().get(timeout=60)
                done += 1
        while pending:
            pending.popleft().get(timeout=60)
            done += 1
        return done

    def delete(self, q: str) -> None:
        pass   # the ensemble is thrown away at the end

    def close(self) -> None:
        try:
            self.c.stop()
        finally:
            self.c.close()


class EtcdConn:
    """etcd (bench/etcd_cluster.py's gRPC client): one channel to one member."""
    name = "etcd"

    def __init__(self, hosts: list[str], idx: int, consistency: str = "linearizable",
                 route: str | None = None, kv: bool | str = False) -> None:
        from etcd_cluster import EtcdKV
        self.kv = EtcdKV(rotate(hosts, idx)[0])
        self._serializable = consistency != "linearizable"

    # reads: a linearizable Range (ReadIndex through the leader), or a serializable one (the
    # member's own state: etcd's cheapest read)
    def read(self, key: str) -> Any:
        return self.kv.get(f"/paper/read/{key}".encode(), serializable=self._serializable,
                           timeout=OP_TIMEOUT)

    def write(self, key: str, value: bytes = ITEM) -> None:
        self.kv.put(f"/paper/read/{key}".encode(), value, timeout=OP_TIMEOUT)

    def close(self) -> None:
        self.kv.close()


def connect(system: str, endpoints: list[str], idx: int, **opts: Any) -> Any:
    """One connection; opts (reads): consistency ("linearizable", or each system's cheapest
    read: "sequential") and, for gesmas, route and kv (read and write a Map's key)."""
    cls = {"gesmas": GesmasConn, "zookeeper": ZkConn, "etcd": EtcdConn}[system]
    return cls(endpoints, idx, **opts)


# -- worker processes --------------------------------------------------------------------------

