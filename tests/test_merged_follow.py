"""Followed calls with their answers merged (Follow.merge, CallAnswer.also): the replica's
side driven raw (one message for the follows of one run on one stream, and only for those
that asked; a follow withdrawn is left out), and the sync client's process-wide streams
(gesmas.client.merged_follow): every watcher sees every change once, a client that closes
or finds the replica unresponsive ends only its own follows, and the stream ends with its
last follow. Waits are bounded joins and answers, never sleeps as synchronisation."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Iterator

import pytest

from gesmas.client import Client, ClientClosed, convert
from gesmas.client.merged_follow import HUBS
from gesmas.server.cluster import LocalCluster
from gesmas.v1 import gesmas_pb2 as pb
from waiting import WAIT, until
from test_metrics import scrape, value
from test_streams import Raw, leader_of, result

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(nodes=3, fsync=True, metrics=True)     # the merged answers counted
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster.addresses) as c:
        yield c


@pytest.fixture()
def raw(cluster, client):
    r = Raw(leader_of(client))
    yield r
    r.close()


def follow(raw: Raw, call_id: int, obj: str, prefix: str, after: int, merge: bool) -> None:
    """A Map.watch of `prefix` after revision `after` on `raw`, followed."""
    raw.seq += 1
    inv = pb.InvokeRequest(session=raw.session, session_secret=raw.secret, seq=raw.seq,
                           class_name="Map", object_name=obj, method="watch", create=True)
    convert.fill_values(inv.args, [prefix])
    convert.fill_map(inv.kwargs, {"after_revision": after})
    raw.send(pb.Call(id=call_id, invoke=inv, follow=pb.Follow(
        argument="after_revision", key="revision", merge=merge)))


def answered(answer: Any) -> list[int]:
    return sorted([answer.id, *answer.also])


# --- the replica ---------------------------------------------------------------------------


def test_the_follows_of_one_run_get_one_message(raw, client):
    """Three follows of one key from one revision that ask for merged answers and one that
    does not, on one stream: each gets its first answer alone (a follow's first answer is
    its own read, at its consistency), then each change is one message answering the three
    (the same events for each) and one message for the fourth; a watch of another key is
    not in it."""
    m = client.map("mf-one")
    start = m.put("k", 0)["revision"]
    for call_id in (1, 2, 3):
        follow(raw, call_id, "mf-one", "k", start, merge=True)
    follow(raw, 4, "mf-one", "k", start, merge=False)
    follow(raw, 5, "mf-one", "other", start, merge=True)
    m.put("k", 1)
    assert sorted(answered(raw.answer()) for _ in range(4)) == [[1], [2], [3], [4]]
    for i in range(2, 5):
        rev = m.put("k", i)["revision"]
        got = sorted((raw.answer() for _ in range(2)), key=lambda a: len(a.also))
        assert [answered(a) for a in got] == [[4], [1, 2, 3]]
        for a in got:
            assert a.more and not a.HasField("error")
            assert [(e["key"], e["revision"]) for e in result(a)["events"]] == [("k", rev)]
    rev = m.put("other", 1)["revision"]
    only = raw.answer()
    assert answered(only) == [5] and result(only)["revision"] == rev


def test_a_withdrawn_follow_is_left_out_of_the_merged_answer(raw, client):
    """Of three merged follows answered together, one is cancelled: it gets its Cancelled
    answer, and the next change answers the other two in one message, without it."""
    m = client.map("mf-cancel")
    start = m.put("k", 0)["revision"]
    for call_id in (1, 2, 3):
        follow(raw, call_id, "mf-cancel", "k", start, merge=True)
    m.put("k", 1)
    assert sorted(answered(raw.answer()) for _ in range(3)) == [[1], [2], [3]]   # first
    m.put("k", 2)
    assert answered(raw.answer()) == [1, 2, 3]
    raw.send(pb.Call(id=2, cancel=True))
    end = raw.answer()
    assert end.id == 2 and not end.more and end.error.type == "Cancelled"
    m.put("k", 3)
    assert answered(raw.answer()) == [1, 3]


# --- the client -------------------------------------------------------------------------


@contextlib.contextmanager
def watchers(address: str, n: int, key: str, after: int, rounds: int
             ) -> Iterator[tuple[list[Client], list[threading.Thread], list[list[Any]]]]:
    """`n` clients at `address`, each iterating a watch of `key` after `after` on its own
    thread for `rounds` events (or until its iterator fails: the error lands last). The
    clients are closed at the end, and then the process's streams must end."""
    clients = [Client(address, route="replica") for _ in range(n)]
    seen: list[list[Any]] = [[] for _ in range(n)]
    armed = threading.Barrier(n + 1)

    def body(i: int) -> None:
        try:
            it = clients[i].map("mf-client").watch_iter(key, after, timeout=WAIT)
            armed.wait(WAIT)
            for event in it:
                seen[i].append(event["revision"])
                if len(seen[i]) == rounds:
                    break
            it.close()
        except BaseException as e:       # the test looks at it
            seen[i].append(e)
    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        armed.wait(WAIT)
        yield clients, threads, seen
    finally:
        for c in clients:
            c.close()
    until(lambda: HUBS.count() == 0, "the streams ended with their last watch")


