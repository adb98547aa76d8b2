"""Who may do what, through real 3-process clusters with TLS and auth on (LocalCluster with
secure=True: a throw-away CA, a root password bootstrapped with --root-password-file).

Each refusal is checked for its status code and for having changed nothing (the replicated
state's digest is the same before and after). The kernel-level checks are in
test_auth_kernel.py; the Raft port's own tests in test_raft_port.py.
"""
from __future__ import annotations

import os
import pickle
import socket
import struct

import grpc
import pytest

from gesmas.client import (ApplicationError, Client, GesmasError, NotFound, PermissionDenied,
                           ResourceExhausted, Unauthenticated, Unavailable)
from gesmas.client.security import TLS
from gesmas.server.certs import issue, make_ca
from gesmas.server.cluster import LocalCluster
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}


def setup_users(root: Client) -> None:
    for name, password in PASSWORDS.items():
        root.auth("user_add", name=name, password=password)
    root.auth("role_add", name="a-user")
    for action in ("invoke", "create", "delete"):
        root.auth("role_grant", name="a-user", action=action, prefix="a/")
    root.auth("role_grant", name="a-user", action="register", prefix="A")
    root.auth("user_grant", name="alice", role="a-user")
    root.auth("role_add", name="b-user")
    root.auth("role_grant", name="b-user", action="invoke", prefix="a/")
    root.auth("user_grant", name="bob", role="b-user")


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(secure=True, env={"GESMAS_CHECKPOINT_EVERY": "40"}) as c:
        with Client(c.addresses, **c.client_options()) as root:
            setup_users(root)
        yield c


def login(cluster: LocalCluster, user: str, **kw) -> Client:
    password = cluster.root_password if user == "root" else PASSWORDS[user]
    return Client(cluster.addresses, **cluster.client_options(user, password), **kw)


def digest(cluster: LocalCluster) -> str:
    with login(cluster, "root", connect=False) as root:
        return root.state_digest()


def raw(cluster: LocalCluster, user: str | None = None):
    """A raw stub to the first member and the metadata of `user` (None: no credentials)."""
    channel = cluster.channel(cluster.members[0].client_addr)
    stub = pb_grpc.GesmasStub(channel)
    meta: tuple = ()
    if user is not None:
        password = cluster.root_password if user == "root" else PASSWORDS[user]
        token = stub.Authenticate(pb.AuthenticateRequest(user=user, password=password),
                                  timeout=10).token
        meta = (("authorization", f"Bearer {token}"),)
    return channel, stub, meta


