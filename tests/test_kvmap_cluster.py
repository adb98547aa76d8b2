"""The standard Map against one real 3-process cluster (shared by the module; it takes a
checkpoint every 30 commands, at most one per 5 s): every call through the sync client, the
asyncio client and the CLI; reads without log entries; ephemeral entries across a client's
death (session expiry) and a leader's; watches that wait through a leader failover and
through checkpoints and see each change once."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from gesmas.client import ApplicationError, Client, Compacted, Replaced, Timeout
from gesmas.client.cli import main as cli
from gesmas.server.cluster import LocalCluster

try:
    from tests.test_metrics import scrape, value
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from test_metrics import scrape, value

pytestmark = pytest.mark.cluster

WORKER = os.path.join(os.path.dirname(__file__), "cluster_worker.py")
CHECKPOINT_EVERY = 30


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(nodes=3, fsync=True, metrics=True,
                     env={"GESMAS_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY)})
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def checkpoints(cluster) -> list[float]:
    """Each replica's last checkpoint index (its metrics)."""
    return [value(scrape(m.metrics_addr), "gesmas_checkpoint_index") for m in cluster.members]


def waiting_readers(member, want: float) -> None:
    """Poll `member`'s metrics until it has `want` waiting readers (30 s at most)."""
    deadline = time.monotonic() + 30
    while value(scrape(member.metrics_addr), "gesmas_waiting_readers") != want:
        assert time.monotonic() < deadline, want
        time.sleep(0.02)


def leader_commit(cluster) -> int:
    st = cluster.member_status(cluster.find_leader())
    assert st is not None
    return st["commit_index"]


def test_every_call_through_the_client_and_reads_without_entries(cluster):
    with Client(cluster.addresses) as c, \
            Client(cluster.addresses, route="replica", consistency="sequential") as seq:
        m = c.map("cfg", history=50)
        assert m.put("db/host", "10.0.0.5") == {"revision": 1, "version": 1}
        assert m.put("db/port", 5432)["revision"] == 2
        assert m.cas("flags/dark", 0, True) is True and m.cas("flags/dark", 0, 1) is False
        r = m.txn([["flags/dark", "value", "==", True]], [["put", "flags/dark", False]],
                  [["delete", "db/port"]])
        assert r["succeeded"] and r["revision"] == 4
        before = leader_commit(cluster)
        for _ in range(10):
            assert m.get("db/host") == "10.0.0.5" and m.get("nope", 7) == 7
            assert m.entry("flags/dark")["version"] == 2
            assert m.keys("db/")["keys"] == ["db/host", "db/port"]
            assert m.items("", 1, "db/port")["items"][0]["key"] == "flags/dark"
            assert m.revision() == 4 and m.size() == 3
            assert seq.map("cfg").get("db/port") == 5432       # its own replica, in order
            assert m.get("db/host", consistency="sequential") == "10.0.0.5"
        assert leader_commit(cluster) - before <= 3          # a tick or a no-op at most
        assert m.delete("db/port") is True and m.delete("db/port") is False
        m["db/user"] = "app"                                 # as a dict
        assert m["db/user"] == "app" and "db/user" in m and "db/port" not in m
        assert len(m) == 3
        del m["db/user"]
        with pytest.raises(KeyError):
            m["db/user"]
        with pytest.raises(KeyError):
            del m["db/user"]
        w = m.watch("db/", 0)
        assert [(e["type"], e["key"]) for e in w["events"]] == [
            ("put", "db/host"), ("put", "db/port"), ("delete", "db/port"), ("put", "db/user"),
            ("delete", "db/user")]
        with pytest.raises(Timeout):
            m.watch("db/", w["revision"], timeout=0.3)
        with pytest.raises(ValueError) as bad:              # a remote ValueError
            m.put("k" * 2000, 1)
        assert "max_key_bytes" in str(bad.value)
        with pytest.raises(ApplicationError) as bad:
            m.txn([["a", "colour", "==", 1]], [])
        assert "compare target" in str(bad.value)
        for i in range(80):                                 # past history + 16: trimmed
            m.put("churn", i)
        with pytest.raises(Compacted) as old:               # also a LookupError
            m.watch("", 1)
        assert "keeps the changes after revision" in str(old.value)