def joined(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


@pytest.fixture()
def merged(monkeypatch):
    monkeypatch.setenv("GESMAS_FOLLOW_STREAM", "merged")


def metrics_of(cluster, address: str) -> dict[str, list]:
    member = next(m for m in cluster.members if m.client_addr == address)
    return scrape(member.metrics_addr)


def merged_answers(cluster, address: str) -> float:
    """gesmas_followed_answers_merged_total of the replica at `address`."""
    return value(metrics_of(cluster, address), "gesmas_followed_answers_merged_total")


def readers(cluster, address: str) -> tuple[float, float]:
    """(reads waiting for a change, followed calls in flight) at the replica `address`."""
    got = metrics_of(cluster, address)
    return value(got, "gesmas_waiting_readers"), value(got, "gesmas_followed_calls")


def test_every_watcher_sees_every_change_once_on_one_stream(cluster, client, merged):
    """Eight clients of this process watch one key at one replica: they share one stream
    there and each sees each change once and in order, changes made back to back included;
    once the eight wait as one reader, each change is one message (seven answers in
    another's, counted); the stream ends with the last watch."""
    m = client.map("mf-client")
    start = m.put("k", 0)["revision"]
    address = leader_of(client)
    with watchers(address, 8, "k", start, 5) as (clients, threads, seen):
        until(lambda: HUBS.count() == 1, "the watches on one stream")
        revs = [m.put("k", i)["revision"] for i in (1, 2)]          # back to back
        for i in (3, 4, 5):
            until(lambda: readers(cluster, address) == (1, 8), "the watches waiting as one")
            before = merged_answers(cluster, address)
            revs.append(m.put("k", i)["revision"])
            until(lambda: all(len(s) == len(revs) for s in seen), "every watcher told")
            assert merged_answers(cluster, address) - before == 7
        joined(threads)
        assert seen == [revs] * 8


def test_a_client_that_closes_ends_only_its_own_watch(cluster, client, merged):
    """Of two clients watching through one stream, the one that closes sees its watch end;
    the other sees the next change on the same stream."""
    m = client.map("mf-client")
    start = m.put("j", 0)["revision"]
    address = leader_of(client)
    with watchers(address, 2, "j", start, 2) as (clients, threads, seen):
        first = m.put("j", 1)["revision"]
        until(lambda: all(s for s in seen), "both watchers told")
        clients[0].close()
        threads[0].join(WAIT)
        assert not threads[0].is_alive()
        assert seen[0][0] == first and isinstance(seen[0][-1], ClientClosed)
        second = m.put("j", 2)["revision"]
        threads[1].join(WAIT)
        assert seen[1] == [first, second]


def test_an_unresponsive_replica_moves_only_that_clients_watch(cluster, client, merged):
    """A client that finds the replica unresponsive follows again from its last
    revision (nothing missed, nothing twice); the other client's watch stays on the stream
    and sees the same changes."""
    m = client.map("mf-client")
    start = m.put("u", 0)["revision"]
    address = leader_of(client)
    with watchers(address, 2, "u", start, 4) as (clients, threads, seen):
        revs = [m.put("u", 1)["revision"]]
        until(lambda: all(s for s in seen), "both watchers told")
        clients[0]._unresponsive(address)
        revs += [m.put("u", i)["revision"] for i in (2, 3, 4)]
        joined(threads)
        assert seen == [revs, revs]


def test_a_full_stream_makes_room_on_another(cluster, client, merged, monkeypatch):
    """Follows stay in flight and a replica reads no more from a stream with 1,000 calls in
    flight: past PER_HUB follows (2 here) the next one goes on a stream of its own, and every
    watcher sees every change."""
    monkeypatch.setattr(HUBS, "per_hub", 2)
    m = client.map("mf-client")
    start = m.put("f", 0)["revision"]
    address = leader_of(client)
    with watchers(address, 3, "f", start, 2) as (clients, threads, seen):
        until(lambda: HUBS.count() == 2, "the watches on two streams")
        revs = [m.put("f", i)["revision"] for i in (1, 2)]
        joined(threads)
        assert seen == [revs] * 3


def test_one_asyncio_clients_watches_of_one_key_are_merged(cluster, client):
    """Four watch streams of one key from one asyncio client (its one Calls stream): each
    sees each change, and once they wait as one reader the replica answers the four in one
    message (what a server handing one key's changes to many subscribers does)."""
    from gesmas.aio import Client as AioClient
    m = client.map("mf-aio")
    start = m.put("k", 0)["revision"]
    address = leader_of(client)
    before = merged_answers(cluster, address)

    async def main() -> list[list[int]]:
        async with AioClient(address, route="replica") as a:
            seen: list[list[int]] = [[] for _ in range(4)]

            async def read(i: int) -> None:
                async for got in a.map("mf-aio").watch_stream("k", start, timeout=WAIT):
                    seen[i].append(got["revision"])
                    if len(seen[i]) == 3:
                        return
            tasks = [asyncio.create_task(read(i)) for i in range(4)]
            await asyncio.to_thread(until, lambda: readers(cluster, address)[0] == 4,
                                    "the four first reads waiting")    # not merged
            await asyncio.to_thread(m.put, "k", 1)
            for i in (2, 3):
                await asyncio.to_thread(until, lambda: readers(cluster, address) == (1, 4),
                                        "the follows waiting as one")
                await asyncio.to_thread(m.put, "k", i)
            await asyncio.gather(*tasks)
            return seen
    seen = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert all(s == seen[0] and len(s) == 3 for s in seen)
    assert merged_answers(cluster, address) - before == 6


def test_a_broken_stream_is_replaced_and_ends_with_its_last_follow(cluster):
    """A hub whose stream broke is not given to new follows (they get a new one); the broken
    one is closed when the last follow that held it lets go, the new one with its own."""
    from gesmas.client.merged_follow import Hubs
    from gesmas.client.security import Login
    import grpc
    hubs = Hubs()
    address = cluster.members[0].client_addr
    channels: list[grpc.Channel] = []

    def open_channel(addr: str) -> grpc.Channel:
        channels.append(grpc.insecure_channel(addr))
        return channels[-1]
    login = Login(None, None, None)
    first = hubs.take(address, (), None, open_channel, login, 1 << 20)
    first.stream.cancel()
    until(lambda: not first.stream.usable, "the stream broken")
    second = hubs.take(address, (), None, open_channel, login, 1 << 20)
    assert second is not first and len(channels) == 2 and hubs.count() == 1
    assert hubs.take(address, (), None, open_channel, login, 1 << 20) is second
    hubs.release(first)
    assert hubs.count() == 1
    hubs.release(second)
    assert hubs.count() == 1                   # one follow still holds it
    hubs.release(second)
    assert hubs.count() == 0 and not second.stream.usable
