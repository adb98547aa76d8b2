"""Replication layer: durable journal, conflict-only truncation, and a real 3-process cluster.

The cluster tests start 3 replicas (tests/replication_node.py) on 127.0.0.1 with a fake
state machine (an append-only list whose checkpoint is a pickle of the list).
"""
from __future__ import annotations

import os
import queue
import shutil
import sys

import pytest
from pysyncobj import SyncObjConf
from pysyncobj.encryptor import HAS_CRYPTO
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from gesmas.server.replication.journal import DurableJournal, JournalError
from gesmas.server.replication import (NotLeader, Replica, ReplicaStopped, _DurableTransport,
                                       _install_journal_factory, _RaftNode, coalesce,
                                       batch, filter_append_entries,
                                       split_early)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replication_node import (Cluster, ListSM, NodeProc, TEST_SECRET, free_ports,  # noqa: E402
                              restore)

NOOP = b"\x01"  # pysyncobj's no-op command: applying it touches no state machine


# ---------------------------------------------------------------------------- journal
def _journal_with(tmp_path, terms, **kw):
    j = DurableJournal(str(tmp_path), **kw)
    for i, term in enumerate(terms, start=1):
        j.add(NOOP, i, term)
    return j


def _crash(journal):
    """Drop the journal like a killed process would: close the files, write nothing."""
    os.close(journal._fd)
    os.close(journal._lock_fd)


def test_journal_keeps_synced_records_and_loses_unsynced(tmp_path):
    j = _journal_with(tmp_path, [0, 1, 1])
    j.sync()
    j.add(b"unsynced", 4, 1)  # never synced: gone after a crash, like a kill -9
    _crash(j)
    j2 = DurableJournal(str(tmp_path))
    assert [(e[1], e[2]) for e in j2] == [(1, 0), (2, 1), (3, 1)]


def test_journal_truncate_compact_and_reopen(tmp_path):
    j = _journal_with(tmp_path, [0, 1, 1, 1, 2])
    j.sync()
    j.deleteEntriesFrom(3)  # positions >= 3 (indexes 4, 5)
    j.add(b"x", 4, 3)
    j.sync()
    j.deleteEntriesTo(2)  # compaction: keep indexes 3, 4
    j.add(b"y", 5, 3)
    j.sync()
    j.setCurrentTerm(3, "127.0.0.1:1")
    j.setRaftCommitIndex(4)
    j._destroy()
    j2 = DurableJournal(str(tmp_path))
    assert [(e[0], e[1], e[2]) for e in j2] == [(NOOP, 3, 1), (b"x", 4, 3), (b"y", 5, 3)]
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId(), j2.getRaftCommitIndex()) == \
        (3, "127.0.0.1:1", 4)
    assert j2.term_at(4) == 3 and j2.term_at(2) is None and j2.last_index == 5


def test_journal_cuts_torn_tail(tmp_path):
    j = _journal_with(tmp_path, [0, 1, 1])
    j.sync()
    j._destroy()
    path = os.path.join(str(tmp_path), "raft.log")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # a record half written when the power went
        f.truncate(size - 1)
    j2 = DurableJournal(str(tmp_path))
    assert [e[1] for e in j2] == [1, 2]
    j2.add(NOOP, 3, 1)
    j2.sync()
    _crash(j2)
    assert [e[1] for e in DurableJournal(str(tmp_path))] == [1, 2, 3]


def test_journal_refuses_a_second_user(tmp_path):
    j = DurableJournal(str(tmp_path))
    with pytest.raises(JournalError, match="in use"):
        DurableJournal(str(tmp_path))
    j._destroy()
    DurableJournal(str(tmp_path))._destroy()


def test_unsafe_no_fsync_still_writes(tmp_path):
    j = _journal_with(tmp_path, [0, 1], fsync=False)
    j.sync()
    _crash(j)
    assert [e[1] for e in DurableJournal(str(tmp_path))] == [1, 2]


# ------------------------------------------------------------- conflict-only truncation
def _ae(prev, prev_term, entries, commit=1, term=5):
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev, "prevLogTerm": prev_term,
            "entries": [(NOOP, i, t) for i, t in entries]}


