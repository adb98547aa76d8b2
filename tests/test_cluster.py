"""End-to-end tests against 3 real replica processes (DESIGN §9: few, strong)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gesmas.client import (AlreadyExists, ApplicationError, Client, Fence, InvalidArgument,
                           NotFound, ResourceExhausted, Timeout)
from gesmas.server.cluster import LocalCluster

pytestmark = pytest.mark.cluster

WORKER = os.path.join(os.path.dirname(__file__), "cluster_worker.py")


def wait_for(pred, timeout=30.0, what="condition"):
    """Poll a server-side condition through the API until it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def waiters(c: Client, name: str) -> int:
    for o in c.list_objects():
        if o["name"] == name:
            return o["waiters"]
    return 0


def addr(cluster, i):
    return cluster.members[i].client_addr


def on(cluster, i, **kwargs):
    """A client whose calls stay on replica i (not routed to the leader)."""
    return Client(addr(cluster, i), route="replica", **kwargs)


def test_produce_on_one_replica_consume_on_another(cluster):
    with on(cluster, 0) as a, on(cluster, 1) as b:
        a.queue("t1").produce(b"hello")
        a.queue("t1").produce({"n": 1, "tags": ["x", "y"]})
        assert b.queue("t1").consume(timeout=10) == b"hello"
        assert b.queue("t1").consume(timeout=10) == {"n": 1, "tags": ["x", "y"]}
        assert b.queue("t1").try_consume() is None


def test_a_client_given_a_follower_calls_the_leader(cluster):
    leader = cluster.find_leader()
    follower = next(m for m in cluster.members if m is not leader)
    for route, served_by in (("leader", leader), ("replica", follower)):
        with Client(follower.client_addr, route=route) as c:
            assert c.leader == leader.client_addr  # named in the OpenSession answer
            sent = []
            attempt = c._attempt
            c._attempt = lambda address, *a, **kw: (sent.append(address)
                                                    or attempt(address, *a, **kw))
            c.queue("t0").produce(route)
            assert c.queue("t0").consume(timeout=10) == route
            assert set(sent) == {served_by.client_addr}, route


def test_blocked_consumer_released_by_produce_on_other_replica(cluster):
    with on(cluster, 1) as consumer, on(cluster, 2) as producer:
        q = consumer.queue("t2")
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("item", q.consume(timeout=30)))
        t.start()
        wait_for(lambda: waiters(producer, "t2") == 1, what="the consumer to block")
        assert "item" not in got
        producer.queue("t2").produce("wake")
        t.join(30)
        assert got["item"] == "wake"


def test_200_blocked_consumers_released_in_fifo_order(cluster):
    n = 200
    with on(cluster, 0) as c, on(cluster, 2) as p:
        q = c.queue("t3")
        results = [None] * n
        threads = []
        for i in range(n):
            def consume(i=i):
                results[i] = q.consume(timeout=120)
            t = threading.Thread(target=consume)
            t.start()
            threads.append(t)
            wait_for(lambda i=i: waiters(p, "t3") == i + 1, what=f"consumer {i} to block")
        pq = p.queue("t3")
        for i in range(n):
            pq.produce(i)
        for t in threads:
            t.join(60)
        assert results == list(range(n))


def test_objects_listed_by_page_through_both_clients(cluster):
    """ListObjects through real replicas: pages in name order whatever the creation order,
    tokens followed by the clients, prefix and class filters, limits checked by the server
    with an error that names the field."""
    import asyncio

    from gesmas.aio import Client as AioClient
    from gesmas.v1 import gesmas_pb2 as pb

    names = sorted([f"paged/{i:03d}" for i in range(25)] + ["paged/é", "paged/\U0001f600"])
    with on(cluster, 1) as c:
        for n in reversed(names):
            c.counter(n)
        c.lock("paged/~lock")
        c.counter("paged-not")                         # outside the prefix, next to it
        c.counter("paged0")
        everything = sorted(names + ["paged/~lock"])
        assert [o["name"] for o in c.iter_objects(prefix="paged/", page_size=7)] == everything
        assert [o["name"] for o in c.list_objects(prefix="paged/", class_name="Lock")] == \
            ["paged/~lock"]
        assert [o["name"] for o in c.list_objects(prefix="paged/", limit=3)] == everything[:3]
        listed = [o["name"] for o in c.list_objects()]            # every object, by page
        assert listed == sorted(listed) and set(everything) <= set(listed)
        resp = c._call("ListObjects", pb.ListObjectsRequest(prefix="paged/", limit=26))
        assert [o.name for o in resp.objects] == everything[:26]
        assert resp.next_page_token == everything[25]
        resp = c._call("ListObjects", pb.ListObjectsRequest(
            prefix="paged/", page_token=resp.next_page_token))
        assert [o.name for o in resp.objects] == everything[26:] and resp.next_page_token == ""
        for request, says in ((pb.ListObjectsRequest(limit=10_001), "limit must be 0"),
                              (pb.ListObjectsRequest(limit=-1), "not -1"),
                              (pb.ListObjectsRequest(prefix="x" * 257), "prefix must be at"),
                              (pb.ListObjectsRequest(page_token="x" * 300), "page_token")):
            with pytest.raises(InvalidArgument, match=says):
                c._call("ListObjects", request)

    async def aio() -> list[str]:
        async with AioClient(addr(cluster, 2), route="replica") as a:
            return [o["name"] async for o in a.iter_objects(prefix="paged/", page_size=5)]
    assert asyncio.run(aio()) == everything


