"""Reads through the log (`Query` commands): classes, objects, sessions, counts and the
state digest. A function of the kernel (`self`), bound as `Kernel._query` (kernel.py).

Every query needs an authenticated user when auth is enabled: a query is a log entry (the
digest makes every replica hash its whole state). The gateway answers a Status without a
login from `stats` read outside the log instead."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import checkpoint, codec
from .errors import Code, KernelError

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel



def query(self: Kernel, cmd: codec.Query) -> None:
    what = cmd.what
    self.auth.authenticated(cmd.user)
    if what == "classes":
        value: Any = [{"name": n, "version": vs[-1].version, "methods": vs[-1].methods()}
                      for n, vs in self.registry.versions.items()]
    elif what == "class":
        name, version = (cmd.arg + [None])[:2] if isinstance(cmd.arg, list) else (cmd.arg,
                                                                                 None)
        cv = (self.registry.get(name, version) if version else self.registry.latest(name))
        if cv is None:
            raise KernelError(Code.NOT_FOUND, f"no class {name!r} version {version}")
        value = {"name": cv.name, "version": cv.version,
                 "source": self.registry.sources[cv.module]}
    elif what == "objects":
        waiting: dict[str, int] = {}
        for r in self._blocked():
            waiting[r.obj] = waiting.get(r.obj, 0) + 1
        value = [{"name": n, "class": r.cls.name, "version": r.cls.version,
                  "waiters": waiting.get(n, 0)} for n, r in self.objects.items()
                 if self.auth.visible(cmd.user, n)]
    elif what == "digest":
        value = self.state_digest(volatile=False)
    elif what == "digest_parts":           # which part of the state two replicas differ in
        parts: dict[str, str] = {}
        checkpoint.state_digest(self, False, parts)
        value = parts
    elif what == "sessions":
        value = [[s.id, s.ttl] for s in self.sessions.values()]
    elif what == "stats":
        value = stats(self)
    else:
        raise KernelError(Code.INVALID_ARGUMENT, f"unknown query {what!r}")
    self._complete(cmd.tag, value)


def stats(k: Kernel) -> dict[str, Any]:
    """The counts of the "stats" query. Also read by the gateway outside the log, on the event
    loop while the apply thread runs: only sizes and ints are read, each read atomic."""
    return {"index": k.index, "now": k.now, "sessions": len(k.sessions),
            "objects": len(k.objects), "waiters": k._waiting,
            "classes": len(k.registry.versions), "checkpoint_index": k.checkpoint_index}