def test_filter_append_entries_cases(tmp_path):
    j = _journal_with(tmp_path, [0, 1, 1, 1, 2])  # indexes 1..5
    # stale duplicate, everything present, log goes further: dropped (pysyncobj would cut 4, 5)
    assert filter_append_entries(j, _ae(1, 0, [(2, 1), (3, 1)])) is None
    assert filter_append_entries(j, _ae(3, 1, [])) is None
    # overlap then new entries: matching prefix stripped, nothing truncated
    out = filter_append_entries(j, _ae(3, 1, [(4, 1), (5, 2), (6, 2)], commit=9))
    assert (out["prevLogIdx"], out["prevLogTerm"], [e[1] for e in out["entries"]],
            out["commit_index"]) == (5, 2, [6], 9)
    # real conflict at 5: truncation starts exactly there
    out = filter_append_entries(j, _ae(3, 1, [(4, 1), (5, 3)]))
    assert (out["prevLogIdx"], [e[1] for e in out["entries"]]) == (4, [5])
    # duplicate ending at our last entry: becomes a heartbeat at 5 (no rewrite of 4, 5)
    out = filter_append_entries(j, _ae(3, 1, [(4, 1), (5, 2)], commit=7))
    assert (out["prevLogIdx"], out["entries"], out["commit_index"]) == (5, [], 7)
    # prefix mismatch / unknown prev: left for pysyncobj to reject
    msg = _ae(5, 9, [(6, 9)])
    assert filter_append_entries(j, msg) is msg
    msg = _ae(8, 2, [])
    assert filter_append_entries(j, msg) is msg


def test_coalesce_merges_contiguous_appends_and_acks():
    a = _ae(3, 1, [(4, 1)], commit=2)
    b = _ae(4, 1, [(5, 1), (6, 1)], commit=3)
    hb = _ae(6, 1, [], commit=4)
    ack = {"type": "next_node_idx", "next_node_idx": 5, "reset": False, "success": True}
    ack2 = dict(ack, next_node_idx=7)
    out = coalesce([a, b, hb, ack, ack2], 1 << 20)
    assert len(out) == 2 and out[1] == ack2
    assert [e[1] for e in out[0]["entries"]] == [4, 5, 6] and out[0]["commit_index"] == 4
    gap = _ae(9, 1, [(10, 1)])
    assert len(coalesce([a, gap], 1 << 20)) == 2


def test_split_early_sends_entries_before_the_sync_but_holds_acks_and_votes():
    """A leader's append_entries and forwarded commands may leave before its fsync; acks and
    votes claim durable state and wait; nothing overtakes an earlier message to its node."""
    ack = {"type": "next_node_idx", "term": 5, "next_node_idx": 4, "reset": False,
           "success": True}
    vote = {"type": "response_vote", "term": 6, "vote_granted": True}
    fwd = {"type": "apply_command", "command": b"c", "request_id": 1}
    chunk = dict(_ae(3, 1, []), transmission="start", data=b"x")
    a1, a2 = _ae(3, 1, [(4, 1)]), _ae(4, 1, [(5, 1)])
    outbox = [("f1", a1), ("f2", a1), ("f1", ack), ("f1", a2), ("f2", a2), ("f3", vote),
              ("f3", fwd), ("f4", fwd), ("f4", chunk), ("f4", fwd)]
    early, late = split_early(outbox)
    assert early == [("f1", a1), ("f2", a1), ("f2", a2), ("f4", fwd)]
    assert late == [("f1", ack), ("f1", a2), ("f3", vote), ("f3", fwd), ("f4", chunk),
                    ("f4", fwd)]
    assert split_early([]) == ([], [])


def test_batch_wraps_runs_of_messages_and_leaves_snapshot_chunks_alone():
    a1, a2 = _ae(3, 1, [(4, 1)]), _ae(4, 1, [(5, 1)])
    fwd = {"type": "apply_command", "command": b"c", "request_id": 1}
    chunk = dict(_ae(3, 1, []), transmission="start", data=b"x")
    assert batch([]) == [] and batch([a1]) == [a1]
    assert batch([a1, fwd, chunk, a2]) == [{"type": "gesmas_batch", "messages": [a1, fwd]},
                                           chunk, a2]