def status_code(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def settled_code(fn, tries: int = 20) -> grpc.StatusCode:
    """`status_code` of a raw call, resent while it answers UNAVAILABLE (what any client does:
    no leader for a moment, a proposal lost in a leader change on a loaded host)."""
    import time
    for _ in range(tries):
        with pytest.raises(grpc.RpcError) as e:
            fn()
        if e.value.code() != grpc.StatusCode.UNAVAILABLE:
            return e.value.code()
        time.sleep(0.2)
    raise AssertionError(f"still UNAVAILABLE after {tries} tries: {e.value.details()}")


def test_each_permission_is_denied_and_nothing_changes(cluster):
    with login(cluster, "root") as root, login(cluster, "alice") as alice, \
            login(cluster, "bob") as bob:
        root.queue("b/secret").produce("root's")
        alice.queue("a/jobs").produce(1)
        before = digest(cluster)
        attempts = [
            lambda: bob.queue("a/new"),                         # create under a/: no
            lambda: alice.queue("b/secret"),                    # outside a/: no
            lambda: bob.invoke("Queue", "b/secret", "consume", timeout=0),
            lambda: bob.delete_object("a/jobs"),
            lambda: alice.delete_object("b/secret"),
            lambda: bob.register_class("class Bobs:\n    pass\n"),
            lambda: alice.register_class("class Bee:\n    pass\n"),   # only A... names
            lambda: bob.auth("user_add", name="eve", password="eve-password"),
            lambda: alice.auth("user_grant", name="alice", role="root"),
            lambda: bob.auth("auth_disable"),
            lambda: bob.auth("role_grant", name="b-user", action="create", prefix=""),
            lambda: bob.add_node("127.0.0.1:1", "127.0.0.1:2"),
            lambda: bob.remove_node(cluster.members[1].raft_addr),
        ]
        for attempt in attempts:
            with pytest.raises(PermissionDenied):
                attempt()
        assert digest(cluster) == before
        # what they may do still works
        assert bob.invoke("Queue", "a/jobs", "consume", timeout=0) == 1
        assert alice.register_class("class Alpha:\n    def f(self):\n        return 1\n")


def test_a_watch_stream_ends_when_its_user_loses_the_right_to_read(cluster):
    """A followed watch runs as its user at every change: once the user's role is revoked,
    the next change ends the stream with PermissionDenied (no answer of it is sent), while a
    stream of another user on the same map goes on."""
    with login(cluster, "root") as root:
        root.auth("user_add", name="erin", password="erin-password")
        root.auth("role_add", name="e-user")
        for action in ("invoke", "create"):
            root.auth("role_grant", name="e-user", action=action, prefix="e/")
        root.auth("user_grant", name="erin", role="e-user")
        m = root.map("e/cfg")
        start = m.put("k", 0)["revision"]
        with Client(cluster.addresses, **cluster.client_options("erin", "erin-password")) \
                as erin:
            theirs = erin.map("e/cfg").watch_stream("", start, timeout=60)
            ours = root.map("e/cfg").watch_stream("", start, timeout=60)
            rev = m.put("k", 1)["revision"]
            assert next(theirs)["revision"] == rev and next(ours)["revision"] == rev
            root.auth("user_revoke", name="erin", role="e-user")
            rev = m.put("k", 2)["revision"]
            with pytest.raises(PermissionDenied):
                next(theirs)
            assert next(ours)["revision"] == rev
            ours.close()


def test_without_credentials_everything_but_status_is_unauthenticated(cluster):
    before = digest(cluster)
    tls = TLS(ca=cluster.pki.ca_cert)
    with pytest.raises(Unauthenticated):
        Client(cluster.addresses, tls=tls, retry_timeout=5)          # opens a session
    with Client(cluster.addresses, tls=tls, connect=False, retry_timeout=5) as anon:
        for attempt in (lambda: anon.list_objects(), lambda: anon.list_classes(),
                        lambda: anon.delete_object("a/jobs"),
                        lambda: anon.register_class("class Anon:\n    pass\n"),
                        lambda: anon.auth("user_list")):
            with pytest.raises(Unauthenticated):
                attempt()
        assert anon.status()["leader_address"]                     # counts only
    channel, stub, _ = raw(cluster)
    with channel:
        assert status_code(lambda: stub.DeleteObject(pb.DeleteObjectRequest(
            object_name="a/jobs"), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        for bad in ("Bearer", "Basic abc", "Bearer v1.e30.AAAA", "Bearer " + "x" * 5000):
            assert status_code(lambda: stub.ListObjects(
                pb.ListObjectsRequest(), timeout=10, metadata=(("authorization", bad),))
            ) == grpc.StatusCode.UNAUTHENTICATED
        assert settled_code(lambda: stub.Authenticate(pb.AuthenticateRequest(
            user="alice", password="wrong"), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert settled_code(lambda: stub.Authenticate(pb.AuthenticateRequest(
            user="nobody", password="x"), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert digest(cluster) == before


def test_plain_text_is_refused_on_a_tls_port(cluster):
    with grpc.insecure_channel(cluster.members[0].client_addr) as ch:
        assert status_code(lambda: pb_grpc.GesmasStub(ch).Status(
            pb.StatusRequest(), timeout=5)) == grpc.StatusCode.UNAVAILABLE


def test_session_hijack_and_close_by_id_are_refused(cluster):
    with login(cluster, "alice") as alice, login(cluster, "bob") as bob:
        lock = alice.lock("a/lock")
        lock.acquire()
        victim = alice.session
        before = digest(cluster)
        channel, stub, meta = raw(cluster, "bob")
        with channel:
            for secret in ("", "0" * 32, "guess"):
                req = pb.InvokeRequest(session=victim, seq=1, class_name="Lock",
                                       object_name="a/lock", method="release",
                                       session_secret=secret)
                assert settled_code(lambda: stub.Invoke(req, timeout=10, metadata=meta)) \
                    == grpc.StatusCode.PERMISSION_DENIED
            for sid in range(1, victim + 5):                    # close every id: none closes
                code = settled_code(lambda: stub.CloseSession(
                    pb.CloseSessionRequest(session=sid), timeout=10, metadata=meta))
                assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED)
            # the victim's own secret with bob's identity: still not bob's session
            req = pb.InvokeRequest(session=victim, seq=1, class_name="Lock",
                                   object_name="a/lock", method="release",
                                   session_secret=alice._session_secret)
            assert settled_code(lambda: stub.Invoke(req, timeout=10, metadata=meta)) \
                == grpc.StatusCode.PERMISSION_DENIED
            # an ack at or beyond the seq, on one's own session, is refused
            req = pb.InvokeRequest(session=bob.session, seq=1, ack=2**63 - 1,
                                   class_name="Lock", object_name="a/lock", method="holder",
                                   session_secret=bob._session_secret)
            assert settled_code(lambda: stub.Invoke(req, timeout=10, metadata=meta)) \
                == grpc.StatusCode.INVALID_ARGUMENT
        assert digest(cluster) == before
        assert lock.is_owner() and alice.lock("a/lock").holder()["session"] == victim
        lock.release()


def test_keep_alives_for_made_up_sessions_are_refused(cluster):
    with login(cluster, "root") as root:
        leader = root.status()["leader_address"]
        channel = cluster.channel(leader)
        with channel:
            stub = pb_grpc.GesmasStub(channel)
            for sid in (root.session, 10**6, 2**62):
                assert settled_code(lambda: stub.KeepAlive(pb.KeepAliveRequest(
                    session=sid, session_secret="nope"), timeout=10)) \
                    == grpc.StatusCode.NOT_FOUND
        assert not root.expired
        root.queue("a/alive").produce(1)          # the real session is untouched


def test_an_upload_cannot_replace_a_standard_class(cluster):
    evil = ("class Queue:\n    def __init__(self, capacity=None):\n        pass\n"
            "    def produce(self, item):\n        return 'stolen'\n")
    with login(cluster, "root") as root:
        with pytest.raises(PermissionDenied, match="reserved"):
            root.register_class(evil)
        q = root.queue("a/fresh-queue")
        q.produce("mine")
        assert q.consume(timeout=1) == "mine"


def test_a_password_change_revokes_the_old_token(cluster):
    with login(cluster, "root") as root:
        root.auth("user_add", name="carol", password="carol-one")
        root.auth("user_grant", name="carol", role="a-user")
        carol = Client(cluster.addresses, **cluster.client_options("carol", "carol-one"))
        token = carol.authenticate()
        with Client(cluster.addresses, tls=TLS(ca=cluster.pki.ca_cert), token=token) as same:
            same.queue("a/carol").produce(1)        # a token alone is a login
        root.auth("user_passwd", name="carol", password="carol-two")
        with pytest.raises(Unauthenticated):        # re-login with the old password fails
            carol.queue("a/carol")
        carol._closed.set()                          # its session expires on its own
        with pytest.raises(Unauthenticated):
            Client(cluster.addresses, tls=TLS(ca=cluster.pki.ca_cert), token=token,
                   retry_timeout=3)
        with Client(cluster.addresses, **cluster.client_options("carol", "carol-two")) as c2:
            assert c2.queue("a/carol").consume(timeout=1) == 1


def test_quotas_are_hit_and_named(cluster):
    with login(cluster, "root") as root:
        root.auth("user_add", name="dave", password="dave-password")
        root.auth("user_grant", name="dave", role="a-user")
        root.auth("user_quota", name="dave", quota={"sessions": 1, "objects": 2,
                                                    "waiters": 1, "source_bytes": 100})
    opts = cluster.client_options("dave", "dave-password")
    with Client(cluster.addresses, **opts) as dave:
        with pytest.raises(ResourceExhausted, match="sessions"):
            Client(cluster.addresses, **opts)
        dave.queue("a/d1")
        dave.queue("a/d2")
        with pytest.raises(ResourceExhausted, match="objects"):
            dave.queue("a/d3")
        with pytest.raises(ResourceExhausted, match="source_bytes"):
            dave.register_class("class Ad:\n    pass\n" + "#" * 200)
        dave.invoke  # one blocked consume is allowed, the second is over the quota
        import threading
        first = threading.Thread(target=lambda: _swallow(lambda: dave.queue("a/d1").consume(
            timeout=30)))
        first.start()
        with login(cluster, "root") as root:
            _wait_for(lambda: {o["name"]: o["waiters"] for o in root.list_objects()}
                      .get("a/d1") == 1)
        with pytest.raises(ResourceExhausted, match="waiters"):
            dave.queue("a/d2").consume(timeout=30)
        dave.queue("a/d1").produce("release")
        first.join(30)


def _swallow(fn):
    try:
        fn()
    except GesmasError:
        pass


def _wait_for(pred, timeout: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_the_raft_port_runs_no_unauthenticated_pickle(cluster, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    data = b"r" + pickle.dumps(Evil())
    host, port = cluster.members[1].raft_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack("i", len(data)) + data)
        s.settimeout(10)
        try:
            assert s.recv(1) == b""                      # closed by the replica
        except ConnectionResetError:
            pass
    with login(cluster, "root") as root:                 # the cluster still commits
        root.queue("a/after-raft").produce(1)
    assert not marker.exists()


# -- clusters of their own: mutual TLS, membership, kill -9 --------------------------------

def test_mutual_tls_identifies_users_by_certificate(tmp_path):
    with LocalCluster(client_cert_auth=True, users=("root", "erin")) as cl:
        with pytest.raises(Unauthenticated, match="'erin' does not exist"):
            Client(cl.addresses, **cl.client_options("erin", cert=True))
        with Client(cl.addresses, **cl.client_options("root", cert=True)) as root:
            root.auth("user_add", name="erin", password="unused-password")
            with Client(cl.addresses, **cl.client_options("erin", cert=True)) as erin:
                with pytest.raises(PermissionDenied, match="'erin'"):
                    erin.queue("e/q")
                root.auth("role_add", name="e")
                root.auth("role_grant", name="e", action="create", prefix="e/")
                root.auth("role_grant", name="e", action="invoke", prefix="e/")
                root.auth("user_grant", name="erin", role="e")
                erin.queue("e/q").produce(1)
        other_ca, other_key = make_ca(str(tmp_path / "other"))
        cert, key = str(tmp_path / "erin.pem"), str(tmp_path / "erin.key")
        issue(other_ca, other_key, cert, key, "erin", client=True)
        for tls in (TLS(ca=cl.pki.ca_cert, cert=cert, key=key),       # wrong CA
                    TLS(ca=cl.pki.ca_cert)):                           # no certificate
            with pytest.raises(Unavailable):
                Client(cl.addresses, tls=tls, retry_timeout=2)
        with pytest.raises(Unavailable):                               # server not trusted
            Client(cl.addresses, tls=TLS(ca=other_ca, cert=cl.pki.clients["root"][0],
                                         key=cl.pki.clients["root"][1]), retry_timeout=2)


def test_membership_needs_an_admin_and_a_reachable_quorum():
    with LocalCluster(secure=True) as cl:
        with Client(cl.addresses, **cl.client_options()) as root:
            setup_users(root)
            leader = cl.find_leader()
            follower = next(m for m in cl.members if m is not leader)
            other = next(m for m in cl.members if m not in (leader, follower))
            cl.kill(follower)                                     # 2 of 3 up
            with pytest.raises(ApplicationError) as e:            # 2 of 4 < 3
                root.add_node("127.0.0.1:9", "127.0.0.1:10")
            assert e.value.type == "UnsafeMembershipChange"
            with pytest.raises(ApplicationError) as e:            # 1 of 2 < 2
                root.remove_node(other.raft_addr)
            assert e.value.type == "UnsafeMembershipChange"
            assert len(root.status()["nodes"]) == 3
            cl.start_member(follower)
            cl.wait_caught_up(follower)
            # with all three up, one unstarted member is safe (3 of 4), as etcd allows
            assert root.add_node("127.0.0.1:9", "127.0.0.1:10") is True
            assert root.remove_node("127.0.0.1:9") is True


def test_auth_state_survives_kill_9_of_every_replica_and_a_snapshot_install():
    with LocalCluster(secure=True, env={"GESMAS_CHECKPOINT_EVERY": "20"}) as cl:
        with Client(cl.addresses, **cl.client_options()) as root:
            setup_users(root)
            for i in range(30):                                   # past a checkpoint
                root.counter("a/count").invoke("add", 1)
        # Every replica holds the whole log before one loses its disk. Otherwise the wiped
        # replica, back under its old identity with an empty log, can vote for a replica that
        # lagged and lose writes acknowledged by it and one other (Raft assumes no voter
        # forgets; README "Replacing a node": a lost disk is replaced by a new member). That
        # is how this test once lost alice's user_add on a loaded host.
        for m in cl.members:
            cl.wait_caught_up(m)
        for m in cl.members:
            cl.kill(m)
        wiped = cl.members[2]
        import shutil
        shutil.rmtree(wiped.data_dir)                             # comes back by snapshot
        for m in cl.members:
            cl.start_member(m)
        cl.wait_ready()
        cl.wait_caught_up(wiped)
        try:
            alice = Client(wiped.client_addr, route="replica", retry_timeout=30,
                           **cl.client_options("alice", PASSWORDS["alice"]))
        except Unauthenticated as e:            # seen rarely: say what the replicas knew
            raise AssertionError(f"alice refused on the restored replica: {e}\n"
                                 + _snapshot_diagnostics(cl, wiped)) from e
        with alice:
            alice.queue("a/after").produce(1)
        with Client(wiped.client_addr, route="replica",
                    **cl.client_options("bob", PASSWORDS["bob"])) as bob:
            with pytest.raises(PermissionDenied):
                bob.queue("b/no")
            with pytest.raises(NotFound):
                bob.invoke("Queue", "a/none", "consume", timeout=0)
        with pytest.raises(Unauthenticated):
            Client(cl.addresses, **cl.client_options("alice", "wrong-password"),
                   retry_timeout=3)
        assert_replicas_agree(cl)


def _snapshot_diagnostics(cl: LocalCluster, wiped) -> str:
    import json
    out = []
    for m in cl.members:
        out.append(f"node {m.node_id}: {json.dumps(cl.member_status(m, digest=True))}")
    try:
        with Client(wiped.client_addr, route="replica", retry_timeout=10,
                    **cl.client_options()) as root:
            out.append(f"users on node {wiped.node_id} now: {root.auth('user_list')}")
    except GesmasError as e:
        out.append(f"root on node {wiped.node_id}: {e}")
    try:
        with Client(wiped.client_addr, route="replica", retry_timeout=10,
                    **cl.client_options("alice", PASSWORDS["alice"])):
            out.append("alice's second login there: accepted")
    except GesmasError as e:
        out.append(f"alice's second login there: {e}")
    for m in cl.members:
        out.append(cl.tail(m, 40))
    return "\n".join(out)


def assert_replicas_agree(cl: LocalCluster, rounds: int = 5) -> None:
    """Every replica computes the same state digest. Each computes it where its Status
    request lands in the log, so a command landing in between makes a round disagree: a
    round is repeated (a few times) until one finds all three equal."""
    import time
    seen = []
    for _ in range(rounds):
        digests = {}
        for m in cl.members:
            for _ in range(20):             # a replica busy catching up may not answer at once
                st = cl.member_status(m, digest=True, timeout=10)
                if st is not None:
                    digests[m.node_id] = st["state_digest"]
                    break
                time.sleep(0.1)
        seen.append(digests)
        if len(digests) == len(cl.members) and len(set(digests.values())) == 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"replicas never agreed: {seen}")


def test_the_cli_manages_users_roles_and_auth(cluster):
    import json
    import subprocess
    import sys
    env = dict(os.environ, **cluster.client_env())

    def gesmas(*args: str, stdin: str | None = None, as_env: dict | None = None):
        return subprocess.run([sys.executable, "-m", "gesmas.client.cli", *args],
                              env=as_env or env, input=stdin, capture_output=True, text=True,
                              timeout=60)

    r = gesmas("user", "add", "frank", "--password-stdin", stdin="frank-password\n")
    assert r.returncode == 0, r.stderr
    for args in (("role", "add", "f"), ("role", "grant", "f", "create", "f/"),
                 ("role", "grant", "f", "invoke", "f/"), ("user", "grant", "frank", "f"),
                 ("user", "quota", "frank", "--sessions", "5", "--state-bytes", "100000")):
        r = gesmas(*args)
        assert r.returncode == 0, (args, r.stderr)
    assert json.loads(gesmas("user", "get", "frank").stdout) == {
        "name": "frank", "roles": ["f"], "quota": {"sessions": 5, "state_bytes": 100000}}
    assert json.loads(gesmas("role", "get", "f").stdout)["permissions"] == [
        ["create", "f/"], ["invoke", "f/"]]
    assert json.loads(gesmas("auth", "status").stdout)["enabled"] is True
    frank = dict(env, GESMAS_USER="frank", GESMAS_PASSWORD="frank-password")
    r = gesmas("call", "Queue", "f/q", "produce", "1", "--create", as_env=frank)
    assert r.returncode == 0, r.stderr
    r = gesmas("call", "Queue", "g/q", "produce", "1", "--create", as_env=frank)
    assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr
    r = gesmas("user", "list", as_env=frank)
    assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr
    anonymous = {k: v for k, v in env.items() if k not in ("GESMAS_USER", "GESMAS_PASSWORD")}
    assert gesmas("status", as_env=anonymous).returncode == 0      # status needs no login ...
    r = gesmas("objects", as_env=anonymous)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr      # ... the rest does
    r = gesmas("status", as_env=dict(frank, GESMAS_PASSWORD="wrong"))
    assert r.returncode == 1 and "wrong user name or password" in r.stderr


def test_a_new_token_opens_a_new_call_stream_and_the_old_one_finishes_its_calls(
        cluster, monkeypatch):
    """A stream's token is fixed when it opens: after the client logs in again, new calls
    go over a new stream, and a call still waiting on the old one is answered there (the
    client's shared streams; a thread's own stream: the next test)."""
    import threading
    import time
    monkeypatch.setenv("GESMAS_THREAD_STREAM", "shared")
    with login(cluster, "root") as root:
        q = root.queue("a/stream-relogin")
        q.invoke("size")
        address = root.leader
        old = root._streams[address][0]
        got: list = []
        t = threading.Thread(target=lambda: got.append(q.consume(timeout=60)))
        t.start()
        deadline = time.monotonic() + 30
        while old.in_flight < 1 or root.status()["waiter_count"] < 1:
            assert time.monotonic() < deadline, "the consume did not wait"
            time.sleep(0.05)
        root._login._expiry = 0.0            # the token is due: the next call logs in again
        q.produce("after-login")
        t.join(60)
        assert got == ["after-login"]
        new = root._streams[address]
        assert old not in new and len(new) == 1 and new[0].metadata != old.metadata
        assert not old.usable


def test_a_new_token_replaces_a_threads_own_stream(cluster):
    """A thread's own Calls RPC (thread_streams) carries the token it opened with: after the
    client logs in again, the thread's next call goes on a new RPC with the new token."""
    with login(cluster, "root") as root:
        q = root.queue("a/thread-relogin")
        q.invoke("size")
        q.invoke("size")                      # the thread's second call: its own RPC
        address = root.leader
        old = root._threads._local.streams[address]
        root._login._expiry = 0.0            # the token is due: the next call logs in again
        assert q.invoke("size") == 0
        new = root._threads._local.streams[address]
        assert new is not old and new.metadata != old.metadata and not old.usable


def test_tooz_takes_tls_and_the_login_from_the_url(cluster, monkeypatch):
    """Issue 26, point 11: gesmas://user:password@hosts?tls_ca=... works with no GESMAS_*
    environment at all, and the address list the client dials holds no credentials."""
    coordination = pytest.importorskip("tooz.coordination")
    from urllib.parse import quote
    for key in ("GESMAS_CLUSTER", "GESMAS_TLS_CA", "GESMAS_TLS_CERT", "GESMAS_TLS_KEY",
                "GESMAS_USER", "GESMAS_PASSWORD"):
        monkeypatch.delenv(key, raising=False)
    tls = f"tls_ca={quote(cluster.pki.ca_cert)}&retry_timeout=5"
    url = f"gesmas://root:{quote(cluster.root_password, safe='')}@{cluster.addresses}?{tls}"
    coord = coordination.get_coordinator(url, b"tooz-over-tls")
    coord.start()
    try:
        assert coord._cluster == cluster.addresses
        assert not any("@" in a or "root" in a for a in coord._client.addresses)
        lock = coord.get_lock(b"tls-lock")
        assert lock.acquire(blocking=False) is True
        assert lock.release() is True
    finally:
        coord.stop()
    wrong = coordination.get_coordinator(f"gesmas://root:wrong@{cluster.addresses}?{tls}",
                                         b"tooz-wrong-password")
    with pytest.raises(coordination.ToozConnectionError, match="UNAUTHENTICATED"):
        wrong.start()
    plain = coordination.get_coordinator(f"gesmas://{cluster.addresses}?tls=false&retry_timeout=1",
                                         b"plain")
    with pytest.raises(coordination.ToozConnectionError):
        plain.start()


def test_a_plain_text_client_at_a_tls_port_is_told_at_once(cluster):
    """Issue 26, point 10: no 'Socket closed' after a 30 s retry_timeout, but a hint at
    TLS for every address, about a second after the client tried them all."""
    import time
    started = time.monotonic()
    with pytest.raises(Unavailable) as e:
        Client(cluster.addresses, tls=False, retry_timeout=30)
    assert time.monotonic() - started < 15
    for m in cluster.members:
        assert f"{m.client_addr}: the connection was closed while connecting (a TLS port? " \
               "give its CA" in e.value.message
