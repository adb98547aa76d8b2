"""Registered classes and their versions.

The log carries class source; registering compiles it in the dialect and runs its top level.
Each class the source defines gets a version: registering the same source again changes
nothing; a new source for a class name makes a new version; an existing object keeps the
version it was created with. A version is a pair (class name, version number) and is how
instances are pickled in checkpoints: by the source text that made them, never by import path.
"""
from __future__ import annotations

import hashlib
import logging
import inspect
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any, Callable

from . import dialect, failpoints, limits, runtime, sandbox, stack
from .modules import LOADING as _LOADING
from .errors import Code, KernelError

_MODULE_PREFIX = "gesmas_user_"
#: The special methods a client may call, besides the public ones: ``len(proxy)``.
CALLABLE_SPECIAL = frozenset({"__len__"})
log = logging.getLogger(__name__)


class _Unloadable:
    """Stands for a class whose source failed to load from a checkpoint."""


@dataclass
class ClassVersion:
    name: str
    version: int
    module: int                      # index of the source in Registry.sources
    cls: type
    _methods: dict[str, tuple[Callable[..., Any], inspect.Signature] | None] = field(
        default_factory=dict)
    _init: list[inspect.Signature | None] = field(default_factory=list)
    _hook: list[bool] = field(default_factory=list)

    def ends_with_sessions(self) -> bool:
        """Whether the class has a session-end hook (`_on_session_end`, limits.py): its
        objects are remembered by each session that calls them (Session.touched)."""
        if not self._hook:
            self._hook.append(hasattr(self.cls, "_on_session_end"))
        return self._hook[0]

    def constructor(self) -> inspect.Signature | None:
        """The signature the class is called with, or None if inspect cannot tell."""
        if not self._init:
            try:
                self._init.append(inspect.signature(self.cls))
            except (TypeError, ValueError):
                self._init.append(None)
        return self._init[0]

    def method(self, name: str) -> tuple[Callable[..., Any], inspect.Signature] | None:
        """The public method `name` (or one of CALLABLE_SPECIAL) with its signature, or None
        if there is none."""
        try:
            return self._methods[name]
        except KeyError:
            pass
        found = None
        if not name.startswith("_") or name in CALLABLE_SPECIAL:
            fn = inspect.getattr_static(self.cls, name, None)
            if inspect.isfunction(fn):
                found = (fn, inspect.signature(fn))
        self._methods[name] = found
        return found

    def methods(self) -> list[str]:
        return [n for n, v in vars(self.cls).items()
                if not n.startswith("_") and inspect.isfunction(v)]