def test_stale_append_entries_do_not_truncate_in_syncobj(tmp_path):
    """Drive pysyncobj's real message handler in-process (no ticks, no peer)."""
    _install_journal_factory()
    me, peer = [f"127.0.0.1:{p}" for p in free_ports(2)]
    journal = DurableJournal(str(tmp_path))
    conf = SyncObjConf(autoTick=False, journalFile=journal, bindAddress=me,
                       dynamicMembershipChange=True)
    node = _RaftNode(None, me, [peer], conf, journal)
    transport = node._SyncObj__transport
    leader = TCPNode(peer)
    try:
        assert isinstance(transport, _DurableTransport)
        transport._onMessageReceived(leader, _ae(1, 0, [(i, 1) for i in range(2, 11)]))
        assert journal.last_index == 10
        transport._onMessageReceived(leader, _ae(1, 0, [(2, 1), (3, 1)]))  # stale duplicate
        assert journal.last_index == 10
        transport._onMessageReceived(leader, _ae(4, 1, [(5, 1), (6, 1), (7, 1)]))
        assert journal.last_index == 10
        transport._onMessageReceived(leader, _ae(7, 1, [(8, 6)], term=6))  # real conflict
        assert [(e[1], e[2]) for e in journal][-2:] == [(7, 1), (8, 6)]
        # the unpatched handler cuts acknowledged entries on a stale duplicate (the bug):
        TCPTransport._onMessageReceived(transport, leader, _ae(1, 0, [(2, 1)], term=6))
        assert journal.last_index == 2
        transport.flush()              # hands the records to the syncer
        journal.wait_synced()
        assert not journal.dirty
    finally:
        node.destroy()


def test_propose_without_leader_raises_not_leader(tmp_path):
    me, other = [f"127.0.0.1:{p}" for p in free_ports(2)]
    r = Replica(me, [other], str(tmp_path), fresh=ListSM, restore=restore,
                on_completions=lambda c: None, password=TEST_SECRET)
    try:
        with pytest.raises(NotLeader) as info:
            r.propose(b"x")
        assert info.value.leader is None
        st = r.status()
        assert st["leader"] is None and st["peers"] == {
            other: {"connected": False, "match_index": None, "next_index": None}}
        with pytest.raises(ValueError):
            r.propose(b"x" * (r.tuning.max_command_bytes + 1))
    finally:
        r.destroy()
    with pytest.raises(ReplicaStopped):
        r.propose(b"x")


def test_single_node_applies_at_raft_indexes_and_reports_leadership(tmp_path):
    [me] = [f"127.0.0.1:{p}" for p in free_ports(1)]
    got, roles = queue.Queue(), queue.Queue()
    r = Replica(me, [], str(tmp_path), fresh=ListSM, restore=restore,
                on_completions=lambda cs: [got.put(c) for c in cs],
                on_role_change=lambda is_leader, leader: roles.put((is_leader, leader)),
                password=TEST_SECRET)
    try:
        assert r.wait_ready(10)
        role = roles.get(timeout=10)
        while role != (True, me):
            role = roles.get(timeout=10)
        r.propose(b"one")
        r.propose(b"two")
        c1, c2 = got.get(timeout=10), got.get(timeout=10)
        journal = r._journal
        assert (c1.tag, c2.tag) == ("one", "two") and c2.index == c1.index + 1
        assert b"one" in journal.entry_at(c1.index)[0]  # the real Raft index
        assert r.status()["state"] == "leader" and not journal.dirty
    finally:
        r.destroy()


def _single_node_run(me, data_dir, tags, compact=False):
    """Start a one-node replica, apply `tags`, optionally snapshot, stop; return the list."""
    got = queue.Queue()
    r = Replica(me, [], data_dir, fresh=ListSM, restore=restore,
                on_completions=lambda cs: [got.put(c) for c in cs], password=TEST_SECRET)
    try:
        assert r.wait_ready(10)
        def run(batch):
            for tag in batch:
                r.propose(tag.encode())
            pending = set(batch)  # replayed journal entries complete too: wait for ours
            while pending:
                pending.discard(got.get(timeout=10).tag)
        run(tags)
        if compact:  # pysyncobj snapshots in the tick that adds 'marker', compacts one later
            r.force_compaction()
            run(["marker"])
            run(["marker2"])
            assert r._journal.first_index > 1
        return [d.decode() for _, d in r._sm.items]
    finally:
        r.destroy()


