"""Authorization in the kernel: users, roles, permissions, reserved class names, session
secrets and quotas, decided from the log alone (kernel/auth.py). The same checks through a
real cluster, with TLS and tokens, are in test_security_cluster.py."""
from __future__ import annotations

import copy

import pytest

from gesmas.server.kernel import (Checkpoint, CloseSession, Code, Config, CreateObject, Invoke,
                                  Kernel, OpenSession, RegisterClass, codec)
from gesmas.server.kernel.auth import SYSTEM, AuthState
from gesmas.server.kernel.codec import Auth, Cancel, DeleteObject, Query
from gesmas.server.tokens import Tokens, hash_password

from kernel_harness import H

BUF = """
class Buf:
    def __init__(self):
        self.items = []
    def put(self, x):
        self.items.append(x)
        return len(self.items)
    def take(self):
        return self.items.pop(0) if self.items else None
"""
WAIT = """
class Gate:
    def __init__(self):
        self.s = Semaphore(0)
    def wait(self):
        self.s.acquire()
        return True
    def open(self):
        self.s.release()
"""


def admin(h: H, op: str, user: str = "root", **args) -> object:
    c = h.run(Auth(op=op, args=args, user=user))
    assert c.error is None, c.error
    return c.value


def code_of(c) -> Code | None:
    return c.error.code if c.error is not None else None


def secured(config: Config | None = None) -> H:
    """A kernel with users root (all), alice (queue-like objects under "a/"), bob (none),
    classes Buf and Gate, and auth enabled."""
    h = H(config or Config(reserved_classes=frozenset({"Queue"})))
    h.run(RegisterClass(source=BUF, user=SYSTEM))
    h.run(RegisterClass(source=WAIT, user=SYSTEM))
    for name in ("root", "alice", "bob"):
        admin(h, "user_add", name=name, hash=f"h-{name}")
    admin(h, "user_grant", name="root", role="root")
    admin(h, "role_add", name="a-user")
    for action in ("invoke", "create", "delete"):
        admin(h, "role_grant", name="a-user", action=action, prefix="a/")
    admin(h, "role_grant", name="a-user", action="register", prefix="A")
    admin(h, "user_grant", name="alice", role="a-user")
    assert admin(h, "auth_enable") is True
    return h


def session(h: H, user: str, secret: str = "sec") -> int:
    c = h.run(OpenSession(ttl=10.0, user=user, secret=secret))
    assert c.error is None, c.error
    return c.value


def invoke(h: H, sid: int, name: str, method: str, *args, user: str, secret: str = "sec",
           seq: int | None = None, timeout: float | None = None):
    seq = seq if seq is not None else h.seqs.get(sid, 0) + 1
    h.seqs[sid] = max(seq, h.seqs.get(sid, 0))
    cmd = Invoke(session=sid, seq=seq, name=name, method=method, args=list(args),
                 timeout=timeout, user=user, secret=secret, tag=h.tag())
    return h.apply(cmd).get(cmd.tag), cmd.tag


def test_auth_enable_needs_a_root_user_with_the_root_role():
    h = H()
    c = h.run(Auth(op="auth_enable"))
    assert code_of(c) == Code.INVALID_ARGUMENT and "root" in c.error.message
    admin(h, "user_add", user="", name="root", hash="x")     # auth off: anyone may prepare
    assert code_of(h.run(Auth(op="auth_enable"))) == Code.INVALID_ARGUMENT
    admin(h, "user_grant", user="", name="root", role="root")
    assert admin(h, "auth_enable", user="") is True
    # now the same anonymous caller is refused everything, the counts and the digest too
    # (each is a log entry; the gateway answers a Status without login outside the log)
    assert code_of(h.run(Auth(op="user_list"))) == Code.UNAUTHENTICATED
    assert code_of(h.run(OpenSession(ttl=5.0))) == Code.UNAUTHENTICATED
    for what in ("objects", "stats", "digest", "digest_parts"):
        assert code_of(h.run(Query(what=what))) == Code.UNAUTHENTICATED, what
    assert h.run(Query(what="digest", user="root")).error is None