def test_barrier_of_three_clients_on_three_replicas(cluster):
    clients = [on(cluster, i) for i in range(3)]
    try:
        out = {}
        def party(i):
            out[i] = clients[i].barrier("t4", parties=3).wait(timeout=30)
        threads = [threading.Thread(target=party, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: waiters(clients[2], "t4") == 2, what="two parties at the barrier")
        assert out == {}
        party(2)
        for t in threads:
            t.join(30)
        assert sorted(out.values()) == [0, 1, 2]
    finally:
        for c in clients:
            c.close()


def test_lock_mutual_exclusion_8_processes_increasing_fences(cluster):
    procs = [subprocess.Popen([sys.executable, WORKER, "lock_loop", addr(cluster, i % 3), "15"],
                              stdout=subprocess.PIPE, text=True) for i in range(8)]
    try:
        outs = [json.loads(p.communicate(timeout=240)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    records = [r for out in outs for r in out]
    assert len(records) == 8 * 15
    assert all(r["inside"] == 1 for r in records), "two holders inside at once"
    fences = [r["fence"] for r in records]
    assert len(set(fences)) == len(fences), "a fence was granted twice"
    for out in outs:                           # each process sees its fences increase
        own = [r["fence"] for r in out]
        assert own == sorted(own)


def test_custom_class_uploaded_via_one_replica_called_via_another(cluster):
    source = '''
import heapq

class PriorityQueue:
    """Items come out lowest priority first; get() waits while empty."""
    def __init__(self, limit):
        self.limit = limit
        self.heap = []
        self.ready = Semaphore(0)

    def put(self, priority, item):
        if len(self.heap) >= self.limit:
            raise OverflowError("priority queue is full")
        heapq.heappush(self.heap, [priority, item])
        self.ready.release()

    def get(self):
        self.ready.acquire()
        return heapq.heappop(self.heap)[1]
'''
    with on(cluster, 0) as a, on(cluster, 1) as b:
        assert a.register_class(source) == {"PriorityQueue": 1}
        assert a.register_class(source) == {"PriorityQueue": 1}      # same source: no-op
        pq = b.object("PriorityQueue", "urgent", 10)
        pq.put(5, "low")
        pq.put(1, "high")
        assert pq.get(timeout=10) == "high"
        assert pq.get(timeout=10) == "low"
        with pytest.raises(Timeout):
            pq.get(timeout=0.3)


def test_bad_inputs_get_their_codes_and_cluster_stays_healthy(cluster):
    with on(cluster, 2) as c:
        with pytest.raises(NotFound, match="no class"):
            c.object("NoSuchClass", "x")
        with pytest.raises(NotFound, match="no object"):
            c.delete_object("never-made")
        q = c.queue("t7")
        with pytest.raises(NotFound, match="no method"):
            q.fly()
        with pytest.raises(InvalidArgument, match="argument"):
            q.produce()                                   # missing argument
        with pytest.raises(ApplicationError, match="capacity") as e:
            c.queue("t7b", capacity="ten")                # the constructor refuses the type
        assert e.value.type == "ValueError"
        with pytest.raises(InvalidArgument, match="Queue.*'size'"):
            c.queue("t7c", capacity=1, size=2)            # no such constructor argument
        with pytest.raises(AlreadyExists):
            c.lock("t7")                                  # t7 is a Queue
        c.queue("t7d", capacity=100)
        with pytest.raises(AlreadyExists, match="exists with capacity=100, not capacity=1"):
            c.queue("t7d", capacity=1)                    # not answered from the client's cache
        assert c.queue("t7d").size() == 0                 # no capacity named: any will do
        with pytest.raises(InvalidArgument, match="line 2"):
            c.register_class("class Broken:\n    def f(self)\n        return 1\n")
        with pytest.raises(InvalidArgument, match="not allowed"):
            c.register_class("import os\nclass Evil:\n    pass\n")
        c.register_class("class Thrower:\n    def boom(self):\n"
                         "        raise KeyError('no such thing')\n")
        with pytest.raises(ApplicationError) as e:
            c.object("Thrower", "t7t").boom()
        assert e.value.type == "KeyError" and "no such thing" in str(e.value)
        with pytest.raises((ResourceExhausted, InvalidArgument)):
            q.produce(b"x" * (20 * 1024 * 1024))          # over the 16 MiB message limit
        c.register_class("class Spinner:\n    def spin(self):\n        while True:\n"
                         "            pass\n")
        with pytest.raises(ResourceExhausted, match="budget"):
            c.object("Spinner", "t7s").spin()
        q.produce("still fine")                            # the cluster is healthy
        assert q.consume(timeout=10) == "still fine"
        st = c.status()
        assert st["leader_address"]


def test_killed_lock_holder_loses_lock_after_ttl(cluster):
    holder = subprocess.Popen([sys.executable, WORKER, "hold_lock", addr(cluster, 0)],
                              stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(holder.stdout.readline())["fence"]
        with on(cluster, 1, session_ttl=5.0) as c:
            lock = c.lock("doomed")
            got = {}
            t = threading.Thread(target=lambda: got.setdefault("fence", lock.acquire(timeout=60)))
            t.start()
            wait_for(lambda: waiters(c, "doomed") == 1, what="the second client to wait")
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
            t.join(60)
            assert got["fence"] > first
            assert lock.is_owner()
            lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_a_local_cluster_that_does_not_get_ready_is_stopped(monkeypatch):
    """`with LocalCluster()` stops its processes by pid when start() fails, and a replica
    cannot be started twice (the second set of processes would leak)."""
    cl = LocalCluster()
    started = []

    def not_ready(timeout: float = 60.0, stop=None) -> None:
        started.extend(m.proc for m in cl.members)
        with pytest.raises(RuntimeError, match="already running"):
            cl.start_member(cl.members[0])
        raise TimeoutError("not ready (test)")

    monkeypatch.setattr(cl, "wait_ready", not_ready)
    with pytest.raises(TimeoutError, match="not ready"):
        with cl:
            pass
    assert len(started) == 3 and all(p is not None and p.poll() is not None for p in started)


def test_one_call_is_one_commit_however_the_accessor_is_written(cluster):
    """`c.queue("jobs").produce(x)` in a loop: the accessor's get-or-create commits once per
    client, then every call is one command that gets-or-creates and calls (issue "Faster
    than ZooKeeper": it used to cost two commits per item)."""
    with Client(cluster.addresses) as c:
        before = c.status()["commit_index"]
        for i in range(20):
            c.queue("one-commit").produce(i)
        after = c.status()["commit_index"]
        # 20 produces + 1 create + the two Status reads (+ a few duties: ticks, checkpoints)
        assert after - before <= 20 + 1 + 2 + 3, after - before
        assert [c.queue("one-commit").consume(timeout=0) for _ in range(20)] == list(range(20))
        # another client deletes it: the proxy's next call makes it again, as an accessor would
        with Client(cluster.addresses) as other:
            other.delete_object("one-commit")
        c.queue("one-commit").produce("again")
        with Client(cluster.addresses) as other:
            assert other.queue("one-commit").consume(timeout=0) == "again"
            other.delete_object("one-commit")
            other.lock("one-commit")                     # now a Lock: the proxy's call says so
        with pytest.raises(AlreadyExists):
            c.queue("one-commit").produce(1)


def test_objects_behave_as_threading_users_expect(cluster):
    """Issue "Fit the Python ecosystem", part 1: huge timeouts, RuntimeError on a release by
    a non-holder, BrokenBarrierError, unowned semaphores."""
    import threading
    with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
        lock = a.lock("py-lock")
        for timeout in (threading.TIMEOUT_MAX, float("inf"), 1e300):
            assert lock.acquire(timeout=timeout) > 0     # reaches the server, is granted
            lock.release()
        with pytest.raises(RuntimeError):                 # as threading.Lock().release()
            b.lock("py-lock").release()
        holder = threading.Thread(target=lambda: b.lock("py-lock").acquire(
            timeout=threading.TIMEOUT_MAX))
        lock.acquire()
        holder.start()
        _wait(lambda: lock.invoke("waiters") == 1)
        lock.release()                                    # hands over to the huge-timeout wait
        holder.join(30)
        assert not holder.is_alive() and b.lock("py-lock").is_owner()
        b.lock("py-lock").release()

        barrier = a.barrier("py-barrier", parties=3)
        with pytest.raises(threading.BrokenBarrierError):
            barrier.wait(timeout=0.2)
        assert barrier.broken and b.barrier("py-barrier", parties=3).broken
        with pytest.raises(threading.BrokenBarrierError):
            b.barrier("py-barrier", parties=3).wait()
        barrier.reset()
        assert not barrier.broken and barrier.parties == 3 and barrier.n_waiting == 0

        items = a.semaphore("py-items", permits=0, owned=False)
        consumer = threading.Thread(target=lambda: b.semaphore(
            "py-items", permits=0, owned=False).acquire(timeout=30))
        consumer.start()
        _wait(lambda: items.invoke("waiters") == 1)
        items.release()                                   # a producer releases for a consumer
        consumer.join(30)
        assert not consumer.is_alive()
        bounded = a.semaphore("py-bounded", permits=1, owned=False, bounded=True)
        with pytest.raises(ValueError, match="too many"):
            bounded.release()


def test_threading_idioms_acquire_false_locked_and_timeouts(cluster):
    """Issue 26, point 14: ``acquire(False)`` answers False instead of failing, lock
    proxies have ``locked()``, a Timeout is a TimeoutError, and a Queue's timeouts are
    ``queue.Empty`` / ``queue.Full`` as ``queue.Queue``'s."""
    import queue
    with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
        lock, other = a.lock("idiom-lock"), b.lock("idiom-lock")
        assert not lock.locked()
        fence = lock.acquire(False)
        assert fence is not False and fence > 0 and fence.held
        assert lock.locked() and other.locked()
        assert other.acquire(False) is False
        assert other.acquire(blocking=False) is False
        with pytest.raises(ValueError, match="non-blocking"):
            other.acquire(False, timeout=1)
        with pytest.raises(TypeError, match=r"acquire\(timeout=5\)"):
            other.acquire(5)                      # not taken for a timeout: it would wait
        with pytest.raises(TimeoutError):
            other.acquire(timeout=0)
        lock.release()
        assert not lock.locked()
        assert other.acquire(blocking=False) > fence
        other.release()

        sem = a.semaphore("idiom-sem", permits=1)
        assert sem.acquire(False) is True
        assert b.semaphore("idiom-sem").acquire(blocking=False) is False
        sem.release()

        q = a.queue("idiom-q", capacity=1)
        with pytest.raises(queue.Empty) as empty:
            q.consume(timeout=0)
        assert isinstance(empty.value, Timeout) and isinstance(empty.value, TimeoutError)
        with pytest.raises(queue.Empty):
            q.reserve(timeout=0)
        q.produce("x")
        with pytest.raises(queue.Full) as full:
            q.produce("y", timeout=0)
        assert isinstance(full.value, Timeout) and not isinstance(full.value, queue.Empty)
        assert q.consume(timeout=0) == "x"


def test_peek_len_and_campaign_as_the_readme_says(cluster):
    """Issue 26, point 17: peek tells an empty queue from a queued None, len(proxy) calls
    the class's __len__, campaign() returns the term (a fence)."""
    with Client(cluster.addresses) as c:
        q = c.queue("small-q")
        assert len(q) == 0 and q                          # a proxy is true, even when empty
        with pytest.raises(IndexError):
            q.peek()
        q.produce(None)
        assert q.peek() is None and len(q) == 1
        with pytest.raises(TypeError, match="Counter objects have no len"):
            len(c.counter("small-c"))
        election = c.election("small-e")
        term = election.campaign("me")
        assert type(term) is Fence and term > 0 and term.held and election.leading
        assert election.leader() == {"session": c.session, "value": "me", "term": term}
        election.resign()
        assert not term.held


def _wait(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)