def test_restart_after_crash_between_snapshot_and_compaction(tmp_path):
    """Snapshot renamed into place, journal not yet compacted: entries after it survive."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    me = f"127.0.0.1:{free_ports(1)[0]}"  # the snapshot records the membership
    first = [f"c{i}" for i in range(10)]
    _single_node_run(me, a, first, compact=True)  # snapshot at c9 or 'marker'; compacted
    later = ["marker"] + [f"d{i}" for i in range(5)]
    _single_node_run(me, b, first + later)  # the same log, longer, not compacted
    shutil.copy(os.path.join(a, "snapshot.bin"), os.path.join(b, "snapshot.bin"))
    assert _single_node_run(me, b, ["after"]) == first + later + ["after"]


def test_snapshots_are_written_over_the_one_before_last_and_restart(tmp_path):
    """A replica's snapshots in a row (snapshots.py: the replaced one is kept and the next
    written over its blocks): each restart finds every entry, and the third snapshot is the
    first one's file, written over."""
    d = str(tmp_path / "d")
    me = f"127.0.0.1:{free_ports(1)[0]}"
    snap = os.path.join(d, "snapshot.bin")
    tags: list[str] = []
    inodes = []
    for round in range(3):
        batch = [f"r{round}-{i}" for i in range(5)]
        got = _single_node_run(me, d, batch, compact=True)
        tags += batch + ["marker", "marker2"]
        assert got == tags
        inodes.append(os.stat(snap).st_ino)
        if round:
            assert os.stat(snap + ".spare").st_ino == inodes[round - 1]
    assert inodes[2] == inodes[0] != inodes[1]
    assert sorted(f for f in os.listdir(d) if f.startswith("snapshot")) == \
        ["snapshot.bin", "snapshot.bin.spare"]                 # no .tmp left
    assert _single_node_run(me, d, ["after"]) == tags + ["after"]


@pytest.mark.parametrize("addrs", [("10.1.2.3:7000", "127.0.0.1:7001"),
                                   ("127.0.0.1:7000", "127.0.0.1:7001")])
@pytest.mark.parametrize("password", [None, ""])
def test_password_required_always(tmp_path, addrs, password):
    """Loopback too: without the secret the Raft port would unpickle anyone's frames."""
    with pytest.raises(ValueError, match="cluster secret is required"):
        Replica(addrs[0], [addrs[1]], str(tmp_path), fresh=ListSM, restore=restore,
                on_completions=lambda c: None, password=password)
    assert not os.listdir(tmp_path)  # refused before touching the data directory


# ------------------------------------------------------------------------ real cluster
@pytest.fixture
def cluster(tmp_path, request):
    c = Cluster(str(tmp_path), extra=getattr(request, "param", ()))
    try:
        c.wait_ready()
        yield c
    finally:
        c.kill()  # SIGKILL by pid, whatever happened


def _propose(node, tags):
    assert node.request("propose", tags=tags)["ev"] == "ok"


def _wait_done(node, tags, timeout=20):
    node.wait_for(lambda: all(t in node.done for t in tags), timeout,
                  f"{len(tags)} completions")


def _dumps_agree(cluster, upto, timeout=20):
    """Wait until every node applied index >= upto; check and return their lists."""
    for node in cluster.nodes:
        got = node.request("wait_applied", wait=timeout + 5, index=upto, timeout=timeout)
        assert got["index"] >= upto, f"{node.addr} stuck at {got['index']} < {upto}"
    dumps = [n.request("dump") for n in cluster.nodes]
    assert all(d["violations"] == 0 for d in dumps)
    first = dumps[0]["items"]
    for d in dumps[1:]:
        common = min(len(first), len(d["items"]))
        assert d["items"][:common] == first[:common]
    return [d["items"] for d in dumps]