def test_permissions_by_prefix_and_nothing_changes_on_a_refusal():
    h = secured()
    before = h.kernel.state_digest(volatile=False)
    for user, name in (("bob", "a/q"), ("alice", "b/q"), ("", "a/q"), ("mallory", "a/q")):
        c = h.run(CreateObject(class_name="Buf", name=name, user=user))
        expected = Code.PERMISSION_DENIED if user in ("alice", "bob") else Code.UNAUTHENTICATED
        assert code_of(c) == expected, (user, name, c.error)
    assert h.kernel.state_digest(volatile=False) == before
    assert h.run(CreateObject(class_name="Buf", name="a/q", user="alice")).error is None
    assert h.run(CreateObject(class_name="Buf", name="b/q", user="root")).error is None
    sa, sb = session(h, "alice"), session(h, "bob")
    assert invoke(h, sa, "a/q", "put", 1, user="alice")[0].value == 1
    c, _ = invoke(h, sb, "a/q", "put", 2, user="bob")
    assert code_of(c) == Code.PERMISSION_DENIED and "'invoke'" in c.error.message
    assert code_of(invoke(h, sa, "b/q", "put", 3, user="alice")[0]) == Code.PERMISSION_DENIED
    # bob cannot delete alice's object (the DeleteObject of the issue needed no session)
    assert code_of(h.run(DeleteObject(name="a/q", user="bob"))) == Code.PERMISSION_DENIED
    assert code_of(h.run(DeleteObject(name="a/q"))) == Code.UNAUTHENTICATED
    assert invoke(h, sa, "a/q", "take", user="alice")[0].value == 1     # still there
    assert h.run(DeleteObject(name="a/q", user="alice")).error is None
    # a revoked permission is gone at once
    admin(h, "role_revoke", name="a-user", action="create", prefix="a/")
    assert code_of(h.run(CreateObject(class_name="Buf", name="a/r", user="alice"))) \
        == Code.PERMISSION_DENIED


def test_only_admins_manage_users_roles_and_auth():
    h = secured()
    for op, args in (("user_add", {"name": "eve", "hash": "x"}), ("user_list", {}),
                     ("user_grant", {"name": "bob", "role": "root"}),
                     ("role_add", {"name": "r"}), ("auth_disable", {}), ("check_admin", {}),
                     ("user_passwd", {"name": "alice", "hash": "y"}),
                     ("user_quota", {"name": "bob", "quota": {"sessions": 1000}})):
        c = h.run(Auth(op=op, args=args, user="bob"))
        assert code_of(c) == Code.PERMISSION_DENIED, (op, c.error)
    assert h.run(Auth(op="bootstrap", args={"hash": "x"}, user="root")).error.code \
        == Code.PERMISSION_DENIED                      # the replicas' own operation
    assert h.run(Auth(op="credentials", args={"name": "root"}, user="root")).error.code \
        == Code.PERMISSION_DENIED
    # users change their own password; it bumps the generation (tokens before it fail)
    gen = h.kernel.auth.users["bob"]["gen"]
    assert admin(h, "user_passwd", user="bob", name="bob", hash="new") is True
    assert h.kernel.auth.users["bob"]["gen"] == gen + 1
    c = h.run(Auth(op="user_delete", args={"name": "root"}, user="root"))
    assert code_of(c) == Code.INVALID_ARGUMENT            # root stays while auth is on
    admin(h, "user_grant", name="bob", role="root")
    assert admin(h, "check_admin", user="bob") is True


def test_a_deleted_user_is_unauthenticated_even_with_an_open_session():
    h = secured()
    h.run(CreateObject(class_name="Buf", name="a/q", user="alice"))
    sa = session(h, "alice")
    admin(h, "user_delete", name="alice")
    assert code_of(invoke(h, sa, "a/q", "put", 1, user="alice")[0]) == Code.UNAUTHENTICATED


