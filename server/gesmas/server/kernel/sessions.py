"""Sessions in the kernel: opening one, telling whether a command may use one (its secret, its
user), and ending one (its waits aborted, the classes' session hooks run).

Interface: `SessionKeeper(state, runner)`; the kernel hands it `OpenSession` (`open`) and
`CloseSession` / `ExpireSession` (`end`), and asks it `get(sid)` (an open session),
`own(sid, cmd)` (an open session the command may use) and `owns(session, cmd)`. It changes
the shared state's sessions, the users' session counts and `session_changes`; it runs the
session hooks, and aborts the ended session's waits, through the runner.
"""
from __future__ import annotations

import hmac
from typing import Any

from . import codec
from .errors import Code, KernelError
from .records import ObjectRecord, Session, State
from .request import Kind, Request
from .runner import Runner
from .sched import SessionEnded


class SessionKeeper:
    def __init__(self, state: State, runner: Runner) -> None:
        self.state = state
        self.runner = runner

    def open(self, cmd: codec.OpenSession) -> None:
        st = self.state
        ttl = cmd.ttl
        if type(ttl) not in (int, float) or not 0 < ttl <= 3600:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"session ttl must be in (0, 3600] seconds, not {ttl!r}")
        if type(cmd.user) is not str or type(cmd.secret) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "user and secret must be strings")
        st.auth.authenticated(cmd.user)
        st.within(cmd.user, "sessions")
        st.sessions[st.index] = Session(st.index, float(ttl), cmd.user, cmd.secret, st.now)
        st.usage.add(cmd.user, "sessions", 1)
        st.session_changes.append((st.index, float(ttl), cmd.secret))
        self.runner.complete(cmd.tag, st.index)

    def get(self, sid: Any) -> Session:
        """The open session `sid`."""
        s = self.state.sessions.get(sid) if type(sid) is int else None
        if s is None:
            raise KernelError(Code.ABORTED, f"session {sid} is not open (expired or closed)",
                              "SessionExpired")
        return s

    def owns(self, s: Session, cmd: Any) -> bool:
        """Whether `cmd` may use session `s`: it carries the session's secret and, with auth
        enabled, comes from the session's user."""
        secret = cmd.secret
        return (type(secret) is str and hmac.compare_digest(s.secret, secret)
                and (not self.state.auth.enabled or s.user == cmd.user))

    def own(self, sid: Any, cmd: Any) -> Session:
        """The open session `sid`, which `cmd` must be allowed to use."""
        s = self.get(sid)
        if not self.owns(s, cmd):
            raise KernelError(Code.PERMISSION_DENIED,
                              f"session {sid} is not this caller's: wrong session secret or "
                              "user (a session id alone is not a credential)",
                              "PermissionDenied")
        return s

    def end(self, cmd: codec.CloseSession | codec.ExpireSession, how: str) -> None:
        st, runner = self.state, self.runner
        s = (self.own(cmd.session, cmd) if isinstance(cmd, codec.CloseSession)
             else self.get(cmd.session))
        del st.sessions[s.id]             # first: a call of s can no longer wait (Runner.block)
        st.usage.add(s.user, "sessions", -1)
        st.session_changes.append((s.id, None, ""))
        for req in sorted(s.inflight.values(), key=lambda r: r.waiter.order if r.waiter else 0):
            runner.abort(req, SessionEnded(f"session {s.id} {how} while waiting"))
        runner.drain()
        for name in s.touched:
            rec = st.objects.get(name)
            if rec is not None and rec.cls.ends_with_sessions():
                self._run_hook(rec, s.id)
                runner.drain()
        runner.complete(cmd.tag, True)

    def _run_hook(self, rec: ObjectRecord, sid: int) -> None:
        req = Request(self.runner, Kind.HOOK, self.state.index, sid,
                      f"{rec.cls.name} {rec.name!r} session hook", rec.name)
        self.runner.seal(rec.name)             # an open checkpoint capture saves it first
        instance = rec.instance
        self.runner.spawn(req, lambda s: instance._on_session_end(s), (sid,), {})