def test_same_commands_same_order_same_indexes_everywhere(cluster):
    leader = cluster.leader()
    batches = {n.addr: [f"{n.addr}-c{i}" for i in range(60)] for n in cluster.nodes}
    for n in cluster.nodes:  # followers forward to the leader
        _propose(n, batches[n.addr])
    for n in cluster.nodes:
        _wait_done(n, batches[n.addr])
    top = max(max(n.done.values()) for n in cluster.nodes)
    lists = _dumps_agree(cluster, top)
    assert all(len(items) == len(lists[0]) for items in lists)
    by_tag = {tag: idx for idx, tag in lists[0]}
    for n in cluster.nodes:  # the index each proposer saw is the index everywhere
        assert all(by_tag[t] == n.done[t] for t in batches[n.addr])
    assert leader.addr in {n.addr for n in cluster.nodes}


@pytest.mark.skipif(not HAS_CRYPTO, reason="password needs the cryptography package")
@pytest.mark.parametrize("cluster", [["--password", "s3cret"]], indirect=True)
def test_cluster_with_password(cluster):
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    tags = [f"p{i}" for i in range(20)]
    _propose(follower, tags)
    _wait_done(follower, tags)
    _dumps_agree(cluster, follower.done[tags[-1]])


# Simulated slow follower disks (sync waits 20 ms before writing) and restarting the old
# followers first (they must elect one of themselves) make this test sensitive: with
# _DurableTransport's hold removed, followers ack before writing and it loses commands.
@pytest.mark.parametrize("cluster", [["--slow-sync-ms", "20"]], indirect=True)
def test_whole_cluster_kill9_loses_no_acknowledged_command(cluster):
    old_leader = cluster.leader()
    nodes = cluster.nodes
    for n in nodes:  # every node keeps 50 proposals in flight
        assert n.request("stream", prefix=f"{n.addr}-k", count=20000, window=50)["ev"] == "ok"
    nodes[0].wait_for(lambda: sum(len(n.done) for n in nodes) >= 600, 30, "600 completions")
    for n in nodes:  # whole cluster, mid-stream
        n.sigkill()
    for n in nodes:
        n.kill()  # reap; completions printed before death count as acknowledged
    acked = {t: i for n in nodes for t, i in n.done.items()}
    assert len(acked) >= 600
    for n in nodes:
        if n is not old_leader:
            n.start()
    cluster.leader()  # the old followers elect one of themselves
    old_leader.start()
    cluster.wait_ready()
    leader = cluster.leader()
    _propose(leader, ["after-restart"])  # once applied, each log holds all that survived
    _wait_done(leader, ["after-restart"])
    lists = _dumps_agree(cluster, leader.done["after-restart"])
    for items in lists:
        applied = {tag: idx for idx, tag in items}
        lost = [t for t, i in acked.items() if applied.get(t) != i]
        assert not lost, f"{len(lost)} acknowledged commands lost or moved, e.g. {lost[:3]}"
    for n in nodes:
        st = n.request("status")
        assert st["log_last_index"] >= max(acked.values())


def test_a_leader_counts_its_own_copy_only_once_written(tmp_path):
    """The leader's journal is synced off its tick thread, so its own copy of an entry may
    not be on disk when a follower's ack arrives: the commit count (DurableMatch, override
    21) must not count it then. The leader and one follower have slow disks, the other
    follower (F) a fast one; the whole cluster is killed mid-stream and the two slow nodes
    restart first and elect without F. Counting the leader's unwritten copy would have
    acknowledged entries that only F held, and F's log is cut when it rejoins."""
    slow = ["--slow-sync-ms", "20", "--slow-sync-when"]
    cluster = Cluster(str(tmp_path), extra=slow + ["always"])
    try:
        fast = cluster.nodes[2]
        fast.kill()
        fast.extra = slow + ["leader"]     # slow only while it leads
        fast.start()
        cluster.wait_ready()
        while cluster.leader() is fast:    # the scenario needs a slow leader
            fast.kill()
            cluster.leader()
            fast.start()
            cluster.wait_ready()
        leader = cluster.leader()
        other = next(n for n in cluster.nodes if n is not leader and n is not fast)
        assert leader.request("stream", prefix="k", count=20000, window=50)["ev"] == "ok"
        leader.wait_for(lambda: len(leader.done) >= 600, 30, "600 completions")
        for n in cluster.nodes:
            n.sigkill()
        for n in cluster.nodes:
            n.kill()
        acked = dict(leader.done)
        leader.start()
        other.start()
        again = cluster.leader()           # the two slow nodes elect without F
        _propose(again, ["after-restart"])
        _wait_done(again, ["after-restart"])
        fast.start()
        cluster.wait_ready()
        lists = _dumps_agree(cluster, again.done["after-restart"])
        for items in lists:
            applied = {tag: idx for idx, tag in items}
            lost = [t for t, i in acked.items() if applied.get(t) != i]
            assert not lost, f"{len(lost)} acknowledged commands lost or moved, e.g. {lost[:3]}"
    finally:
        cluster.kill()