def test_reserved_class_names_cannot_be_uploaded_by_anyone():
    h = H(Config(reserved_classes=frozenset({"Queue"})))     # auth off
    h.run(RegisterClass(source="class Queue:\n    def f(self):\n        return 'std'\n",
                        user=SYSTEM))
    for user in ("", "root"):
        c = h.run(RegisterClass(source="class Queue:\n    def f(self):\n        return 'evil'\n",
                                user=user))
        assert code_of(c) == Code.PERMISSION_DENIED and "reserved" in c.error.message
    c = h.run(RegisterClass(source="class Mine:\n    pass\nclass Queue:\n    pass\n"))
    assert code_of(c) == Code.PERMISSION_DENIED          # nothing of that source registered
    assert h.kernel.registry.latest("Mine") is None
    assert h.kernel.registry.latest("Queue").version == 1


def test_register_needs_a_permission_on_the_class_name():
    h = secured()
    ok = h.run(RegisterClass(source="class Alpha:\n    pass\n", user="alice"))
    assert ok.error is None
    c = h.run(RegisterClass(source="class Alpha2:\n    pass\nclass Beta:\n    pass\n",
                            user="alice"))
    assert code_of(c) == Code.PERMISSION_DENIED and "'Beta'" in c.error.message
    assert h.kernel.registry.latest("Alpha2") is None


def test_a_session_id_alone_is_not_a_credential():
    h = H()                                               # auth off: the secret still counts
    h.register(BUF)
    h.create("Buf", "b")
    victim = session(h, "", secret="victim-secret")
    assert invoke(h, victim, "b", "put", 1, user="", secret="victim-secret")[0].error is None
    for secret in ("", "guess", "victim-secre"):
        c, _ = invoke(h, victim, "b", "put", 2, user="", secret=secret)
        assert code_of(c) == Code.PERMISSION_DENIED
        c = h.run(CloseSession(session=victim, secret=secret))
        assert code_of(c) == Code.PERMISSION_DENIED
    assert victim in h.kernel.sessions
    c = h.run(CreateObject(class_name="Buf", name="c", session=victim, secret="nope"))
    assert code_of(c) == Code.PERMISSION_DENIED
    assert h.run(CloseSession(session=victim, secret="victim-secret")).error is None


def test_with_auth_a_session_belongs_to_its_user():
    h = secured()
    h.run(CreateObject(class_name="Buf", name="a/q", user="root"))
    sa = session(h, "alice", secret="s")
    c, _ = invoke(h, sa, "a/q", "put", 1, user="root", secret="s")   # the secret, not the user
    assert code_of(c) == Code.PERMISSION_DENIED


def test_a_cancel_for_another_callers_session_withdraws_nothing():
    h = H()
    h.register(WAIT)
    h.create("Gate", "g")
    s = session(h, "", secret="mine")
    c, tag = invoke(h, s, "g", "wait", user="", secret="mine")
    assert c is None                                     # waiting
    h.run(Cancel(session=s, seq=h.seqs[s], call_tag=tag, secret="other"))
    assert h.kernel._waiting == 1
    h.run(Cancel(session=s, seq=h.seqs[s], call_tag=tag, secret="mine"))
    assert h.kernel._waiting == 0


def test_an_ack_at_or_beyond_seq_is_refused():
    h = H()
    h.register(BUF)
    h.create("Buf", "b")
    s = session(h, "")
    for ack in (1, 2**63 - 1, -1):
        cmd = Invoke(session=s, seq=1, ack=ack, name="b", method="put", args=[1], tag=h.tag(),
                     secret="sec")
        c = h.apply(cmd)[cmd.tag]
        assert code_of(c) == Code.INVALID_ARGUMENT
    assert h.kernel.sessions[s].acked == 0
    assert invoke(h, s, "b", "put", 1, user="", seq=1)[0].value == 1


