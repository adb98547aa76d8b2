"""A Map's mirror (``MapProxy.mirror``, client/gesmas/client/map_mirror.py): entries under a
prefix held in the client and kept current by one watch stream. Against one real 3-process
cluster (shared by the module): loading by pages while the map changes, following puts and
deletes of other clients, reading its own writes, listeners, a leader's failover, closing
(the replica's wait withdrawn), a client's close and a map's deletion; the asyncio mirror;
and, with a fake client, a mirror that fell behind what the map keeps and reads it
again."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from typing import Any

import pytest

from gesmas.client import Client, ClientClosed, Compacted, NotFound, Replaced
from gesmas.client.map_mirror import MapMirror
from gesmas.server.cluster import LocalCluster

try:
    from tests.test_kvmap_cluster import waiting_readers
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from test_kvmap_cluster import waiting_readers


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(nodes=3, fsync=True, metrics=True)
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


class Seen:
    """A listener that keeps the events and can be waited on for a key."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def __call__(self, ev: dict[str, Any]) -> None:
        with self._cond:
            self.events.append(ev)
            self._cond.notify_all()

    def until(self, n: int) -> list[tuple[str, str]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= n, 30), self.events
            return [(e["type"], e["key"]) for e in self.events]


@contextlib.contextmanager
def after_first_page(m: Any, change: Any) -> Any:
    """Within it, `change()` runs just after the first `items` page that `m` reads; yields
    the arguments of each `items` call."""
    real = m._read
    items_calls: list[tuple[Any, ...]] = []

    def read(method: str, *args: Any, **kwargs: Any) -> Any:
        got = real(method, *args, **kwargs)
        if method == "items":
            items_calls.append(args)
            if len(items_calls) == 1:
                change()
        return got

    m._read = read
    try:
        yield items_calls
    finally:
        del m._read


@pytest.mark.cluster
def test_a_mirror_loads_by_pages_and_follows_other_clients_changes(cluster):
    with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
        m = c.map("mirror-follow")
        for i in range(7):
            m.put(f"cfg/{i}", i)
        m.put("cfgX", "beside the prefix")
        last = m.put("other/x", 1)["revision"]
        with m.mirror("cfg/", page=3) as mir:
            assert mir.revision == last
            assert mir.keys() == [f"cfg/{i}" for i in range(7)]
            assert mir.items("cfg/1") == [("cfg/1", 1)] and mir.items("zzz") == []
            assert len(mir) == 7 and mir["cfg/3"] == 3 and mir.get("cfg/9", "d") == "d"
            seen = Seen()
            mir.listen(seen)
            om = other.map("mirror-follow")
            r1 = om.put("cfg/1", "one")["revision"]
            om.put("other/y", 2)
            assert om.delete("cfg/2")
            r3 = om.put("cfg/new", [1, {"a": b"x"}])["revision"]
            assert mir.wait(r3, timeout=30)
            assert seen.until(3) == [("put", "cfg/1"), ("delete", "cfg/2"),
                                     ("put", "cfg/new")]
            assert mir["cfg/1"] == "one" and "cfg/2" not in mir
            assert mir.get("cfg/new") == [1, {"a": b"x"}]
            assert mir.entry("cfg/1") == {"value": "one", "version": 2, "mod_revision": r1}
            assert mir.keys() == ["cfg/0", "cfg/1", "cfg/3", "cfg/4", "cfg/5", "cfg/6",
                                  "cfg/new"]
            assert dict(mir.items()) == {it["key"]: it["value"]
                                         for it in m.items("cfg/", 100)["items"]}
            with pytest.raises(ValueError, match="not under this mirror's prefix 'cfg/'"):
                mir.get("other/x")
            with pytest.raises(TypeError, match="a key must be a str"):
                mir.get(3)             # type: ignore[arg-type]
            assert 3 not in mir and "other/x" not in m.mirror("cfg/").keys()
            with pytest.raises(TypeError, match="revision must be an int"):
                mir.wait("5")          # type: ignore[arg-type]
            assert mir.wait(mir.revision + 1000, timeout=0.05) is False
        with pytest.raises(ValueError, match="the mirror of map 'mirror-follow' is closed"):
            mir.get("cfg/1")
        mir._thread.join(30)
        assert not mir._thread.is_alive()
        with pytest.raises(TypeError, match="a prefix must be a str"):
            m.mirror(b"cfg/")          # type: ignore[arg-type]
        with pytest.raises(ValueError, match="page must be an int from 1 to 10000"):
            m.mirror("cfg/", page=0)