def test_the_asyncio_client_and_a_waiting_watch(cluster):
    async def main() -> None:
        from gesmas.aio import Client as AioClient
        async with AioClient(cluster.addresses) as a, AioClient(cluster.addresses) as b:
            m = a.map("aio-cfg")
            rev = await m.revision()
            watcher = asyncio.create_task(b.map("aio-cfg").watch("feature/", rev,
                                                                 timeout=30))
            await m.put("other", 1)
            await m.put("feature/x", "on")
            got = await watcher
            assert [e["key"] for e in got["events"]] == ["feature/x"]
            assert got["revision"] == rev + 2
            assert await m.cas("feature/x", 1, "off") is True
            assert (await m.txn([], [["get", "feature/x"]]))["results"][0]["value"] == "off"
            assert await m.get("feature/x", consistency="sequential") == "off"
            assert (await m.keys())["keys"] == ["feature/x", "other"]
            stream = m.watch_iter("", rev)
            assert [(await stream.__anext__())["key"] for _ in range(3)] == [
                "other", "feature/x", "feature/x"]
            await stream.aclose()
            assert await m.delete("other") is True and await m.size() == 1
            st = await m.stat()
            assert st == {"revision": rev + 4, "size": 1, "created": st["created"]}
            await b.delete_object("aio-cfg")
            await b.map("aio-cfg").put("feature/x", "remade")
            with pytest.raises(Replaced):              # the old map's revision and created
                await m.watch("feature/", 0, created=st["created"], timeout=30)
            with pytest.raises(Replaced):
                await m.watch_stream("", 0, created=st["created"]).__anext__()
    asyncio.run(asyncio.wait_for(main(), 120))