def test_the_default_quotas_hold_a_million_objects_and_errors_say_where_a_limit_comes_from():
    """Callers without a login share one quota: by default it holds a million objects. Past
    a quota the error names it, its value, and whether it is the user's own or the default
    (and how to change that)."""
    from gesmas.server.kernel.records import State
    State(Config()).within("", "objects", 1_000_000)          # raises if it does not fit
    h = H(Config(default_quota=(("objects", 2),)))
    h.run(RegisterClass(source=BUF, user=SYSTEM))
    for name in ("x", "y"):
        assert h.run(CreateObject(class_name="Buf", name=name)).error is None
    c = h.run(CreateObject(class_name="Buf", name="z"))
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and c.error.type == "QuotaExceeded"
    assert c.error.message == (
        "quota objects of anonymous callers exceeded: 2 in use, limit 2 (the default quota, "
        "shared by every caller without a login: log in as a user to have a quota of its own)")
    admin(h, "user_add", name="carol", hash="h-carol")
    for name in ("c1", "c2"):
        assert h.run(CreateObject(class_name="Buf", name=name, user="carol")).error is None
    c = h.run(CreateObject(class_name="Buf", name="c3", user="carol"))
    assert c.error.message.endswith("limit 2 (the default quota; `gesmas user quota carol "
                                    "--objects N` sets its own)")
    admin(h, "user_quota", name="carol", quota={"objects": 3, "state_bytes": 1})
    assert h.run(CreateObject(class_name="Buf", name="c3", user="carol")).error is None
    c = h.run(CreateObject(class_name="Buf", name="c4", user="carol"))
    assert c.error.message == ("quota objects of user 'carol' exceeded: 3 in use, limit 3 "
                               "(the user's own quota)")


def test_quotas_are_per_user_and_named_in_the_error():
    h = secured()
    admin(h, "user_quota", name="alice", quota={"sessions": 2, "objects": 1, "waiters": 1,
                                               "source_bytes": 40})
    session(h, "alice")
    session(h, "alice")
    c = h.run(OpenSession(ttl=5.0, user="alice", secret="x"))
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and "sessions" in c.error.message
    session(h, "bob")                                    # other users are not affected
    assert h.run(CreateObject(class_name="Gate", name="a/g", user="alice")).error is None
    c = h.run(CreateObject(class_name="Gate", name="a/h", user="alice"))
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and "objects" in c.error.message
    sid = next(s.id for s in h.kernel.sessions.values() if s.user == "alice")
    assert invoke(h, sid, "a/g", "wait", user="alice")[0] is None      # one waiter: allowed
    c, _ = invoke(h, sid, "a/g", "wait", user="alice")
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and "waiters" in c.error.message
    c = h.run(RegisterClass(source="class A1:\n    pass\n" + "#" * 40, user="alice"))
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and "source_bytes" in c.error.message
    # deleting frees the object quota; the usage is recounted by a restore
    assert h.run(DeleteObject(name="a/g", user="alice")).error is None
    assert h.run(CreateObject(class_name="Buf", name="a/b", user="alice")).error is None
    h.run(Checkpoint())
    k = Kernel.restore(h.kernel.checkpoint_blob, h.kernel.config)
    assert k.usage.counts == h.kernel.usage.counts


def test_state_bytes_quota_stops_calls_on_the_owners_objects():
    h = secured(Config(max_object_bytes=1 << 16))
    admin(h, "user_quota", name="alice", quota={"state_bytes": 2000})
    h.run(CreateObject(class_name="Buf", name="a/q", user="alice"))
    s = session(h, "alice")
    c, _ = invoke(h, s, "a/q", "put", "x" * 5000, user="alice")
    assert c.error is None
    h.run(Checkpoint())                                  # sizes are measured at checkpoints
    c, _ = invoke(h, s, "a/q", "put", 1, user="alice")
    assert code_of(c) == Code.RESOURCE_EXHAUSTED and "state_bytes" in c.error.message


def test_auth_state_survives_a_checkpoint_and_is_in_the_digest():
    h = secured()
    h.run(CreateObject(class_name="Buf", name="a/q", user="alice"))
    h.run(Checkpoint())
    k = Kernel.restore(h.kernel.checkpoint_blob, h.kernel.config)
    assert k.auth.enabled and k.auth.users == h.kernel.auth.users
    assert k.auth.roles == h.kernel.auth.roles and k.objects["a/q"].owner == "alice"
    assert k.state_digest() == h.kernel.state_digest()
    digest = h.kernel.state_digest()
    admin(h, "role_add", name="another")
    assert h.kernel.state_digest() != digest


