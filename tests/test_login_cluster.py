"""What needs a login, through a real 3-process cluster with TLS and auth on (issue 22): every
request that becomes a log entry is refused UNAUTHENTICATED without one, before anything is
proposed, so that refused requests commit nothing (the leader's commit index does not move);
a token is bound to the user record it was issued for, so deleting a user revokes its tokens
for good, whatever user is made later under the same name. Kernel-level checks of the binding
are in test_auth_kernel.py; the permission checks in test_security_cluster.py.
"""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gesmas.client import Client, Unauthenticated
from gesmas.client.security import TLS
from gesmas.server.cluster import LocalCluster, Member
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

REPEAT = 3          # each refused request, on each replica


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(secure=True) as c:
        with Client(c.addresses, **c.client_options()) as root:
            root.auth("role_add", name="a-user")
            for action in ("invoke", "create", "delete"):
                root.auth("role_grant", name="a-user", action=action, prefix="a/")
        caught_up(c)     # every replica has applied auth_enable and the users
        yield c


def committed(cluster: LocalCluster, leader: Member) -> int:
    """The leader's commit index, by a Status with a login: it is itself one log entry."""
    st = cluster.member_status(leader, timeout=10)
    assert st is not None and st["is_leader"]
    return st["commit_index"]


def caught_up(cluster: LocalCluster) -> None:
    """Every replica has applied what the leader committed. A replica's gateway checks tokens
    against the users it has applied, so one lagging behind a deletion would still let the
    token through for that long (README "Security"); the kernel then decides by name."""
    for m in cluster.members:
        cluster.wait_caught_up(m)


def refusal(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details() or ""


def token(stub, user: str, password: str) -> tuple[tuple[str, str], ...]:
    t = stub.Authenticate(pb.AuthenticateRequest(user=user, password=password), timeout=10)
    return (("authorization", f"Bearer {t.token}"),)


def log_entry_requests(stub, meta=()):
    """One of each request that becomes a log entry (or, for AddNode/RemoveNode, asks the log
    whether the caller is an admin), as (name, call)."""
    kw = {"timeout": 10, "metadata": meta}
    invoke = pb.InvokeRequest(session=1, seq=1, class_name="Queue", object_name="a/q",
                              method="size", session_secret="x")
    return [
        ("Status(with_digest)", lambda: stub.Status(pb.StatusRequest(with_digest=True), **kw)),
        ("OpenSession", lambda: stub.OpenSession(pb.OpenSessionRequest(ttl=5), **kw)),
        ("CloseSession", lambda: stub.CloseSession(
            pb.CloseSessionRequest(session=1, session_secret="x"), **kw)),
        ("Invoke", lambda: stub.Invoke(invoke, **kw)),
        ("CreateObject", lambda: stub.CreateObject(pb.CreateObjectRequest(
            session=1, class_name="Queue", object_name="a/q", session_secret="x"), **kw)),
        ("DeleteObject", lambda: stub.DeleteObject(pb.DeleteObjectRequest(
            object_name="a/q"), **kw)),
        ("RegisterClass", lambda: stub.RegisterClass(pb.RegisterClassRequest(
            source="class Anon:\n    pass\n"), **kw)),
        ("ListObjects", lambda: stub.ListObjects(pb.ListObjectsRequest(), **kw)),
        ("ListClasses", lambda: stub.ListClasses(pb.ListClassesRequest(), **kw)),
        ("GetClass", lambda: stub.GetClass(pb.GetClassRequest(name="Queue"), **kw)),
        ("Auth", lambda: stub.Auth(pb.AuthRequest(op="user_list"), **kw)),
        ("AddNode", lambda: stub.AddNode(pb.AddNodeRequest(
            raft_addr="127.0.0.1:9", client_addr="127.0.0.1:10"), **kw)),
        ("RemoveNode", lambda: stub.RemoveNode(pb.RemoveNodeRequest(
            raft_addr="127.0.0.1:9"), **kw)),
        ("Calls", lambda: _stream_call(stub, invoke, meta)),
    ]


def _stream_call(stub, invoke, meta) -> None:
    """One call on a Calls stream; its refusal raised as the unary call's would be."""
    [answer] = list(stub.Calls(iter([pb.Call(id=1, invoke=invoke)]), timeout=10,
                               metadata=meta))
    assert answer.HasField("error"), answer

    class Refused(grpc.RpcError):
        def code(self):
            return {pb.ERROR_CODE_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED}.get(
                answer.error.code, grpc.StatusCode.UNKNOWN)

        def details(self):
            return answer.error.message
    raise Refused()


def test_every_log_entry_request_without_a_login_is_refused_and_commits_nothing(cluster):
    leader = cluster.find_leader()
    before = committed(cluster, leader)
    for m in cluster.members:
        with cluster.channel(m.client_addr) as channel:
            stub = pb_grpc.GesmasStub(channel)
            for name, call in log_entry_requests(stub):
                for _ in range(REPEAT):
                    code, details = refusal(call)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (m.node_id, name, details)
                    assert "needs a login" in details, (name, details)
            code, details = refusal(lambda: stub.Status(pb.StatusRequest(with_digest=True),
                                                        timeout=10))
            assert "with_digest" in details and "Authenticate" in details
            # what stays open without a login commits nothing either
            for user, password in (("root", "wrong-password"), ("nobody", "x" * 10)):
                code, details = refusal(lambda: stub.Authenticate(pb.AuthenticateRequest(
                    user=user, password=password), timeout=10))
                assert code == grpc.StatusCode.UNAUTHENTICATED
                assert details.endswith("wrong user name or password"), details
            st = stub.Status(pb.StatusRequest(), timeout=10)    # this replica's own view
            assert st.node_id == m.raft_addr and st.leader_address and not st.state_digest
            code, _ = refusal(lambda: stub.KeepAlive(pb.KeepAliveRequest(    # leader's memory
                session=10**9, session_secret="x"), timeout=10))
            assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)  # follower
            # the health check needs no login either; a replica reports NOT_SERVING for a
            # moment while it applies what was committed at its last check (node.serving),
            # so this waits on the Watch stream for SERVING (what it sends first is the
            # status now, then each change)
            health = health_pb2_grpc.HealthStub(channel)
            health.Check(health_pb2.HealthCheckRequest(service="gesmas.v1.Gesmas"), timeout=10)
            watch = health.Watch(health_pb2.HealthCheckRequest(service="gesmas.v1.Gesmas"),
                                 timeout=15)
            try:
                assert any(r.status == health_pb2.HealthCheckResponse.SERVING for r in watch)
            finally:
                watch.cancel()
    after = committed(cluster, leader)
    # the second Status is one entry; without the checks every refusal above was one or two
    assert after - before <= 2, f"{after - before} entries committed by refused requests"
    # with a login the same requests get past authentication
    with cluster.channel(cluster.members[0].client_addr) as channel:
        stub = pb_grpc.GesmasStub(channel)
        st = stub.Status(pb.StatusRequest(with_digest=True), timeout=10,
                         metadata=token(stub, "root", cluster.root_password))
        assert st.state_digest


