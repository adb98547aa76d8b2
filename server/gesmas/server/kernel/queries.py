"""Reads through the log (`Query` commands): classes, objects, sessions, counts and the
state digest. A function of the kernel (`self`), bound as `Kernel._query` (kernel.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import checkpoint, codec
from .errors import Code, KernelError

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel



def query(self: Kernel, cmd: codec.Query) -> None:
    what = cmd.what
    if what not in ("stats", "digest"):            # counts only: anyone may ask
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
        value = {"index": self.index, "now": self.now, "sessions": len(self.sessions),
                 "objects": len(self.objects), "waiters": self._waiting,
                 "classes": len(self.registry.versions),
                 "checkpoint_index": self.checkpoint_index}
    else:
        raise KernelError(Code.INVALID_ARGUMENT, f"unknown query {what!r}")
    self._complete(cmd.tag, value)