def test_wiped_replica_catches_up_from_snapshot(cluster):
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    first = [f"a{i}" for i in range(100)] + ["ckpt-1"] + [f"b{i}" for i in range(50)]
    _propose(leader, first)
    _wait_done(leader, first)
    last = leader.done[first[-1]]
    for n in cluster.nodes:  # a follower may lag; it snapshots what it has applied
        assert n.request("wait_applied", wait=25, index=last, timeout=20)["index"] >= last
        assert n.request("compact")["first_index"] > 100
    follower.kill()
    shutil.rmtree(follower.data_dir)
    second = [f"c{i}" for i in range(30)]
    _propose(leader, second)
    _wait_done(leader, second)
    follower.start()
    follower.wait_for(lambda: follower.ready, 30, "ready")
    lists = _dumps_agree(cluster, leader.done[second[-1]])
    assert all(items == lists[0] for items in lists)
    assert [tag for _, tag in lists[0]] == first + second
    st = follower.request("status")
    assert st["snapshots_loaded"] >= 1 and st["checkpoint_index"] == leader.done["ckpt-1"]
    assert st["commands_since_checkpoint"] == 50 + 30


def test_membership_add_and_remove(cluster, tmp_path):
    leader = cluster.leader()
    [port] = free_ports(1)
    addr = f"127.0.0.1:{port}"
    newcomer = NodeProc(addr, cluster.addrs, str(tmp_path / "n3"), str(tmp_path / "n3.log"),
                        cond=cluster.cond)
    cluster.nodes.append(newcomer)  # torn down with the others
    reply = leader.request("add_node", addr=addr)
    assert reply["ok"], reply
    tags = [f"m{i}" for i in range(20)]
    _propose(leader, tags)
    _wait_done(leader, tags)
    got = newcomer.request("wait_applied", wait=25, index=leader.done[tags[-1]], timeout=20)
    assert got["index"] >= leader.done[tags[-1]]
    assert newcomer.request("status")["peers"].keys() == set(cluster.addrs)
    reply = leader.request("remove_node", addr=addr)
    assert reply["ok"], reply


# --- a replica that comes back with an empty data dir (replication/rejoin.py) ------------------

def test_an_empty_start_without_new_cluster_is_a_rejoin_that_survives_restarts(tmp_path):
    from gesmas.server.replication import SNAPSHOT_NAME
    from gesmas.server.replication.rejoin import MARKER_NAME, RejoinGuard
    d = tmp_path / "n"
    d.mkdir()
    assert RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=True) is None
    assert RejoinGuard.open(str(d), SNAPSHOT_NAME, False, new_cluster=False) is None  # alone
    assert not (d / MARKER_NAME).exists()
    g = RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=False)
    assert g is not None and (d / MARKER_NAME).exists()
    # it got some entries, then crashed: its log is no longer empty, and it is still rejoining
    j = DurableJournal(str(d))
    j.add(b"x", 1, 0)
    j.add(b"y", 2, 3)
    j.sync()
    j._destroy()
    assert RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=False) is not None
    assert RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=True) is not None
    g.clear()
    assert not (d / MARKER_NAME).exists()
    assert RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=False) is None  # has data
    # a snapshot alone is data too
    e = tmp_path / "e"
    e.mkdir()
    (e / SNAPSHOT_NAME).write_bytes(b"s")
    assert RejoinGuard.open(str(e), SNAPSHOT_NAME, True, new_cluster=False) is None


