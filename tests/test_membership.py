"""Replacing a dead replica through the admin RPCs (README "Replacing a node"), against real
processes: kill -9 one node of 3, remove it, add a brand-new 4th process (fresh data dir,
ephemeral ports), check it catches up and serves calls, then kill one of the original nodes:
the cluster must go on, so the new node really counts in the quorum."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

from gesmas.client import ApplicationError, Client, InvalidArgument, Unavailable
from gesmas.client.errors import error_from_rpc
from gesmas.server.cluster import LocalCluster, Member, free_ports
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

import rawgrpc

pytestmark = pytest.mark.cluster


def gesmas(*args: str, cluster: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gesmas.client.cli", *args,
                           "--cluster", cluster, "--retry-timeout", "20"],
                          capture_output=True, text=True, timeout=60)


def own_status(address: str) -> pb.StatusResponse:
    """Status as the replica at `address` itself sees it (Client.status follows the leader)."""
    with rawgrpc.channel(address) as ch:
        return pb_grpc.GesmasStub(ch).Status(pb.StatusRequest(), timeout=5)


def leader_of(cluster: LocalCluster) -> Member:
    with Client(cluster.addresses, connect=False) as c:
        st = c.status()
    return next(m for m in cluster.members if m.client_addr == st["leader_address"])


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except (grpc.RpcError, OSError) as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def test_replace_a_dead_node():
    cluster = LocalCluster(nodes=3, fsync=True)
    try:
        cluster.start(timeout=60)
        leader = leader_of(cluster)
        victim = next(m for m in cluster.members if m is not leader)
        survivors = [m for m in cluster.members if m is not victim]
        with Client(cluster.addresses) as c:
            q = c.queue("jobs")
            q.produce("before")

            # Membership changes go through the leader: a follower answers UNAVAILABLE
            # with a leader hint (once it knows the leader: on a loaded host it may not yet).
            wait_for(lambda: own_status(victim.client_addr).leader_address
                     == leader.client_addr, 30, "the follower to know the leader")
            with rawgrpc.channel(victim.client_addr) as ch:
                with pytest.raises(grpc.RpcError) as info:
                    pb_grpc.GesmasStub(ch).RemoveNode(
                        pb.RemoveNodeRequest(raft_addr=victim.raft_addr), timeout=5,
                        metadata=rawgrpc.metadata(ch))
            err = error_from_rpc(info.value)
            assert isinstance(err, Unavailable) and err.leader_hint == leader.client_addr

            cluster.kill(victim)                           # kill -9
            q.produce("while-degraded")

            # 1. remove the dead node (CLI), one-line answers and errors
            addrs = ",".join(m.client_addr for m in survivors)
            r = gesmas("admin", "remove-node", victim.raft_addr, cluster=addrs)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip() == f"removed {victim.raft_addr}"
            r = gesmas("admin", "remove-node", victim.raft_addr, cluster=addrs)
            assert r.returncode == 0 and "not a member" in r.stdout
            r = gesmas("admin", "remove-node", "no-port", cluster=addrs)
            assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "INVALID_ARGUMENT" in r.stderr
            r = gesmas("admin", "remove-node", leader.raft_addr, cluster=addrs)
            assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "IsLeader" in r.stderr
            with pytest.raises(InvalidArgument):
                c.add_node("127.0.0.1:99999")
            cluster.members.remove(victim)
            st = c.status()
            assert victim.raft_addr not in {n["node_id"] for n in st["nodes"]}

            # 2. add the new node (pysyncobj's order: add, then start it)
            client_port, raft_port = free_ports(2)
            new = Member(4, f"127.0.0.1:{client_port}", f"127.0.0.1:{raft_port}",
                         os.path.join(cluster.data_dir, "node4"),
                         os.path.join(cluster.data_dir, "node4.log"))
            r = gesmas("admin", "add-node", new.raft_addr, "--client-addr", new.client_addr,
                       cluster=addrs)
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith(f"added {new.raft_addr}")
            assert c.add_node(new.raft_addr, new.client_addr) is False   # idempotent

            # 3. start it: same command line as the others, --peers = every current member
            cluster.members.append(new)
            cluster.start_member(new)
            assert f"{survivors[0].raft_addr}=" in " ".join(cluster.command(new))
            q.produce("after-add")

            # it catches up: its own last_applied reaches the leader's commit index
            target = c.status()["commit_index"]
            wait_for(lambda: own_status(new.client_addr).last_applied >= target, 30,
                     f"the new node to apply up to {target}")
            st = c.status()
            nodes = {n["node_id"]: n for n in st["nodes"]}
            assert set(nodes) == {m.raft_addr for m in cluster.members}
            assert nodes[new.raft_addr]["address"] == new.client_addr

        # it serves calls: items produced on the old nodes are consumed through the new one
        with Client(new.client_addr, retry_timeout=30) as n:
            got = [n.queue("jobs").consume(timeout=10) for _ in range(3)]
        assert got == ["before", "while-degraded", "after-add"]

        # 4. kill -9 one of the ORIGINAL nodes, the leader: electing a new leader and
        # committing anything now takes the new node's vote.
        old_leader = leader_of(cluster)
        assert old_leader is not new
        cluster.kill(old_leader)
        rest = [m for m in cluster.members if m is not old_leader]
        with Client(",".join(m.client_addr for m in rest), retry_timeout=30) as c2:
            c2.queue("jobs").produce("after-kill")
            assert c2.counter("hits").add(1) == 1
        with Client(new.client_addr, retry_timeout=30) as n:
            assert n.queue("jobs").consume(timeout=10) == "after-kill"
        assert own_status(new.client_addr).leader_address in {m.client_addr for m in rest} | {""}
    finally:
        cluster.stop()
