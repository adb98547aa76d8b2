"""Reads of the replicated state: classes, objects, sessions, counts and the state digest.

Interface: `Queries(state, registry, runner, checkpoints)`. `answer(what, arg, user)` returns
the value of one read and changes nothing: it reads the shared state, the registry, the
runner's waiters and the last checkpoint. Two callers:

- the read path of a replica (node.py `Node.read`, no log entry): the gateway's ListObjects,
  ListClasses, GetClass and Status call `answer` on the replica's applied state, serialized
  with the applying of entries;
- `Query` commands in the log (`query`), which answer through the runner: kept so that a log
  written by an older gesmas replays the same, and for tests that drive the kernel alone.

Every answer needs an authenticated user when auth is enabled (the gateway also reads
`stats()`, the counts, for a caller without a login)."""
from __future__ import annotations

from typing import Any, Protocol

from . import codec
from .checkpoint import Checkpoints
from .errors import Code, KernelError
from .records import State
from .registry import Registry
from .runner import Runner


class Queries:
    def __init__(self, state: State, registry: Registry, runner: Runner,
                 checkpoints: Checkpoints) -> None:
        self.state = state
        self.registry = registry
        self.runner = runner
        self.checkpoints = checkpoints

    def query(self, cmd: codec.Query) -> None:
        self.runner.complete(cmd.tag, self.answer(cmd.what, cmd.arg, cmd.user))

    def answer(self, what: str, arg: Any, user: Any) -> Any:
        """The value of the read `what` (with its `arg`) for `user`; raises KernelError
        (UNAUTHENTICATED, NOT_FOUND, INVALID_ARGUMENT). Changes nothing."""
        st, registry = self.state, self.registry
        st.auth.authenticated(user)
        if what == "classes":
            value: Any = [{"name": n, "version": vs[-1].version, "methods": vs[-1].methods()}
                          for n, vs in registry.versions.items()]
        elif what == "class":
            name, version = (arg + [None])[:2] if isinstance(arg, list) else (arg, None)
            cv = (registry.get(name, version) if version else registry.latest(name))
            if cv is None:
                raise KernelError(Code.NOT_FOUND, f"no class {name!r} version {version}")
            value = {"name": cv.name, "version": cv.version,
                     "source": registry.sources[cv.module]}
        elif what == "objects":
            waiting: dict[str, int] = {}
            for r in self.runner.blocked():
                waiting[r.obj] = waiting.get(r.obj, 0) + 1
            value = [{"name": n, "class": r.cls.name, "version": r.cls.version,
                      "waiters": waiting.get(n, 0)} for n, r in st.objects.items()
                     if st.auth.visible(user, n)]
        elif what == "digest":
            value = self.checkpoints.digest(volatile=False)
        elif what == "digest_parts":           # which part of the state two replicas differ in
            parts: dict[str, str] = {}
            self.checkpoints.digest(False, parts)
            value = parts
        elif what == "sessions":
            value = [[s.id, s.ttl] for s in st.sessions.values()]
        elif what == "stats":
            value = self.stats()
        else:
            raise KernelError(Code.INVALID_ARGUMENT, f"unknown query {what!r}")
        return value

    def stats(self) -> dict[str, Any]:
        """The counts of the "stats" query. Also read by the gateway outside the log, on the
        event loop while the apply thread runs: only sizes and ints are read, each read
        atomic."""
        st = self.state
        return {"index": st.index, "now": st.now, "sessions": len(st.sessions),
                "objects": len(st.objects), "waiters": self.runner.waiting,
                "classes": len(self.registry.versions),
                "checkpoint_index": self.checkpoints.index}


class HasQueries(Protocol):
    queries: Queries


def stats(kernel: HasQueries) -> dict[str, Any]:
    """`kernel.queries.stats()`: the counts a node reads outside the log (node.py)."""
    return kernel.queries.stats()