@pytest.mark.cluster
def test_a_mirror_loaded_while_the_map_changes_holds_the_state_of_one_revision(cluster):
    """Changes made between the pages (to keys of a page already read, twice to one, a
    delete of a key of a later page, outside the prefix) are in the mirror once loaded; a
    map that no longer keeps the first page's revision (history=1) is read again."""
    for history, loads in ((1000, 1), (1, 2)):
        with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
            name = f"mirror-load-{history}"
            m = c.map(name, history=history)
            for i in range(6):
                m.put(f"k/{i}", i)
            om = other.map(name, history=history)

            def change() -> None:
                om.put("k/0", "changed")               # in the page read
                om.put("k/1", "a")
                om.put("k/1", "b")                     # twice
                om.delete("k/5")                       # in a page not read yet
                om.put("k/9", 9)
                for j in range(40):                    # past what history=1 keeps
                    om.put("outside", j)

            with after_first_page(m, change) as items_calls, m.mirror("k/", page=2) as mir:
                want = {it["key"]: it["value"] for it in m.items("k/", 100)["items"]}
                assert dict(mir.items()) == want
                assert want["k/0"] == "changed" and want["k/1"] == "b"
                assert "k/5" not in want and want["k/9"] == 9
                assert mir.entry("k/1")["version"] == 3
                starts = [a for a in items_calls if a[1:] == (2, "")]
                assert len(starts) == loads, items_calls


@pytest.mark.cluster
def test_a_mirror_reads_its_own_writes_and_refuses_keys_beside_its_prefix(cluster):
    with Client(cluster.addresses) as c:
        m = c.map("mirror-own")
        with m.mirror("k/") as mir:
            for i in range(20):
                assert mir.put("k/x", i)["version"] == i + 1
                assert mir["k/x"] == i
            assert mir.delete("k/x") is True and "k/x" not in mir
            assert mir.delete("k/x") is False
            assert mir.put("k/e", 1, ephemeral=True)["version"] == 1
            assert m.entry("k/e")["ephemeral"] is True
            with pytest.raises(ValueError, match="not under this mirror's prefix"):
                mir.put("other", 1)
            with pytest.raises(ValueError, match="not under this mirror's prefix"):
                mir.delete("other")
            assert m.get("other") is None


@pytest.mark.cluster
def test_a_listener_that_raises_or_waits_does_not_stop_the_mirror(cluster, caplog):
    with Client(cluster.addresses) as c:
        m = c.map("mirror-listeners")
        with m.mirror("") as mir:
            errors: list[BaseException] = []

            def bad(ev: dict[str, Any]) -> None:
                raise KeyError("from a listener")

            def waits(ev: dict[str, Any]) -> None:
                try:
                    mir.wait(ev["revision"] + 1)
                except RuntimeError as e:
                    errors.append(e)

            seen = Seen()
            mir.listen(bad)
            mir.listen(waits)
            mir.listen(seen)
            with pytest.raises(TypeError, match="a listener must be callable"):
                mir.listen(3)          # type: ignore[arg-type]
            with caplog.at_level(logging.ERROR, logger="gesmas.client"):
                m.put("a", 1)
                m.put("b", 2)
                assert seen.until(2) == [("put", "a"), ("put", "b")]
            assert [str(e) for e in errors] == [
                "a mirror's listener cannot wait for the mirror (it runs on the thread "
                "that brings the changes)"] * 2
            assert caplog.text.count("a listener of the mirror of map 'mirror-listeners' "
                                     "raised") == 2
            assert mir["b"] == 2


@pytest.mark.cluster
def test_a_mirror_follows_through_a_leader_failover(cluster):
    with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
        m = c.map("mirror-failover")
        m.put("k/a", 1)
        with m.mirror("k/") as mir:
            old = cluster.find_leader()
            cluster.kill(old, signal.SIGKILL)
            try:
                rev = other.map("mirror-failover").put("k/b", 2)["revision"]
                assert mir.wait(rev, timeout=60)
                assert dict(mir.items()) == {"k/a": 1, "k/b": 2}
            finally:
                cluster.start_member(old)
                cluster.wait_caught_up(old, timeout=60)