def test_the_cli(cluster, capsys):
    base = ["--cluster", cluster.addresses]

    def run(*argv: str) -> str:
        assert cli(["map", "cli-cfg", *argv, *base]) == 0
        return capsys.readouterr().out

    assert json.loads(run("put", "a/1", "42")) == {"revision": 1, "version": 1}
    run("put", "a/2", '{"x": [1, 2]}')
    assert json.loads(run("get", "a/2")) == {"x": [1, 2]}
    assert json.loads(run("get", "a/1", "--entry"))["version"] == 1
    assert run("cas", "a/1", "1", "43") == "true\n"
    assert run("keys", "a/") == "a/1\na/2\n"
    assert [json.loads(x)["key"] for x in run("items", "--limit", "1").splitlines()] == ["a/1"]
    out = json.loads(run("txn", "--compares", '[["a/1", "version", "==", 2]]',
                         "--success", '[["delete", "a/2"]]'))
    assert out["succeeded"] is True
    lines = run("watch", "a/", "--after", "0", "--count", "4").splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["put", "put", "put", "delete"]
    assert run("revision") == "4\n"
    st = json.loads(run("stat"))
    assert st["revision"] == 4 and st["size"] == 1 and st["created"] > 0
    assert cli(["map", "cli-cfg", "cas", "a/1", "one", "2", *base]) == 2
    assert "VERSION must be an integer" in capsys.readouterr().err
    assert cli(["map", "cli-cfg", "txn", "--success", "{", *base]) == 2
    assert "--success: not valid JSON" in capsys.readouterr().err
    assert cli(["map", "cli-cfg", "watch", "--count", "0", *base]) == 2
    assert "--count must be at least 1" in capsys.readouterr().err
    assert cli(["map", "cli-cfg", "items", "--limit", "-3", *base]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err
    assert cli(["map", "cli-cfg", "put", "", "1", *base]) == 1         # the server's refusal
    assert "a key must be a non-empty str" in capsys.readouterr().err


def test_ephemeral_entries_and_a_waiting_watch_across_a_leader_failover(cluster):
    """A service process holds an ephemeral entry; it and the leader are killed together
    while a watch waits and another service (alive) holds its own entry. The watch, retried
    at another replica, sees each later change exactly once; the dead service's session
    expires by the next leader's count (its entry deleted, once); the live one's session
    lives on (the new leader gives it a fresh TTL) until its client closes."""
    worker = subprocess.Popen([sys.executable, WORKER, "hold_ephemeral", cluster.addresses,
                               "failover", "svc/worker"], stdout=subprocess.PIPE, text=True)
    try:
        json.loads(worker.stdout.readline())
        with Client(cluster.addresses, session_ttl=5.0) as service, \
                Client(cluster.addresses) as writer, Client(cluster.addresses) as reader:
            start = service.map("failover").put("svc/a", "10.0.0.7", ephemeral=True)
            start = start["revision"]
            m = writer.map("failover")
            assert m.entry("svc/worker")["ephemeral"] is True
            seen: list = []
            failed: list = []

            def watch() -> None:
                try:
                    for event in reader.map("failover").watch_iter("cfg/", start, timeout=60):
                        seen.append(event)
                        if len(seen) == 3:
                            return
                except BaseException as e:          # shown by the assertion below
                    failed.append(e)

            watcher = threading.Thread(target=watch)
            watcher.start()
            m.put("cfg/1", 1)
            old = cluster.find_leader()
            os.kill(worker.pid, signal.SIGKILL)
            cluster.kill(old, signal.SIGKILL)
            worker.wait(10)
            try:
                m.put("cfg/2", 2)
                m.txn([], [["put", "cfg/3", 3], ["put", "other", 0]])
                watcher.join(90)
                assert not failed, failed
                assert [(e["key"], e["value"]) for e in seen] == [
                    ("cfg/1", 1), ("cfg/2", 2), ("cfg/3", 3)]
                assert [e["revision"] for e in seen] == [start + 1, start + 2, start + 3]
                gone = m.watch("svc/", start, timeout=60)      # the dead service's session
                assert [(e["type"], e["key"]) for e in gone["events"]] == [
                    ("delete", "svc/worker")]
                assert m.get("svc/a") == "10.0.0.7"          # the live one's lives on
            finally:
                cluster.start_member(old)
                cluster.wait_caught_up(old, timeout=60)
            rev = m.revision()
            service.close()
            got = m.watch("svc/", rev, timeout=30)
            assert [(e["type"], e["key"]) for e in got["events"]] == [("delete", "svc/a")]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def test_the_recipes_of_the_example(cluster):
    """docs/examples/map_recipes.py: a registry whose dead instance leaves, configuration
    that follows each change, a flag changed by cas while another client changes it too."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "examples", "map_recipes.py")
    spec = importlib.util.spec_from_file_location("map_recipes", path)
    recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipes)
    with Client(cluster.addresses) as a, Client(cluster.addresses) as b:
        rev = recipes.register(a, "api", "a", "10.0.0.1:80")
        recipes.register(b, "api", "b", "10.0.0.2:80")
        recipes.register(b, "api", "b", "10.0.0.2:80", healthy=False)
        assert recipes.healthy_instances(a, "api") == {"a": "10.0.0.1:80"}
        b.close()                                  # its instance leaves
        changes = recipes.membership_changes(a, "api", rev, timeout=30)
        assert [next(changes)[:2] for _ in range(3)] == [("put", "b"), ("put", "b"),
                                                         ("delete", "b")]
        seen: list = []
        stop = threading.Event()
        a.map("config").put("app/level", "info")

        def apply(cfg):
            seen.append(cfg)
            return len(seen) < 3
        follower = threading.Thread(target=lambda: recipes.follow_config(
            a, "app/", apply, stop, timeout=30))
        follower.start()
        with Client(cluster.addresses) as w:
            m = w.map("config")
            m.put("other/x", 1)                    # not under app/: no call of apply
            m.put("app/level", "debug")
            m.put("app/workers", 4)
            follower.join(60)
            flips = [threading.Thread(target=recipes.set_flag,
                                      args=(cl, "dark", lambda v: (v or 0) + 1))
                     for cl in (a, w) for _ in range(3)]
            for t in flips:
                t.start()
            for t in flips:
                t.join(60)
        stop.set()
        assert seen == [{"level": "info"}, {"level": "debug"},
                        {"level": "debug", "workers": 4}]
        assert a.map("flags").get("dark") == 6     # no increment lost


def test_watches_waiting_through_checkpoints_see_each_change_once(cluster):
    """Watchers wait on every replica (sequential reads, each its own replica) while other
    keys change past a checkpoint on every replica; then each sees the changes under its
    prefix, once, in order, and watching on from its answer misses nothing."""
    with Client(cluster.addresses) as w:
        m = w.map("ck")
        start = m.put("ck/0", 0)["revision"]
        got: dict[int, list] = {}
        failed: list = []

        def watch(i: int) -> None:
            try:
                with Client(cluster.members[i].client_addr, route="replica",
                            consistency="sequential") as c:
                    events = []
                    for event in c.map("ck").watch_iter("ck/", start, timeout=60):
                        events.append((event["key"], event["revision"]))
                        if len(events) == 3:
                            break
                    got[i] = events
            except BaseException as e:          # shown by the assertion below
                failed.append(e)
        watchers = [threading.Thread(target=watch, args=(i,)) for i in range(3)]
        for t in watchers:
            t.start()
        before = max(checkpoints(cluster))
        for i in range(CHECKPOINT_EVERY + 5):
            m.put(f"other/{i}", i)
        deadline = time.monotonic() + 30          # the leader proposes one within 5 s
        while min(checkpoints(cluster)) <= before:
            assert time.monotonic() < deadline, checkpoints(cluster)
            time.sleep(0.1)
        r1 = m.put("ck/1", 1)["revision"]
        r2 = m.txn([], [["put", "ck/2", 2], ["delete", "ck/0"]])["revision"]
        for t in watchers:
            t.join(60)
        assert not failed, failed
        want = [("ck/1", r1), ("ck/2", r2), ("ck/0", r2)]
        assert got == {0: want, 1: want, 2: want}


def test_a_put_wakes_only_the_watches_of_its_key(cluster):
    """Ten watches of ten keys and one of their common prefix wait on one replica (its
    metrics count them, and each waiting read it wakes): a put wakes the watch of its key
    and the prefix's, a put elsewhere in the map wakes none."""
    m0 = cluster.members[0]

    def metric(name: str) -> float:
        return value(scrape(m0.metrics_addr), name)

    def until(name: str, want: float) -> None:
        deadline = time.monotonic() + 30
        while metric(name) != want:
            assert time.monotonic() < deadline, (name, metric(name), want)
            time.sleep(0.02)

    with Client(cluster.addresses) as w, \
            Client(m0.client_addr, route="replica", consistency="sequential") as r:
        m = w.map("wakes")
        start = m.put("seed", 0)["revision"]
        watched = r.map("wakes")
        got: dict[str, list] = {}

        def watch(prefix: str) -> None:
            answer = watched.watch(prefix, start, timeout=60)
            got[prefix] = [e["key"] for e in answer["events"]]
        prefixes = [f"w/{i:03d}" for i in range(10)] + ["w/"]
        threads = [threading.Thread(target=watch, args=(p,)) for p in prefixes]
        for t in threads:
            t.start()
        until("gesmas_waiting_readers", 11)
        wakes = metric("gesmas_reader_wakes_total")
        m.put("w/003", 1)                       # its watch and the prefix's
        until("gesmas_waiting_readers", 9)
        m.put("x/1", 1)                         # none
        m.put("w/005", 1)                       # its watch only
        until("gesmas_waiting_readers", 8)
        assert metric("gesmas_reader_wakes_total") - wakes == 3
        assert got == {"w/003": ["w/003"], "w/": ["w/003"], "w/005": ["w/005"]}
        m.txn([], [["put", p, 2] for p in prefixes[:10]])   # the rest answer
        for t in threads:
            t.join(60)
        assert len(got) == 11


def test_watchers_of_one_key_woken_by_one_put_share_one_run_of_the_reader(cluster):
    """Eight watches of one key from one revision wait on one replica: a put wakes them all,
    every one gets the same events, and the identical calls at that state are answered by
    one run of the reader (gesmas_reader_memo_hits_total counts the others)."""
    m0 = cluster.members[0]

    def metric(name: str) -> float:
        return value(scrape(m0.metrics_addr), name)

    with Client(cluster.addresses) as w:
        m = w.map("memo")
        start = m.put("pop", 0)["revision"]
        got: list[Any] = []
        clients = [Client(m0.client_addr, route="replica", consistency="sequential")
                   for _ in range(8)]
        try:
            threads = [threading.Thread(target=lambda c=c: got.append(
                c.map("memo").watch("pop", start, timeout=60))) for c in clients]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while metric("gesmas_waiting_readers") < 8:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            hits = metric("gesmas_reader_memo_hits_total")
            rev = m.put("pop", 1)["revision"]
            for t in threads:
                t.join(60)
        finally:
            for c in clients:
                c.close()
        assert len(got) == 8
        assert all(g == got[0] for g in got) and got[0]["revision"] == rev
        assert [(e["key"], e["value"]) for e in got[0]["events"]] == [("pop", 1)]
        assert metric("gesmas_reader_memo_hits_total") - hits >= 1


def test_a_watch_stream_is_one_waiting_reader_until_closed_in_both_clients(cluster):
    """A watch stream (sync and asyncio) is one followed call: between changes it is one
    waiting reader on its replica, each put under its prefix gives the next answer, and
    closing the iterator (sync) or cancelling the task that reads it (asyncio) withdraws
    it from the replica."""
    m0 = cluster.members[0]

    def waiting(want: float) -> None:
        waiting_readers(m0, want)

    with Client(cluster.addresses) as w, \
            Client(m0.client_addr, route="replica", consistency="sequential") as r:
        m = w.map("ws")
        start = m.put("s/0", 0)["revision"]
        waiting(0)
        answers = r.map("ws").watch_stream("s/", start, timeout=60)
        revs = []
        for i in range(1, 4):
            m.put("other", i)
            revs.append(m.put(f"s/{i}", i)["revision"])
            got = next(answers)
            assert [(e["key"], e["revision"]) for e in got["events"]] == [(f"s/{i}", revs[-1])]
            waiting(1)                          # the same call, waiting again
        answers.close()
        waiting(0)

        async def main() -> None:
            from gesmas.aio import Client as AioClient
            async with AioClient(m0.client_addr, route="replica",
                                 consistency="sequential") as a:
                seen: list = []
                answered = asyncio.Event()

                async def read() -> None:
                    async for got in a.map("ws").watch_stream("s/", revs[-1], timeout=60):
                        seen.append(got["revision"])
                        answered.set()
                task = asyncio.create_task(read())
                await asyncio.to_thread(waiting, 1)
                rev = (await asyncio.to_thread(m.put, "s/4", 4))["revision"]
                await answered.wait()
                assert seen == [rev]
                task.cancel()
                await asyncio.to_thread(waiting, 0)
        asyncio.run(asyncio.wait_for(main(), 120))


def test_watch_streams_of_one_key_from_one_revision_wait_as_one_reader(cluster):
    """Eight watch streams of one key on one replica: once they have had the same answer,
    they wait as one reader (one run per change for all of them); each gets every change;
    closing some leaves the others following, and closing the last withdraws the run."""
    m0 = cluster.members[0]

    def waiting(want: float) -> None:
        waiting_readers(m0, want)

    with Client(cluster.addresses) as w:
        m = w.map("grp")
        start = m.put("pop", 0)["revision"]
        clients = [Client(m0.client_addr, route="replica", consistency="sequential")
                   for _ in range(8)]
        try:
            streams = [c.map("grp").watch_stream("pop", start, timeout=60) for c in clients]
            got: list[list[int]] = [[] for _ in streams]

            def take(i: int) -> None:
                got[i].append(next(streams[i])["revision"])

            def round_of(live: list[int], readers: int) -> int:
                threads = [threading.Thread(target=take, args=(i,)) for i in live]
                for t in threads:
                    t.start()
                waiting(readers)
                rev = m.put("pop", len(got[live[0]]) + 1)["revision"]
                for t in threads:
                    t.join(60)
                return rev
            revs = [round_of(list(range(8)), 8)]     # each its first call
            waiting(1)                          # then one reader for the eight
            assert value(scrape(m0.metrics_addr), "gesmas_followed_calls") == 8
            revs.append(round_of(list(range(8)), 1))
            waiting(1)
            for i in range(6):
                streams[i].close()
            revs.append(round_of([6, 7], 1))
            waiting(1)
            assert got == [revs[:2]] * 6 + [revs] * 2
            streams[6].close()
            streams[7].close()
            waiting(0)
        finally:
            for c in clients:
                c.close()


def test_a_follower_times_out_alone_in_a_shared_wait(cluster):
    """Two watch streams that wait as one reader, one with a 1 s timeout: it ends with
    Timeout, and the other goes on following."""
    m0 = cluster.members[0]
    with Client(cluster.addresses) as w, \
            Client(m0.client_addr, route="replica", consistency="sequential") as a, \
            Client(m0.client_addr, route="replica", consistency="sequential") as b:
        m = w.map("grp-t")
        start = m.put("k", 0)["revision"]
        short = a.map("grp-t").watch_stream("k", start, timeout=1.0)
        long = b.map("grp-t").watch_stream("k", start, timeout=60)
        firsts: list = []
        threads = [threading.Thread(target=lambda it=it: firsts.append(next(it)))
                   for it in (short, long)]
        for t in threads:
            t.start()
        waiting_readers(m0, 2)
        rev = m.put("k", 1)["revision"]
        for t in threads:
            t.join(60)
        assert [f["revision"] for f in firsts] == [rev, rev]
        with pytest.raises(Timeout):
            next(short)
        rev = m.put("k", 2)["revision"]
        assert next(long)["revision"] == rev
        long.close()


def test_the_cli_holds_an_ephemeral_entry_until_interrupted(cluster):
    """`gesmas map NAME put KEY VALUE --ephemeral` (a service registration from a shell):
    the entry lives while the command runs; Ctrl-C closes its session, which deletes it."""
    cmd = [sys.executable, "-m", "gesmas.client.cli", "map", "cli-reg", "put", "svc/sh",
           '"10.0.0.9:80"', "--ephemeral", "--cluster", cluster.addresses]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        put = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().startswith("holding the entry")
        with Client(cluster.addresses) as c:
            m = c.map("cli-reg")
            assert m.entry("svc/sh") == {"value": "10.0.0.9:80", "version": 1,
                                         "create_revision": put["revision"],
                                         "mod_revision": put["revision"], "ephemeral": True}
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
            got = m.watch("svc/", put["revision"], timeout=30)
            assert [(e["type"], e["key"]) for e in got["events"]] == [("delete", "svc/sh")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