def test_a_deleted_users_token_never_opens_a_session_for_a_later_user_of_its_name(cluster):
    with Client(cluster.addresses, **cluster.client_options()) as root:
        root.auth("user_add", name="alice", password="alice-password")
        root.auth("user_grant", name="alice", role="a-user")
        with cluster.channel(cluster.members[0].client_addr) as channel:
            first = token(pb_grpc.GesmasStub(channel), "alice", "alice-password")
        caught_up(cluster)
        for m in cluster.members:                          # any replica accepts it
            with cluster.channel(m.client_addr) as channel:
                pb_grpc.GesmasStub(channel).ListObjects(pb.ListObjectsRequest(), timeout=10,
                                                        metadata=first)

        root.auth("user_delete", name="alice")
        caught_up(cluster)
        for m in cluster.members:
            with cluster.channel(m.client_addr) as channel:
                code, details = refusal(lambda: pb_grpc.GesmasStub(channel).OpenSession(
                    pb.OpenSessionRequest(ttl=5), timeout=10, metadata=first))
                assert code == grpc.StatusCode.UNAUTHENTICATED
                assert "user 'alice' was deleted" in details, details

        # root makes another alice, with the same password even
        root.auth("user_add", name="alice", password="alice-password")
        root.auth("user_grant", name="alice", role="a-user")
        caught_up(cluster)
        leader = cluster.find_leader()
        before = committed(cluster, leader)
        for m in cluster.members:
            with cluster.channel(m.client_addr) as channel:
                stub = pb_grpc.GesmasStub(channel)
                for name, call in log_entry_requests(stub, first):
                    code, details = refusal(call)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (m.node_id, name, details)
                    assert "deleted and made again" in details, (name, details)
        assert committed(cluster, leader) - before <= 2

        with pytest.raises(Unauthenticated, match="revoked"):
            Client(cluster.addresses, tls=TLS(ca=cluster.pki.ca_cert),
                   token=first[0][1].split(" ", 1)[1], retry_timeout=3)

        # the new alice's own token works, on every replica
        with cluster.channel(cluster.members[1].client_addr) as channel:
            second = token(pb_grpc.GesmasStub(channel), "alice", "alice-password")
        for m in cluster.members:
            with cluster.channel(m.client_addr) as channel:
                stub = pb_grpc.GesmasStub(channel)
                opened = stub.OpenSession(pb.OpenSessionRequest(ttl=5), timeout=10,
                                          metadata=second)
                stub.CloseSession(pb.CloseSessionRequest(
                    session=opened.session, session_secret=opened.session_secret),
                    timeout=10, metadata=second)
        with Client(cluster.addresses, **cluster.client_options("alice", "alice-password")) \
                as alice:
            alice.queue("a/second-alice").produce(1)
            assert alice.queue("a/second-alice").consume(timeout=1) == 1
