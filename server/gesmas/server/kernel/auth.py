"""Who may do what: users, roles, permissions and quotas, replicated through the log.

The state here is part of the kernel's (checkpointed, in the digest) and changes only by
`Auth` commands, so every replica decides every check the same way. Authentication itself
(passwords, tokens, client certificates) happens in the gateway, which puts the name of the
authenticated user in each command (`Command.user`); the kernel trusts that field, as it
trusts every command of the log, and decides with it:

- **Auth disabled** (a new cluster): every call is allowed, as in etcd; users and roles can
  be prepared. `auth_enable` needs the user "root" holding the role "root".
- **Auth enabled**: a command without a user is UNAUTHENTICATED; a user that no longer
  exists is UNAUTHENTICATED; otherwise a permission of one of the user's roles must match,
  else PERMISSION_DENIED. The role "root" is built in and may do everything.

Permissions are (action, prefix): `invoke`, `create`, `delete` on object names starting
with prefix, `register` on class names starting with prefix, `admin` (membership, users,
roles, auth; prefix ignored). `read` (list objects and classes, class sources, status) is
granted to every authenticated user.

A user record's password hash is also its identity for tokens (tokens.py binds a token to a
fingerprint of it): the gateway salts every hash afresh for each user_add and user_passwd, so
no later record, even under the same name, has the hash of an earlier one. Nothing here may
copy a hash from one record to another. The replicas do read the records outside the log (the
gateway checks passwords and tokens against its own replica's applied users): records are
only ever changed by assigning whole values (`u["hash"] = ...`), never left half-written.

`SYSTEM` is the user of commands the replicas propose themselves (the standard classes, the
first root user from --root-password-file); the gateway never gives it to a client, because
user names cannot start with "@".

Quotas are per user (`QUOTAS`); a user without its own value for one gets the cluster
default (`Config.default_quota`), the role "root" has none. Usage is counted by the kernel.
"""
from __future__ import annotations

import re
from typing import Any

from .errors import Code, KernelError

ACTIONS = ("invoke", "create", "delete", "register", "admin")
QUOTAS = ("sessions", "objects", "waiters", "state_bytes", "source_bytes")
ROOT = "root"
SYSTEM = "@system"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
MAX_PREFIX = 256
MAX_PERMS = 1000            # permissions per role
MAX_USERS = 10_000
MAX_ROLES = 10_000


def valid_name(kind: str, name: Any) -> str:
    if type(name) is not str or not _NAME.fullmatch(name):
        raise KernelError(Code.INVALID_ARGUMENT,
                          f"{kind} name must be 1 to 64 letters, digits, '_', '.' or '-' "
                          f"(not starting with '.' or '-'), not {name!r}")
    return name