@pytest.mark.cluster
def test_closing_a_mirror_withdraws_its_watch_and_a_closed_client_ends_it(cluster):
    m0 = cluster.members[0]
    with Client(m0.client_addr, route="replica", consistency="sequential") as c:
        m = c.map("mirror-close")
        rev = m.put("k/a", 1)["revision"]
        waiting_readers(m0, 0)
        mir = m.mirror("k/")
        assert mir.revision == rev
        waiting_readers(m0, 1)
        mir.close()
        waiting_readers(m0, 0)
        mir.close()                    # twice: nothing more
        kept = m.mirror("k/")
        waiting_readers(m0, 1)
    with pytest.raises(ClientClosed, match="the mirror of map 'mirror-close' stopped "
                                           "following it"):
        kept.wait(rev + 1, timeout=30)
    with pytest.raises(ClientClosed):
        kept.get("k/a")
    kept._thread.join(30)
    assert not kept._thread.is_alive()
    waiting_readers(m0, 0)


@pytest.mark.cluster
def test_a_mirror_of_a_deleted_map_ends_with_not_found(cluster):
    """Its watch is not a get-or-create: the map deleted ends the mirror with NotFound
    rather than a silent watch of a map made again from a revision it has not reached."""
    with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
        m = c.map("mirror-deleted")
        rev = m.put("k/a", 1)["revision"]
        mir = m.mirror("k/")
        other.delete_object("mirror-deleted")
        with pytest.raises(NotFound, match="the mirror of map 'mirror-deleted' stopped "
                                           "following it: no object named"):
            mir.wait(rev + 1, timeout=30)
        with pytest.raises(NotFound):
            mir.get("k/a")
        mir._thread.join(30)
        assert not mir._thread.is_alive()


@pytest.mark.cluster
def test_a_map_made_again_is_never_taken_for_the_one_mirrored_or_watched(cluster):
    """A map deleted and made again between a load's pages: the load reads the new map
    whole. A mirror whose map is deleted and made again ends (NotFound, or Replaced when
    the replica ran the watch again after both), and a watch stream given the old map's
    revision and `created` ends with Replaced instead of taking the new map's changes after
    that revision."""
    with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
        name = "mirror-remade"
        m = c.map(name)
        for i in range(6):
            m.put(f"k/{i}", i)
        old = m.stat()

        def remake() -> None:
            other.delete_object(name)
            om = other.map(name)
            for j in range(4):
                om.put(f"k/new{j}", j)

        with after_first_page(m, remake) as items_calls:
            mir = m.mirror("k/", page=2)
        new = m.stat()
        assert new["created"] > old["created"] and new["revision"] == 4
        assert dict(mir.items()) == {f"k/new{j}": j for j in range(4)}
        assert mir.revision == 4 and len([a for a in items_calls if a[1:] == (2, "")]) == 2

        other.delete_object(name)                 # while followed: ends the mirror
        om = other.map(name)
        for j in range(8):
            om.put(f"k/{j}", "again")
        with pytest.raises((NotFound, Replaced), match="the mirror of map 'mirror-remade' "
                                                       "stopped following it"):
            mir.wait(8, timeout=30)
        mir._thread.join(30)
        assert not mir._thread.is_alive()

        with pytest.raises(Replaced, match="deleted and made again"):
            next(m.watch_stream("k/", new["revision"], created=new["created"], timeout=30))
        with pytest.raises(Replaced):
            m.watch("k/", new["revision"], created=new["created"], timeout=30)
        got = m.watch("k/", 7)                    # unchecked: the new map's change after 7
        assert [e["revision"] for e in got["events"]] == [8] and \
            got["created"] == m.stat()["created"]


