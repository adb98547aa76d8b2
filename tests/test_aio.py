"""The asyncio client (gesmas.aio) against real 3-process clusters: the calls, cancellation
that withdraws the server-side wait, many waiting tasks in one process, fail-over, TLS and
login. The retry rules are the synchronous client's (gesmas.client.core)."""
from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from gesmas.aio import Client
from gesmas.client import AlreadyExists, Timeout
from gesmas.server.cluster import LocalCluster


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def until(pred, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_calls_locks_and_barriers(cluster):
    async def main():
        async with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
            q = a.queue("aio-q")
            await q.produce(b"job-1")
            assert await b.queue("aio-q").consume(timeout=5) == b"job-1"
            with pytest.raises(Timeout):
                await q.consume(timeout=0.1)
            async with a.lock("aio-lock") as fence:
                assert fence > 0
                waiter = asyncio.create_task(b.lock("aio-lock").acquire())
                await until(lambda: a.lock("aio-lock").waiters(), 10)
                assert not waiter.done()
            assert await waiter > fence
            await b.lock("aio-lock").release()
            results = await asyncio.gather(*(c.barrier("aio-b", parties=3).wait(timeout=10)
                                             for c in (a, b, a)))
            assert sorted(results) == [0, 1, 2]
            with pytest.raises(AlreadyExists):
                await a.lock("aio-q").acquire()           # a Queue: said by the first call
            assert await a.queue("aio-cap", capacity=2).size() == 0
            # threading idioms, awaited (issue 26, point 14)
            la, lb = a.lock("aio-idiom"), b.lock("aio-idiom")
            assert await la.acquire(False) > 0 and await lb.locked()
            assert await lb.acquire(blocking=False) is False
            await la.release()
            assert not await lb.locked()
            assert await a.semaphore("aio-sem", permits=1).acquire(False) is True
            assert await b.semaphore("aio-sem").acquire(False) is False
            with pytest.raises(queue.Empty):
                await a.queue("aio-cap").consume(timeout=0)
            with pytest.raises(AlreadyExists, match="capacity=2, not capacity=3"):
                await a.queue("aio-cap", capacity=3).size()
    run(main())


def test_what_the_readme_says_aio_shares(cluster):
    """Issue 26, point 6: rwlock read()/write(), the election helpers and the barrier's
    parties / n_waiting / broken, awaited."""
    async def main():
        async with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
            rw, other = a.rwlock("aio-rw"), b.rwlock("aio-rw")
            base = (await a.status())["waiter_count"]

            async def waiting(n: int) -> bool:
                return (await a.status())["waiter_count"] == base + n

            async with rw.read():
                async with other.read():                  # readers share
                    pass
                writer = asyncio.create_task(_write_once(other))
                await until(lambda: waiting(1))
                assert not writer.done()                  # a writer waits for the reader
            await asyncio.wait_for(writer, 20)
            async with rw.write(timeout=10):
                with pytest.raises(Timeout):
                    async with other.read(timeout=0):
                        pass

            e = a.election("aio-election")
            assert await e.leader() is None
            term = await e.campaign("a")
            assert e.leading and term.held
            seen = await b.election("aio-election").leader()
            assert (seen["value"], seen["term"]) == ("a", term)
            change = asyncio.create_task(b.election("aio-election").observe(term, timeout=20))
            # observe waits on the replica (a reader), not as a kernel waiter: before or after
            # the resign, it answers the same
            await e.resign()
            assert not e.leading and await change is None   # woken: nobody leads now

            barrier = a.barrier("aio-parties", parties=2)
            assert await barrier.parties() == 2 and await barrier.n_waiting() == 0
            party = asyncio.create_task(b.barrier("aio-parties", parties=2).wait(timeout=20))
            await until(lambda: waiting(1))
            assert await barrier.n_waiting() == 1
            assert not await barrier.broken()
            await barrier.abort()
            assert await barrier.broken()
            with pytest.raises(threading.BrokenBarrierError):
                await party
            await barrier.reset()
            assert not await barrier.broken()
    run(main())


async def _write_once(c_rw) -> None:
    async with c_rw.write(timeout=20):
        pass


def test_a_cancelled_consumer_takes_no_item(cluster):
    async def main():
        async with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
            q = a.queue("aio-cancel")
            consumer = asyncio.create_task(q.consume())
            await until(lambda: _waiters(a, "aio-cancel", 1))
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            await until(lambda: _waiters(a, "aio-cancel", 0))   # the wait was withdrawn
            await b.queue("aio-cancel").produce("item")
            assert await b.queue("aio-cancel").consume(timeout=5) == "item"
    run(main())


async def _waiters(c: Client, name: str, n: int) -> bool:
    return await c.queue(name).invoke("size") >= 0 and \
        (await c.status())["waiter_count"] == n


def test_two_thousand_tasks_wait_in_one_process_and_nothing_is_lost(cluster):
    n = 2000

    async def main():
        async with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
            q = a.queue("aio-many")
            consumers = [asyncio.create_task(q.consume(timeout=90)) for _ in range(n)]
            await until(lambda: _at_least(a, n), 60)
            await asyncio.gather(*(b.queue("aio-many").produce(i) for i in range(n)))
            got = await asyncio.gather(*consumers)
            assert sorted(got) == list(range(n))
            # 2000 calls on one replica: more than one Calls stream (a replica takes 1000 at
            # a time from one)
            assert max(len(pool) for pool in a._streams.values()) >= 2
    run(main())


async def _at_least(c: Client, n: int) -> bool:
    return (await c.status())["waiter_count"] >= n


def test_a_waiting_call_survives_the_leader_dying():
    with LocalCluster() as cl:
        async def main():
            async with Client(cl.addresses, retry_timeout=60) as a:
                q = a.queue("aio-failover")
                consumer = asyncio.create_task(q.consume(timeout=90))
                await until(lambda: _at_least(a, 1))
                leader = await asyncio.to_thread(cl.find_leader)
                await asyncio.to_thread(cl.kill, leader)
                async with Client([m.client_addr for m in cl.members if m is not leader],
                                  retry_timeout=60) as b:
                    await b.queue("aio-failover").produce("after")
                assert await consumer == "after"
        run(main())


def test_tls_and_login():
    with LocalCluster(secure=True) as cl:
        async def main():
            async with Client(cl.addresses, **cl.client_options()) as root:
                await root.auth("user_add", name="ann", password="ann-password")
                await root.counter("c").add(1)
            async with Client(cl.addresses, **cl.client_options("ann", "ann-password")) as ann:
                from gesmas.client import PermissionDenied
                with pytest.raises(PermissionDenied):
                    await ann.counter("c").get()
        run(main())


def test_the_sync_and_async_clients_share_their_rules():
    """One implementation of routing and retries (no copy): both clients use core's."""
    import gesmas.aio as aio
    import gesmas.client.client as sync
    from gesmas.client import core
    assert "Attempts" not in vars(aio) and "Attempts" not in vars(sync)
    assert aio.core is core and sync.core is core


def test_unary_invoke_still_works(cluster):
    async def main():
        async with Client(cluster.addresses, call_stream=False) as c:
            await c.queue("aio-unary").produce(1)
            assert await c.queue("aio-unary").consume(timeout=5) == 1
            assert not c._streams
    run(main())