def test_a_version_1_command_still_decodes():
    cmd = Invoke(session=4, seq=2, name="b", method="put", args=[1], user="u", secret="s")
    data = bytearray(codec.encode(cmd))
    items = codec.decode_value(bytes(data[1:]))
    v1 = [x for x, n in zip(items, ["code", "ts", "tag", *codec._FIELDS[Invoke]])
          if n not in codec._NEW_IN_2]
    old = codec.decode(bytes([1]) + codec.encode_value(v1))
    assert (old.session, old.seq, old.name, old.user, old.secret) == (4, 2, "b", "", "")


@pytest.mark.parametrize("op,args", [
    ("user_add", {"name": "@system", "hash": "x"}), ("user_add", {"name": "", "hash": "x"}),
    ("user_add", {"name": "a" * 65, "hash": "x"}), ("user_add", {"name": 5, "hash": "x"}),
    ("role_grant", {"name": "r", "action": "everything", "prefix": ""}),
    ("user_quota", {"name": "u", "quota": {"sessions": -1}}),
    ("user_quota", {"name": "u", "quota": {"coffee": 1}}), ("no_such_op", {}),
])
def test_malformed_auth_operations_are_invalid(op, args):
    h = H()
    admin(h, "user_add", user="", name="u", hash="x")
    admin(h, "role_add", user="", name="r")
    c = h.run(Auth(op=op, args=args))
    assert code_of(c) == Code.INVALID_ARGUMENT, c.error


def test_invoke_with_create_is_get_or_create_in_one_command():
    h = secured()
    sa = session(h, "alice")
    cmd = Invoke(session=sa, seq=1, name="a/new", method="put", args=[7], class_name="Buf",
                 create=True, user="alice", secret="sec", tag=h.tag())
    assert h.apply(cmd)[cmd.tag].value == 1                   # made and called: one entry
    assert h.kernel.objects["a/new"].owner == "alice"
    again = Invoke(session=sa, seq=1, name="a/new", method="put", args=[7], class_name="Buf",
                   create=True, user="alice", secret="sec", tag=h.tag())
    assert h.apply(again)[again.tag].value == 1               # a retry: the stored result
    nxt = Invoke(session=sa, seq=2, name="a/new", method="put", args=[8], class_name="Buf",
                 create=True, user="alice", secret="sec", tag=h.tag())
    assert h.apply(nxt)[nxt.tag].value == 2                   # exists: just the call
    for name, cls, user, code in (("a/g", "Gate", "bob", Code.PERMISSION_DENIED),
                                  ("a/new", "Gate", "alice", Code.ALREADY_EXISTS),
                                  ("a/x", "Nope", "alice", Code.NOT_FOUND)):
        sid = session(h, user)
        c = h.apply(Invoke(session=sid, seq=1, name=name, method="put", args=[1],
                           class_name=cls, create=True, user=user, secret="sec",
                           tag="t-" + name + cls))["t-" + name + cls]
        assert code_of(c) == code, (name, cls, c.error)
    assert "a/g" not in h.kernel.objects and "a/x" not in h.kernel.objects
    bad = Invoke(session=sa, seq=3, name="a/bad", method="put", args=[1], class_name="Buf",
                 create=True, ctor_args=[1, 2], user="alice", secret="sec", tag=h.tag())
    assert code_of(h.apply(bad)[bad.tag]) == Code.INVALID_ARGUMENT   # constructor arguments


def test_a_listing_shows_only_the_objects_a_user_may_use():
    h = secured()
    for name in ("a/mine", "b/theirs"):
        assert h.run(CreateObject(class_name="Buf", name=name, user="root")).error is None
    names = {u: sorted(o["name"] for o in h.run(Query(what="objects", user=u)).value)
             for u in ("root", "alice", "bob")}
    assert names == {"root": ["a/mine", "b/theirs"], "alice": ["a/mine"], "bob": []}