class AuthState:
    """Users, roles and the enabled flag: the replicated part (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled = False
        # name -> {"hash": str, "roles": [role...], "quota": {what: int}, "gen": int}
        self.users: dict[str, dict[str, Any]] = {}
        # name -> [[action, prefix], ...]
        self.roles: dict[str, list[list[str]]] = {}
        self.revision = 0                   # counts changes
        self.source_used: dict[str, int] = {}   # user -> characters of class source uploaded

    def dump(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "users": self.users, "roles": self.roles,
                "revision": self.revision, "source_used": self.source_used}

    @classmethod
    def load(cls, state: dict[str, Any] | None) -> AuthState:
        a = cls()
        if state:
            a.enabled, a.users, a.roles = state["enabled"], state["users"], state["roles"]
            a.revision, a.source_used = state["revision"], state["source_used"]
        return a

    # -- checks ------------------------------------------------------------------------------

    def is_root(self, user: str) -> bool:
        u = self.users.get(user)
        return user == SYSTEM or (u is not None and ROOT in u["roles"])

    def authenticated(self, user: Any) -> None:
        """The command must carry a user that exists (when auth is enabled)."""
        if not self.enabled or user == SYSTEM:
            return
        if type(user) is not str or not user:
            raise KernelError(Code.UNAUTHENTICATED, "authentication required: this cluster "
                              "has auth enabled (log in with a user and password, a token or "
                              "a client certificate)", "Unauthenticated")
        if user not in self.users:
            raise KernelError(Code.UNAUTHENTICATED, f"user {user!r} does not exist (deleted?)",
                              "Unauthenticated")

    def check(self, user: Any, action: str, name: str) -> None:
        """Raise unless `user` may do `action` on `name` (an object or class name)."""
        if not self.enabled or user == SYSTEM:
            return
        self.authenticated(user)
        u = self.users[user]
        if ROOT in u["roles"]:
            return
        for role in u["roles"]:
            for act, prefix in self.roles.get(role, ()):
                if act == action and (action == "admin" or name.startswith(prefix)):
                    return
        what = "administer the cluster" if action == "admin" else f"{action} {name!r}"
        raise KernelError(Code.PERMISSION_DENIED, f"user {user!r} may not {what} (no role of "
                          f"it grants {action!r} on a prefix of that name)", "PermissionDenied")

    def may_register(self, user: Any) -> None:
        """Raise unless `user` may register some class name: checked before an upload is
        compiled, so that a user without any register permission cannot make the replicas
        run class bodies (the names are checked one by one after compiling)."""
        if not self.enabled or self.is_root(user):
            return
        self.authenticated(user)
        u = self.users[user]
        if not any(act == "register" for role in u["roles"]
                   for act, _ in self.roles.get(role, ())):
            raise KernelError(Code.PERMISSION_DENIED, f"user {user!r} may not register "
                              "classes (no role of it grants 'register')", "PermissionDenied")

    def visible(self, user: Any, name: str) -> bool:
        """Whether `user` may see the object `name` in a listing: it may invoke, create or
        delete it (everyone when auth is off)."""
        if not self.enabled or self.is_root(user):
            return True
        u = self.users.get(user) if type(user) is str else None
        if u is None:
            return False
        return any(act in ("invoke", "create", "delete") and name.startswith(prefix)
                   for role in u["roles"] for act, prefix in self.roles.get(role, ()))

    def quota(self, user: str, what: str, default: dict[str, int]) -> int | None:
        """The user's limit for `what`, None for none (root)."""
        u = self.users.get(user)
        if u is not None and what in u["quota"]:
            return u["quota"][what]
        if user == SYSTEM or (u is not None and ROOT in u["roles"]):
            return None
        return default.get(what)

    # -- changes (Auth commands) ---------------------------------------------------------------

    def apply(self, op: str, args: dict[str, Any], user: str) -> Any:
        """Apply one administrative operation; returns its answer."""
        handler = _OPS.get(op) if type(op) is str else None
        if handler is None:
            raise KernelError(Code.INVALID_ARGUMENT, f"unknown auth operation {op!r}")
        if type(args) is not dict:
            raise KernelError(Code.INVALID_ARGUMENT, "auth arguments must be a map")
        return handler(self, args, user)

    def _admin(self, user: str) -> None:
        self.check(user, "admin", "")

    def _user(self, args: dict[str, Any], key: str = "name") -> dict[str, Any]:
        name = args.get(key)
        u = self.users.get(name) if type(name) is str else None
        if u is None:
            raise KernelError(Code.NOT_FOUND, f"no user named {name!r}")
        return u

    def _changed(self) -> None:
        self.revision += 1

    def _user_add(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        name = valid_name("user", args.get("name"))
        if name in self.users:
            raise KernelError(Code.ALREADY_EXISTS, f"user {name!r} already exists")
        if len(self.users) >= MAX_USERS:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"more than {MAX_USERS} users")
        self.users[name] = {"hash": _hash(args), "roles": [], "quota": {}, "gen": 1}
        self._changed()
        return True

    def _user_delete(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        self._user(args)
        name = args["name"]
        if name == ROOT and self.enabled:
            raise KernelError(Code.INVALID_ARGUMENT,
                              "the root user cannot be deleted while auth is enabled")
        del self.users[name]
        self._changed()
        return True

    def _user_passwd(self, args: dict[str, Any], user: str) -> Any:
        if args.get("name") != user:        # users change their own password
            self._admin(user)
        u = self._user(args)
        u["hash"] = _hash(args)
        u["gen"] += 1                       # tokens issued before are no longer accepted
        self._changed()
        return True

    def _user_grant(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        u = self._user(args)
        role = args.get("role")
        if role != ROOT and role not in self.roles:
            raise KernelError(Code.NOT_FOUND, f"no role named {role!r}")
        if role in u["roles"]:
            return False
        u["roles"].append(role)
        self._changed()
        return True

    def _user_revoke(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        u = self._user(args)
        role = args.get("role")
        if role == ROOT and args.get("name") == ROOT and self.enabled:
            raise KernelError(Code.INVALID_ARGUMENT, "the root user keeps the root role while "
                              "auth is enabled")
        if role not in u["roles"]:
            return False
        u["roles"].remove(role)
        self._changed()
        return True

    def _user_quota(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        u = self._user(args)
        quota = args.get("quota")
        if type(quota) is not dict:
            raise KernelError(Code.INVALID_ARGUMENT, "quota must be a map")
        for what, value in quota.items():
            if what not in QUOTAS:
                raise KernelError(Code.INVALID_ARGUMENT, f"unknown quota {what!r} (quotas: "
                                  f"{', '.join(QUOTAS)})")
            if value is not None and (type(value) is not int or value < 0):
                raise KernelError(Code.INVALID_ARGUMENT,
                                  f"quota {what} must be an integer >= 0 or null, not {value!r}")
        for what, value in quota.items():
            if value is None:
                u["quota"].pop(what, None)
            else:
                u["quota"][what] = value
        self._changed()
        return dict(u["quota"])

    def _user_get(self, args: dict[str, Any], user: str) -> Any:
        if args.get("name") != user:
            self._admin(user)
        u = self._user(args)
        return {"name": args["name"], "roles": list(u["roles"]), "quota": dict(u["quota"])}

    def _user_list(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        return sorted(self.users)

    def _role_add(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        name = valid_name("role", args.get("name"))
        if name == ROOT or name in self.roles:
            raise KernelError(Code.ALREADY_EXISTS, f"role {name!r} already exists")
        if len(self.roles) >= MAX_ROLES:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"more than {MAX_ROLES} roles")
        self.roles[name] = []
        self._changed()
        return True

    def _role(self, args: dict[str, Any]) -> list[list[str]]:
        name = args.get("name")
        if name == ROOT:
            raise KernelError(Code.INVALID_ARGUMENT, "the root role is built in (it may do "
                              "everything) and cannot be changed")
        perms = self.roles.get(name) if type(name) is str else None
        if perms is None:
            raise KernelError(Code.NOT_FOUND, f"no role named {name!r}")
        return perms

    def _role_delete(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        self._role(args)
        del self.roles[args["name"]]
        for u in self.users.values():
            if args["name"] in u["roles"]:
                u["roles"].remove(args["name"])
        self._changed()
        return True

    def _perm(self, args: dict[str, Any]) -> list[str]:
        action, prefix = args.get("action"), args.get("prefix", "")
        if action not in ACTIONS:
            raise KernelError(Code.INVALID_ARGUMENT, f"action must be one of "
                              f"{', '.join(ACTIONS)}, not {action!r}")
        if type(prefix) is not str or len(prefix) > MAX_PREFIX:
            raise KernelError(Code.INVALID_ARGUMENT, f"prefix must be a string of at most "
                              f"{MAX_PREFIX} characters")
        return [action, "" if action == "admin" else prefix]

    def _role_grant(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        perms = self._role(args)
        perm = self._perm(args)
        if perm in perms:
            return False
        if len(perms) >= MAX_PERMS:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"more than {MAX_PERMS} permissions")
        perms.append(perm)
        self._changed()
        return True

    def _role_revoke(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        perms = self._role(args)
        perm = self._perm(args)
        if perm not in perms:
            return False
        perms.remove(perm)
        self._changed()
        return True

    def _role_get(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        if args.get("name") == ROOT:
            return {"name": ROOT, "permissions": [["*", ""]]}
        return {"name": args["name"], "permissions": [list(p) for p in self._role(args)]}

    def _role_list(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        return [ROOT] + sorted(self.roles)

    def _enable(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        root = self.users.get(ROOT)
        if root is None or ROOT not in root["roles"]:
            raise KernelError(Code.INVALID_ARGUMENT, "auth cannot be enabled before the user "
                              "'root' exists with the role 'root' (gesmas user add root; "
                              "gesmas user grant root root)")
        if self.enabled:
            return False
        self.enabled = True
        self._changed()
        return True

    def _disable(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        if not self.enabled:
            return False
        self.enabled = False
        self._changed()
        return True

    def _check_admin(self, args: dict[str, Any], user: str) -> Any:
        self._admin(user)
        return True

    def _status(self, args: dict[str, Any], user: str) -> Any:
        return {"enabled": self.enabled, "revision": self.revision}

    def _bootstrap(self, args: dict[str, Any], user: str) -> Any:
        """The replicas' own first root user (--root-password-file): only on a cluster that
        has no user yet, and only from SYSTEM."""
        if user != SYSTEM:
            raise KernelError(Code.PERMISSION_DENIED, "bootstrap is for the replicas only")
        if self.users:
            return False
        self.users[ROOT] = {"hash": _hash(args), "roles": [ROOT], "quota": {}, "gen": 1}
        self.enabled = True
        self._changed()
        return True

    def _credentials(self, args: dict[str, Any], user: str) -> Any:
        """For the gateway's password check only (it never forwards this op from a client)."""
        if user != SYSTEM:
            raise KernelError(Code.PERMISSION_DENIED, "credentials are for the replicas only")
        u = self.users.get(args.get("name"))   # type: ignore[arg-type]
        return None if u is None else {"hash": u["hash"], "gen": u["gen"]}


class Usage:
    """What each user holds now (sessions, objects, waiters, state_bytes): derived from the
    kernel's state, counted as it changes, recounted on restore; not itself checkpointed."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, user: str, what: str, n: int) -> None:
        c = self.counts.get(user)
        if c is None:
            c = self.counts[user] = {}
        v = c.get(what, 0) + n
        if v:
            c[what] = v
        else:
            c.pop(what, None)

    def get(self, user: str, what: str) -> int:
        c = self.counts.get(user)
        return c.get(what, 0) if c is not None else 0


def _hash(args: dict[str, Any]) -> str:
    h = args.get("hash", "")
    if type(h) is not str or len(h) > 512:
        raise KernelError(Code.INVALID_ARGUMENT, "malformed password hash")
    return h


_OPS = {
    "user_add": AuthState._user_add, "user_delete": AuthState._user_delete,
    "user_passwd": AuthState._user_passwd, "user_grant": AuthState._user_grant,
    "user_revoke": AuthState._user_revoke, "user_quota": AuthState._user_quota,
    "user_get": AuthState._user_get, "user_list": AuthState._user_list,
    "role_add": AuthState._role_add, "role_delete": AuthState._role_delete,
    "role_grant": AuthState._role_grant, "role_revoke": AuthState._role_revoke,
    "role_get": AuthState._role_get, "role_list": AuthState._role_list,
    "auth_enable": AuthState._enable, "auth_disable": AuthState._disable,
    "auth_status": AuthState._status, "check_admin": AuthState._check_admin,
    "bootstrap": AuthState._bootstrap,
    "credentials": AuthState._credentials,
}

#: operations a client may ask for through the Auth RPC (the rest are the replicas' own)
CLIENT_OPS = frozenset(_OPS) - {"bootstrap", "credentials"}
