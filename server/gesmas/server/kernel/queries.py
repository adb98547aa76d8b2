"""Reads of the replicated state: classes, objects, sessions, counts and the state digest.

Interface: `Queries(state, registry, runner, checkpoints)`. `answer(what, arg, user)` returns
the value of one read and changes nothing: it reads the shared state, the registry, the
runner's waiters and the last checkpoint. Two callers:

- the read path of a replica (node.py `Node.read`, no log entry): the gateway's ListClasses,
  GetClass and Status call `answer`, and ListObjects `objects_page`, on the replica's
  applied state, serialized with the applying of entries;
- `Query` commands in the log (`query`), which answer through the runner: kept so that a log
  written by an older gesmas replays the same, and for tests that drive the kernel alone.

Every answer needs an authenticated user when auth is enabled (the gateway also reads
`stats()`, the counts, for a caller without a login).

`objects_page` is the listing by page (ListObjects): the objects in name order after a
continuation token, filtered by prefix and class, read from the sorted names the object
table keeps (names.py), so a page costs O(log n + the names it examines), never a sort. A
page stops at `limit` objects, at PAGE_BYTES of names and class names (counting 4 bytes,
UTF-8's most, per character: a gRPC answer stays far below its 16 MiB limit whatever the
names), or after examining MAX_EXAMINED names (a
filter that matches few objects, or a user who may see few, cannot make one page walk the
whole table under the apply lock): a page can then hold fewer than `limit` objects, even
none, and still carry a token; the last page's token is "". The token is the last name the
page examined, so any string works as one: the next page starts after it in name order."""
from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Protocol

from . import codec
from .checkpoint import Checkpoints
from .errors import Code, KernelError
from .records import State
from .registry import Registry
from .runner import Runner


DEFAULT_PAGE = 1000          # objects per ListObjects page when the request says none
MAX_PAGE = 10_000            # the largest page a request may ask for
MAX_EXAMINED = 20_000        # names one page looks at, matching the filters or not
PAGE_BYTES = 4 << 20         # bytes of names and class names in one page (4 per character)
MAX_TEXT = 256               # characters of a page token, prefix or class filter (the
                             # longest object name: anything longer matches nothing)


def page_limit(limit: Any) -> int:
    """The number of objects a page request asks for: 0 means DEFAULT_PAGE; negative, past
    MAX_PAGE or not an int is INVALID_ARGUMENT naming `limit`."""
    if type(limit) is not int or not 0 <= limit <= MAX_PAGE:
        raise KernelError(Code.INVALID_ARGUMENT,
                          f"limit must be 0 (the default, {DEFAULT_PAGE}) to {MAX_PAGE} "
                          f"objects, not {limit!r}; follow next_page_token for more")
    return limit or DEFAULT_PAGE


def _text(field: str, value: Any) -> str:
    if type(value) is not str:
        raise KernelError(Code.INVALID_ARGUMENT,
                          f"{field} must be a string, not {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise KernelError(Code.INVALID_ARGUMENT, f"{field} must be at most {MAX_TEXT} "
                          f"characters (the longest object name), not {len(value)}")
    return value


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
            waiting = self.runner.waiting_on
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

    def objects_page(self, user: Any, *, after: str = "", prefix: str = "",
                     class_name: str = "", limit: int = 0) -> dict[str, Any]:
        """One page of the listing of the objects `user` may see (see the module's doc):
        {"objects": [{"name", "class", "version", "waiters", "owner"}...] in name order,
        "next": the token of the next page, "" after the last}. Raises UNAUTHENTICATED and
        INVALID_ARGUMENT (naming the field). Changes nothing."""
        st = self.state
        st.auth.authenticated(user)
        auth = st.auth
        visible = None if not auth.enabled or auth.is_root(user) else \
            (lambda name: auth.visible(user, name))
        return self.page(after=after, prefix=prefix, class_name=class_name, limit=limit,
                         visible=visible)

    def page(self, *, after: str = "", prefix: str = "", class_name: str = "", limit: int = 0,
             visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """`objects_page` for whoever `visible` lets see a name (None: everyone, as the
        status page shows them)."""
        limit = page_limit(limit)
        after, prefix = _text("page_token", after), _text("prefix", prefix)
        class_name = _text("class_name", class_name)
        objects, names = self.state.objects, self.state.objects.names
        # Start at the first name after the token that can start with the prefix: names that
        # start with `prefix` are the ones from `prefix` up to the first that does not.
        walk = names.since(after, inclusive=False) if after >= prefix else \
            names.since(prefix, inclusive=True)
        waiting = self.runner.waiting_on
        found: list[dict[str, Any]] = []
        size = examined = 0
        last = ""
        for name in islice(walk, MAX_EXAMINED):
            if not name.startswith(prefix):
                return {"objects": found, "next": ""}         # past the prefix's names
            if len(found) == limit or size >= PAGE_BYTES:
                return {"objects": found, "next": last}
            examined += 1
            last = name
            rec = objects[name]
            cls = rec.cls
            if class_name and cls.name != class_name:
                continue
            if visible is not None and not visible(name):
                continue
            found.append({"name": name, "class": cls.name, "version": cls.version,
                          "waiters": waiting.get(name, 0), "owner": rec.owner})
            size += 4 * (len(name) + len(cls.name)) + 16     # UTF-8: at most 4 per character
        # MAX_EXAMINED names looked at: more may follow; or the names ran out
        return {"objects": found, "next": last if examined == MAX_EXAMINED else ""}

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