@pytest.mark.cluster
def test_the_asyncio_mirror(cluster):
    from gesmas.aio import Client as AioClient

    async def main() -> None:
        async with AioClient(cluster.addresses) as a:
            m = a.map("mirror-aio")
            for i in range(5):
                await m.put(f"k/{i}", i)
            async with await m.mirror("k/", page=2) as mir:
                assert mir.keys() == [f"k/{i}" for i in range(5)] and len(mir) == 5
                seen: list[tuple[str, str]] = []
                mir.listen(lambda ev: seen.append((ev["type"], ev["key"])))
                other = await asyncio.to_thread(Client, cluster.addresses)
                try:
                    om = other.map("mirror-aio")
                    await asyncio.to_thread(om.delete, "k/0")
                    rev = (await asyncio.to_thread(om.put, "k/9", 9))["revision"]
                finally:
                    await asyncio.to_thread(other.close)
                assert await mir.wait(rev, timeout=30)
                assert seen == [("delete", "k/0"), ("put", "k/9")]
                assert mir["k/9"] == 9 and "k/0" not in mir
                assert (await mir.put("k/1", "one"))["version"] == 2
                assert mir.get("k/1") == "one" and mir.entry("k/1")["version"] == 2
                assert await mir.delete("k/1") is True and "k/1" not in mir
                assert await mir.wait(mir.revision + 1000, timeout=0.05) is False
                with pytest.raises(ValueError, match="not under this mirror's prefix"):
                    await mir.put("x", 1)
            with pytest.raises(ValueError, match="is closed"):
                mir.get("k/9")
            assert mir._task is not None and mir._task.done()

    asyncio.run(asyncio.wait_for(main(), 120))


class FakeMap:
    """A Map proxy and client that answer a mirror from a dict: the first watch fails
    with Compacted (once ``go`` is set) after the entries changed, the next waits until the
    mirror stops."""

    class_name = "Map"
    object_name = "fake"
    _create = None

    def __init__(self, remade: bool = False) -> None:
        self.client = self
        self.entries = {"k/a": ("a", 1, 1), "k/b": ("b", 1, 2)}
        self.rev = 2
        self.created = 10
        self.remade = remade      # the map is made again while the mirror is behind
        self.follow_kwargs: list[dict[str, Any]] = []
        self.follows = 0
        self.ended = threading.Event()
        self.go = threading.Event()

    def _read(self, method: str, *args: Any, consistency: Any = None) -> Any:
        assert method == "items", method
        items = [{"key": k, "value": v[0], "version": v[1], "mod_revision": v[2]}
                 for k, v in sorted(self.entries.items())]
        return {"items": items, "more": False, "revision": self.rev, "created": self.created}

    def _follow(self, *args: Any) -> Any:
        handle = args[-1]
        self.follow_kwargs.append(dict(args[4]))
        self.follows += 1
        if self.follows == 1:
            assert self.go.wait(30)
            self.entries = {"k/a": ("a", 1, 1), "k/b": ("B", 2, 7), "k/c": ("c", 1, 9)}
            self.rev = 9
            if self.remade:
                self.created = 50
            raise Compacted("revision 2 is compacted")
        fake = self

        class Following:
            def cancel(self) -> None:
                fake.ended.set()

        assert handle.started(Following())
        self.ended.wait(30)
        return
        yield


def test_a_mirror_that_fell_behind_reads_the_map_again_and_tells_what_differs():
    fake = FakeMap()
    mir = MapMirror(fake, "k/")        # type: ignore[arg-type]
    seen = Seen()
    mir.listen(seen)
    assert mir.revision == 2 and dict(mir.items()) == {"k/a": "a", "k/b": "b"}
    fake.go.set()
    assert mir.wait(9, timeout=30)
    assert dict(mir.items()) == {"k/a": "a", "k/b": "B", "k/c": "c"}
    assert seen.until(2) == [("put", "k/b"), ("put", "k/c")]
    assert seen.events[0]["revision"] == 7 and seen.events[0]["version"] == 2
    assert fake.follow_kwargs == [{"after_revision": 2, "limit": 1000, "created": 10},
                                  {"after_revision": 9, "limit": 1000, "created": 10}]
    mir.close()
    mir._thread.join(30)
    assert not mir._thread.is_alive() and fake.follows == 2


def test_a_mirror_that_fell_behind_a_map_made_again_ends_with_replaced():
    """The reload after Compacted reads another map (made again meanwhile): the mirror does
    not take it for its own; it ends, and its reads name why."""
    fake = FakeMap(remade=True)
    mir = MapMirror(fake, "k/")        # type: ignore[arg-type]
    fake.go.set()
    mir._thread.join(30)
    assert not mir._thread.is_alive() and fake.follows == 1
    with pytest.raises(Replaced, match="stopped following it: map 'fake' was deleted and "
                                       "made again .at log index 50; the one read was made "
                                       "at 10."):
        mir.get("k/a")
    with pytest.raises(LookupError):
        mir.wait(3, timeout=5)
