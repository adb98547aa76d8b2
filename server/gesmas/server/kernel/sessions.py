"""Sessions in the kernel: opening, ownership (the session secret), quotas, and the end of a
session (its waits aborted, the classes' session hooks run). Functions of the kernel
(`self`), bound as its methods of the same names with a leading underscore (kernel.py)."""
from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from . import codec
from .errors import Code, KernelError
from .records import Kind, ObjectRecord, Request, Session
from .sched import SessionEnded

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel



def open_session(self: Kernel, cmd: codec.OpenSession) -> None:
    ttl = cmd.ttl
    if type(ttl) not in (int, float) or not 0 < ttl <= 3600:
        raise KernelError(Code.INVALID_ARGUMENT,
                          f"session ttl must be in (0, 3600] seconds, not {ttl!r}")
    if type(cmd.user) is not str or type(cmd.secret) is not str:
        raise KernelError(Code.INVALID_ARGUMENT, "user and secret must be strings")
    self.auth.authenticated(cmd.user)
    self._within(cmd.user, "sessions")
    self.sessions[self.index] = Session(self.index, float(ttl), cmd.user, cmd.secret,
                                        self.now)
    self.usage.add(cmd.user, "sessions", 1)
    self.session_changes.append((self.index, float(ttl), cmd.secret))
    self._complete(cmd.tag, self.index)

def session(self: Kernel, sid: Any) -> Session:
    s = self.sessions.get(sid) if type(sid) is int else None
    if s is None:
        raise KernelError(Code.ABORTED, f"session {sid} is not open (expired or closed)",
                          "SessionExpired")
    return s

def owns(self: Kernel, s: Session, cmd: Any) -> bool:
    """Whether `cmd` may use session `s`: it carries the session's secret and, with auth
    enabled, comes from the session's user."""
    secret = cmd.secret
    return (type(secret) is str and hmac.compare_digest(s.secret, secret)
            and (not self.auth.enabled or s.user == cmd.user))

def own(self: Kernel, sid: Any, cmd: Any) -> Session:
    """The open session `sid`, which `cmd` must be allowed to use."""
    s = self._session(sid)
    if not self._owns(s, cmd):
        raise KernelError(Code.PERMISSION_DENIED,
                          f"session {sid} is not this caller's: wrong session secret or "
                          "user (a session id alone is not a credential)",
                          "PermissionDenied")
    return s

def within(self: Kernel, user: str, what: str, extra: int = 1) -> None:
    """Raise RESOURCE_EXHAUSTED if `user` would go over its `what` quota."""
    limit = self.auth.quota(user, what, self._default_quota)
    if limit is None:
        return
    used = (self.auth.source_used.get(user, 0) if what == "source_bytes"
            else self.usage.get(user, what))
    if used + extra > limit:
        who = f"user {user!r}" if user else "anonymous callers"
        raise KernelError(Code.RESOURCE_EXHAUSTED,
                          f"quota {what} of {who} exceeded: {used} in use, limit {limit}",
                          "QuotaExceeded")

def end_session(self: Kernel, cmd: codec.CloseSession | codec.ExpireSession, how: str) -> None:
    s = (self._own(cmd.session, cmd) if isinstance(cmd, codec.CloseSession)
         else self._session(cmd.session))
    del self.sessions[s.id]              # first: a call of s can no longer wait (_block)
    self.usage.add(s.user, "sessions", -1)
    self.session_changes.append((s.id, None, ""))
    for req in sorted(s.inflight.values(), key=lambda r: r.waiter.order if r.waiter else 0):
        self._abort(req, SessionEnded(f"session {s.id} {how} while waiting"))
    self._drain()
    for name in s.touched:
        rec = self.objects.get(name)
        if rec is not None and hasattr(rec.cls.cls, "_on_session_end"):
            self._run_hook(rec, s.id)
            self._drain()
    self._complete(cmd.tag, True)

def run_hook(self: Kernel, rec: ObjectRecord, sid: int) -> None:
    req = Request(self, Kind.HOOK, self.index, sid,
                  f"{rec.cls.name} {rec.name!r} session hook", rec.name)
    instance = rec.instance
    self._spawn(req, lambda s: instance._on_session_end(s), (sid,), {})