class Registry:
    def __init__(self, budget: limits.Budget, max_source: int = 256 * 1024,
                 failpoints: bool = False) -> None:
        self._budget = budget
        self._max_source = max_source
        self.prints = runtime.PrintLog()     # print() of this kernel's uploaded code
        self._failpoints = failpoints      # the test-only builtins of failpoints.py
        self.types = sandbox.UserTypes()
        self.sources: list[str] = []
        self._by_hash: dict[str, int] = {}
        self._namespaces: list[dict[str, Any]] = []
        self.versions: dict[str, list[ClassVersion]] = {}

    def has(self, source: str) -> bool:
        """Whether exactly this source is registered."""
        return _digest(source) in self._by_hash

    def register(self, source: str, allow: Callable[[list[str]], None] | None = None
                 ) -> tuple[dict[str, int], bool]:
        """Compile and register `source`; returns ({class name: version} for its classes,
        whether the source was new). `allow(names)` may refuse the class names by raising,
        before anything is registered."""
        digest = _digest(source)
        module = self._by_hash.get(digest)
        if module is not None:
            if allow is not None:
                allow(sorted(self._classes(self._namespaces[module])))
            return self._bind(module), False
        ns = self._load(source, len(self.sources))
        classes = self._classes(ns)
        if not classes:
            raise KernelError(Code.INVALID_ARGUMENT, "the source defines no class")
        if allow is not None:
            allow(sorted(classes))
        module = len(self.sources)
        self.sources.append(source)
        self._by_hash[digest] = module
        self._namespaces.append(ns)
        return self._bind(module), True

    def _bind(self, module: int) -> dict[str, int]:
        out = {}
        for name, cls in self._classes(self._namespaces[module]).items():
            versions = self.versions.setdefault(name, [])
            if not versions or versions[-1].module != module:
                versions.append(ClassVersion(name, len(versions) + 1, module, cls))
            out[name] = versions[-1].version
        return out

    def _load(self, source: str, module: int) -> dict[str, Any]:
        """Compile and run `source`; every failure, whatever it raises, is INVALID_ARGUMENT.
        Compiled and run with the recursion limit a fixed height above this frame (stack.py):
        how deeply nested a source may be must not depend on who loads it."""
        with stack.relative():
            return self._load_here(source, module)

    def _load_here(self, source: str, module: int) -> dict[str, Any]:
        filename = f"<class source {module}>"
        if len(source) > self._max_source:
            raise KernelError(Code.INVALID_ARGUMENT, f"bad class source: {len(source)} "
                              f"characters, more than {self._max_source}")
        try:
            code = dialect.compile_source(source, filename)
        except dialect.DialectError as e:
            raise KernelError(Code.INVALID_ARGUMENT, f"bad class source: {e}") from None
        except SyntaxError as e:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"bad class source: line {e.lineno}: {e.msg}") from None
        except BaseException as e:     # RecursionError, MemoryError... on a hostile source
            raise KernelError(Code.INVALID_ARGUMENT, f"bad class source: cannot compile it: "
                              f"{type(e).__name__}") from None
        ns = dialect.make_globals(self._budget, f"{_MODULE_PREFIX}{module}", self.types,
                                  self.prints)
        if self._failpoints:
            ns["__builtins__"].update(failpoints.BUILTINS)
        budget, types = self._budget, self.types
        budget.steps = 0
        made: list[type] = []
        types.loading = _LOADING[0] = made
        outer, limits.Budget.current = limits.Budget.current, budget
        try:
            exec(code, ns)
            sandbox.seal(ns, made, types)
        except BaseException as e:
            for cls in made:
                types.readable.discard(cls)
                types.writable.discard(cls)
            line = dialect.line_of(e, filename)
            where = f"line {line}: " if line else ""
            raise KernelError(Code.INVALID_ARGUMENT, "bad class source: "
                              f"{where}{type(e).__name__}: {safe_str(e)}") from None
        finally:
            types.loading = _LOADING[0] = None
            limits.Budget.current = outer
        return ns

    @staticmethod
    def _classes(ns: dict[str, Any]) -> dict[str, type]:
        mod = ns["__name__"]
        return {k: v for k, v in ns.items()
                if isinstance(v, type) and v.__module__ == mod and not k.startswith("_")
                and not issubclass(v, BaseException)}

    def latest(self, name: str) -> ClassVersion | None:
        versions = self.versions.get(name)
        return versions[-1] if versions and versions[-1].cls is not _Unloadable else None

    def get(self, name: str, version: int) -> ClassVersion | None:
        versions = self.versions.get(name)
        if versions and type(version) is int and 0 < version <= len(versions) and \
                versions[version - 1].cls is not _Unloadable:
            return versions[version - 1]
        return None

    # -- checkpoints: by source, never by import path ------------------------------------------

    def dump(self) -> dict[str, Any]:
        return {"sources": list(self.sources),
                "versions": {n: [v.module for v in vs] for n, vs in self.versions.items()}}

    def load(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's sources. Never fails: a source this version of gesmas refuses
        (after an upgrade with a stricter dialect) leaves its class versions unloadable, and
        the objects made with them are dropped by the kernel."""
        for i, source in enumerate(state["sources"]):
            try:
                ns = self._load(source, i)
            except KernelError as e:
                log.error("class source %d no longer loads: %s", i, e.error.message)
                ns = {}
            else:
                self._by_hash[hashlib.sha256(
                    source.encode("utf-8", "surrogatepass")).hexdigest()] = i
            self.sources.append(source)
            self._namespaces.append(ns)
        for name, modules in state["versions"].items():
            self.versions[name] = [
                ClassVersion(name, n + 1, m, self._namespaces[m].get(name, _Unloadable))
                for n, m in enumerate(modules)]

    def persistent_id(self, obj: Any) -> Any:
        """A picklable reference for classes and functions defined by registered sources."""
        if isinstance(obj, type) or type(obj) is FunctionType:   # cheap: runs per object
            mod = getattr(obj, "__module__", None)
            if (isinstance(mod, str) and mod.startswith(_MODULE_PREFIX)
                    and "<" not in obj.__qualname__):   # lambdas and nested functions: no
                return (int(mod[len(_MODULE_PREFIX):]), obj.__qualname__)
        return None

    def persistent_load(self, pid: Any) -> Any:
        module, qualname = pid
        obj: Any = self._namespaces[module]
        first, *rest = qualname.split(".")
        obj = obj[first]
        for part in rest:
            obj = getattr(obj, part)
        return obj


def safe_str(e: BaseException, limit: int = 1000) -> str:
    """The message of an exception raised by uploaded code, never raising itself: its
    `__str__` is uploaded code too (it may raise, loop until the budget ends, or return a
    non-str). Addresses are removed and the length is capped. The kernel's own wait
    errors with one plain str argument (an abort, a timeout: thousands at once when a
    stream's calls are withdrawn) are read without the size walk: no uploaded code runs."""
    from .sched import Aborted, SessionEnded, Timeout
    if type(e) in (Aborted, SessionEnded, Timeout):      # exactly theirs: no override
        args = e.args
        if len(args) == 1 and type(args[0]) is str and len(args[0]) <= 1024:
            text = limits._scrub(args[0])
            return text if len(text) <= limit else text[:limit] + "..."
    try:
        from .charge import unfold
        if unfold(getattr(e, "args", ()), 1 << 16, charged=False) > 1 << 16:
            return f"<{type(e).__name__} with a message too large to print>"
        text = str(e)
        if type(text) is not str:
            raise TypeError
    except BaseException:
        return f"<{type(e).__name__} with an unprintable message>"
    text = limits._scrub(text)
    return text if len(text) <= limit else text[:limit] + "..."


def type_name(e: BaseException) -> str:
    """The name of an exception's type (uploaded classes cannot rename theirs, but be sure)."""
    name = type(e).__name__
    return name if type(name) is str else "Exception"


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