def test_a_first_start_without_new_cluster_logs_no_warning_a_refused_vote_does(tmp_path, caplog):
    """A unit file or a StatefulSet never passes --new-cluster, so every replica of a correct
    first start is an empty start without it: that must not log a warning (which advised
    --new-cluster, the flag the README says never to put in a unit). Refusing a vote to a
    candidate with a history is the moment something may be wrong: one warning then."""
    import logging

    from gesmas.server.replication import SNAPSHOT_NAME
    from gesmas.server.replication.rejoin import RejoinGuard
    d = tmp_path / "n"
    d.mkdir()
    with caplog.at_level(logging.INFO, logger="gesmas.server.replication.rejoin"):
        g = RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=False)
        assert g is not None
        assert not g.refuses({"type": "request_vote", "term": 1, "last_log_term": 0,
                              "last_log_index": 1})          # a new cluster's candidate
        assert RejoinGuard.open(str(d), SNAPSHOT_NAME, True, new_cluster=False) is not None
    assert caplog.records and all(r.levelno < logging.WARNING for r in caplog.records)
    assert not any("start every replica with --new-cluster" in r.getMessage()
                   for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gesmas.server.replication.rejoin"):
        for _ in range(3):                                     # a candidate with a history
            assert g.refuses({"type": "request_vote", "term": 5, "last_log_term": 4,
                              "last_log_index": 31})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "term 4, index 31" in warnings[0]
    assert "--new-cluster" not in warnings[0] and g.refused == 3


def test_a_rejoining_replica_votes_only_for_logs_that_hold_what_it_may_have_lost(tmp_path):
    from gesmas.server.replication.rejoin import RejoinGuard
    g = RejoinGuard(str(tmp_path / "marker"), fsync=False)

    def vote(term, index):
        return not g.refuses({"type": "request_vote", "term": 9,
                              "last_log_term": term, "last_log_index": index})
    # no leader heard since the empty start: only an empty log (term 0) gets the vote
    assert vote(0, 1) and not vote(3, 50) and g.may_stand(0, 1) and not g.may_stand(3, 50)
    g.heard({"type": "append_entries", "term": 4, "commit_index": 120})
    g.heard({"type": "append_entries", "term": 4, "commit_index": 150})  # later commits:
    assert g.commit == 120            # what was committed when this replica came back counts
    g.heard({"type": "append_entries", "term": 3, "commit_index": 400})  # a stale leader
    assert (g.term, g.commit) == (4, 120)
    assert not vote(3, 500)           # an earlier term: may lack what term 4's leader had
    assert not vote(4, 119)           # term 4, short of the commit index first reported
    assert vote(4, 120) and vote(5, 2)  # a later term's entry follows everything committed
    assert g.may_stand(4, 130) and not g.may_stand(4, 100)
    g.heard({"type": "append_entries", "term": 6, "commit_index": 90})
    assert not vote(5, 1000) and vote(6, 90)


def test_a_rejoining_replica_is_caught_up_once_it_applied_the_leaders_entries(tmp_path):
    from gesmas.server.replication.rejoin import RejoinGuard
    g = RejoinGuard(str(tmp_path / "marker"), fsync=False)
    assert not g.caught_up(False, 0, 1, 0)              # no leader heard yet
    g.heard({"type": "append_entries", "term": 4, "commit_index": 120})
    assert not g.caught_up(False, 4, 119, 4)
    assert not g.caught_up(False, 4, 120, 3)            # nothing of the leader's term applied
    assert not g.caught_up(False, 5, 120, 5)            # a newer term: its first report counts
    assert g.caught_up(False, 4, 120, 4)
    g.heard({"type": "append_entries", "term": 5, "commit_index": 200})
    assert not g.caught_up(False, 5, 150, 5) and g.caught_up(False, 5, 200, 5)
    # elected with an empty log (every voter empty): caught up once it applied its own entry
    assert not g.caught_up(True, 7, 1, 0) and g.caught_up(True, 7, 2, 7)
