"""The attacks that used to stop every replica, through the public client against a real
3-node cluster (tests/test_hostile.py has them all on the kernel harness).

After the attacks every replica must still serve calls and compute the same state digest,
and so again after all three are killed with SIGKILL and restarted on the same log (an entry
that killed replicas used to kill them again on every restart).
"""
from __future__ import annotations

import time

import pytest

from gesmas.client import ApplicationError, Client, InvalidArgument, NotFound, ResourceExhausted
from gesmas.server.cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHECKPOINT_EVERY = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(nodes=3, data_dir=str(tmp_path_factory.mktemp("hostile")),
                     env={"GESMAS_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY)})
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def agree(cluster: LocalCluster, timeout: float = 60.0) -> str:
    """Every replica answers, and all compute the same digest (retried: a keep-alive expiry
    or a tick may land between two replicas' digest requests)."""
    deadline = time.monotonic() + timeout
    seen: list[object] = []
    while time.monotonic() < deadline:
        seen = [cluster.member_status(m, timeout=10.0, digest=True) for m in cluster.members]
        digests = {st["state_digest"] if st else None for st in seen}
        if None not in digests and len(digests) == 1:
            return digests.pop()  # type: ignore[return-value]
        time.sleep(0.2)
    raise AssertionError(f"replicas disagree or do not answer: {seen}\n" +
                         "\n".join(cluster.tail(m) for m in cluster.members))


def serves(cluster: LocalCluster, name: str) -> None:
    for i, m in enumerate(cluster.members):
        with Client(m.client_addr, route="replica") as c:
            q = c.queue(name)
            q.produce(i)
            assert q.consume(timeout=30) == i


def test_attacks_that_stopped_every_replica(cluster):
    with Client(cluster.addresses) as c:
        c.register_class("class Exit:\n    def m(self):\n        raise SystemExit()\n"
                         "    def k(self):\n        raise KeyboardInterrupt()\n")
        with pytest.raises(ApplicationError) as e:
            c.object("Exit", "exit").m()
        assert e.value.type == "SystemExit"
        with pytest.raises(ApplicationError):
            c.object("Exit", "exit").k()
        with pytest.raises(InvalidArgument):
            c.register_class("class Body:\n    raise SystemExit()\n")
        with pytest.raises(InvalidArgument):
            c.register_class("class Long:\n    X = " + "+".join(["1"] * 3000) + "\n")
        c.register_class("class Big:\n    def m(self, n):\n        return (10 ** n).bit_length()\n")
        with pytest.raises(ResourceExhausted):
            c.object("Big", "big").m(2 * 10 ** 7)
        c.register_class("import typing\nclass Esc:\n    def m(self):\n"
                         "        return typing.sys.modules['os'].environ['GESMAS_CLUSTER_SECRET']\n")
        with pytest.raises(ApplicationError, match="no attribute 'sys'"):
            c.object("Esc", "esc").m()
        c.register_class("class Gen:\n    def keep(self):\n        self.g = (x for x in [1])\n"
                         "    def ok(self):\n        return 1\n")
        gen = c.object("Gen", "gen")
        gen.keep()
        serves(cluster, "hostile-before")
        q = c.queue("filler")
        for i in range(2 * CHECKPOINT_EVERY):    # past a checkpoint on every replica
            q.produce(i)
        with pytest.raises(NotFound, match="dropped"):
            gen.ok()
        assert [q.consume(timeout=10) for _ in range(2 * CHECKPOINT_EVERY)] == \
            list(range(2 * CHECKPOINT_EVERY))
    serves(cluster, "hostile-after")
    before = agree(cluster)
    for m in cluster.members:            # the log holds every attack: restart all replicas
        cluster.kill(m)
    for m in cluster.members:
        cluster.start_member(m)
    cluster.wait_ready(timeout=90)
    serves(cluster, "hostile-restarted")
    after = agree(cluster)
    assert before and after


NATIVE = '''
import collections
class Native:
    def __init__(self):
        self.kept = None
    def compare(self):
        a = []
        b = []
        for i in range(40):
            a = [a, a]
            b = [b, b]
        return a == b
    def key(self):
        a = ()
        for i in range(40):
            a = (a, a)
        d = {}
        d[a] = 1
        return len(d)
    def drain(self):
        x = bytes(4000000)
        for i in range(300):
            collections.deque(x, maxlen=0)
        return 1
    def keep_hash(self):
        self.kept = [hash((None,)), hash("replica"), hash(frozenset({1, "a"}))]
        return self.kept
    def none_set(self):
        self.s = {None, 1}
        return len(self.s)
'''


def test_native_work_attacks_end_as_errors_and_replicas_agree(cluster):
    """Issue 22's classes through a real cluster: native work on shared structures and through
    implicit hashing, one step of a whole input's work, values that depended on the process.
    Each ends as the caller's error or as the same value on every replica."""
    import sys
    with Client(cluster.addresses) as c:
        c.register_class(NATIVE)
        n = c.object("Native", "native")
        for method in ("compare", "key", "drain"):
            with pytest.raises(ResourceExhausted):
                getattr(n, method)()
        kept = n.keep_hash()
        assert kept == n.keep_hash()
        if sys.version_info < (3, 12):
            with pytest.raises(ApplicationError, match="same on every replica"):
                n.none_set()
        else:
            assert n.none_set() == 2
    serves(cluster, "native-after")
    before = agree(cluster)
    for m in cluster.members:
        cluster.kill(m)
    for m in cluster.members:
        cluster.start_member(m)
    cluster.wait_ready(timeout=90)
    serves(cluster, "native-restarted")
    assert agree(cluster) and before
    with Client(cluster.addresses) as c:
        assert c.object("Native", "native").keep_hash() == kept