def test_a_user_without_any_register_permission_has_nothing_compiled():
    h = secured()
    loads = []
    real = h.kernel.registry._load
    h.kernel.registry._load = lambda *a: loads.append(a) or real(*a)
    c = h.run(RegisterClass(source="class Zed:\n    pass\n", user="bob"))
    assert code_of(c) == Code.PERMISSION_DENIED and loads == []
    c = h.run(RegisterClass(source="class Zed:\n    pass\n", user="alice"))
    assert code_of(c) == Code.PERMISSION_DENIED and len(loads) == 1   # names checked after


# -- tokens bound to the user record they were issued for ------------------------------------
# The gateway reads a user's stored password hash from its replica's applied state
# (Node.password_hash) and asks Tokens.revoked; these tests do the same on a kernel.

def stored_hash(k: Kernel, name: str) -> str | None:
    u = k.auth.users.get(name)
    return None if u is None else u["hash"]


def login(h: H, t: Tokens, name: str):
    """What Authenticate hands out: a token bound to the record the log holds."""
    creds = h.run(Auth(op="credentials", args={"name": name}, user=SYSTEM)).value
    return t.verify(t.issue(name, creds["gen"], creds["hash"]))


def test_a_token_is_revoked_for_good_when_its_user_is_deleted_whatever_comes_later():
    h, t = secured(), Tokens("cluster-secret")
    admin(h, "user_delete", name="alice")
    # the gateway salts every hash afresh: the same password twice is two hashes
    admin(h, "user_add", name="alice", hash=hash_password("alice-password"))
    first = login(h, t, "alice")
    assert t.revoked(first, stored_hash(h.kernel, "alice")) is None
    admin(h, "user_delete", name="alice")
    assert "was deleted" in t.revoked(first, stored_hash(h.kernel, "alice"))
    admin(h, "user_add", name="alice", hash=hash_password("alice-password"))
    admin(h, "user_grant", name="alice", role="a-user")
    reason = t.revoked(first, stored_hash(h.kernel, "alice"))
    assert reason is not None and "deleted and made again" in reason
    second = login(h, t, "alice")
    assert (second.user, second.gen) == (first.user, first.gen)      # name and gen alike
    assert t.revoked(second, stored_hash(h.kernel, "alice")) is None
    # a password change revokes too; a replica restored from a checkpoint decides the same
    admin(h, "user_passwd", name="alice", hash=hash_password("another-password"))
    third = login(h, t, "alice")
    h.run(Checkpoint())
    restored = Kernel.restore(h.kernel.checkpoint_blob, h.kernel.config)
    for k in (h.kernel, restored):
        assert [t.revoked(c, stored_hash(k, "alice")) is None
                for c in (first, second, third)] == [False, False, True]
    # root deleting alice for good: every token of every alice is refused
    admin(h, "user_delete", name="alice")
    assert all("was deleted" in t.revoked(c, stored_hash(h.kernel, "alice"))
               for c in (first, second, third))


def test_tokens_bind_to_users_of_a_state_written_by_the_previous_version():
    """The binding needs no new field in the replicated state: users as the previous version
    wrote them (hash, roles, quota, gen) load, and every replica binds tokens to them alike."""
    t = Tokens("cluster-secret")
    old = {"enabled": True, "revision": 7, "source_used": {},
           "roles": {"a-user": [["invoke", "a/"]]},
           "users": {"root": {"hash": hash_password("root-password"), "roles": ["root"],
                              "quota": {}, "gen": 1},
                     "alice": {"hash": hash_password("alice-password"), "roles": ["a-user"],
                               "quota": {}, "gen": 2}}}
    a, b = AuthState.load(copy.deepcopy(old)), AuthState.load(copy.deepcopy(old))
    assert a.dump() == b.dump() == old
    claims = t.verify(t.issue("alice", 2, a.users["alice"]["hash"]))
    assert t.revoked(claims, b.users["alice"]["hash"]) is None
    b.apply("user_delete", {"name": "alice"}, "root")
    b.apply("user_add", {"name": "alice", "hash": hash_password("alice-password")}, "root")
    assert t.revoked(claims, b.users["alice"]["hash"]) is not None
