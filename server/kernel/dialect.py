"""Compiling uploaded classes: RestrictedPython, an import allow-list and a step counter.

The dialect is plain Python 3 with these differences, all checked when the source is
registered (errors name the line):

- Names and attributes starting with ``__`` are refused, except the usual special methods
  (``__init__``, ``__eq__``, ``__len__`` ...). Single-underscore names are fine.
- Imports are limited to ALLOWED_IMPORTS; `Semaphore`, `context`, the wait exceptions
  (`Timeout`, `Aborted`, `SessionEnded`, `Interrupted`, `WaitError`) and `SyncObject`
  (an optional base class) are available without an import.
- No `id()`, `open`, `exec`, `eval`, `globals` or other reflective / nondeterministic builtins.
- Every loop iteration and every function call counts one step; a request that takes more
  than its budget of steps between two waits gets `BudgetExceeded` raised at its next step.
  Infinite iterators from itertools are counted per item too.

This buys determinism, not security: uploading a class is a privilege of trusted principals.
Attribute access is left native (no guard proxies) because the hot path runs through it.
"""
from __future__ import annotations

import ast
import builtins
import itertools as _itertools
import types
from typing import Any

from RestrictedPython import compile_restricted_exec
from RestrictedPython.Guards import (
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safe_builtins,
    safer_getattr,
)
from RestrictedPython.PrintCollector import PrintCollector
from RestrictedPython.transformer import INSPECT_ATTRIBUTES, RestrictingNodeTransformer

from . import sched
# The names uploaded code gets without an import (make_globals), importable from here so that
# type checkers and editors know them: `if TYPE_CHECKING: from ...dialect import Semaphore`.
from .sched import (  # noqa: F401
    Aborted,
    Interrupted,
    Semaphore,
    SessionEnded,
    Timeout,
    WaitError,
    context,
)

ALLOWED_IMPORTS = ("collections", "heapq", "bisect", "math", "itertools", "functools",
                   "dataclasses", "enum", "typing")

SPECIAL_METHODS = frozenset("""
    __init__ __repr__ __str__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __len__
    __contains__ __iter__ __next__ __getitem__ __setitem__ __delitem__ __bool__ __post_init__
    __enter__ __exit__ __call__ __add__ __sub__ __mul__ __neg__
""".split())


class DialectError(ValueError):
    """The source is not valid in the dialect; the message names the line."""


class Budget:
    """Steps left to the running request. Reset by the kernel each time it resumes one."""

    __slots__ = ("steps", "limit")

    def __init__(self, limit: int) -> None:
        self.steps = 0
        self.limit = limit


class _Policy(RestrictingNodeTransformer):
    def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
        if name is None or name == "_":
            return
        if name.startswith("__"):
            if allow_magic_methods and name in SPECIAL_METHODS and node.col_offset != 0:
                return
            self.error(node, f'"{name}": names starting with "__" are not allowed')
        elif name.startswith("_") and name.endswith("_"):
            self.error(node, f'"{name}" is reserved for the runtime')
        elif name in ("print", "printed", "builtins", "breakpoint"):
            self.error(node, f'"{name}" is a reserved name')

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        if node.attr.startswith("__"):
            self.error(node, f'attribute "{node.attr}": names starting with "__" are not allowed')
        elif node.attr in INSPECT_ATTRIBUTES:
            self.error(node, f'attribute "{node.attr}" is not allowed')
        return self.node_contents_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return self.node_contents_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        if isinstance(node.target, ast.Name):
            return super().visit_AugAssign(node)
        return self.node_contents_visit(node)

    def _count(self, node: Any) -> Any:
        step = ast.Expr(ast.Call(ast.Name("_step_", ast.Load()), [], []))
        ast.copy_location(step, node)
        ast.fix_missing_locations(step)
        node.body.insert(0, step)
        return node

    def visit_While(self, node: ast.While) -> Any:
        return self._count(super().visit_While(node))

    def visit_For(self, node: ast.For) -> Any:
        return self._count(super().visit_For(node))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return self._count(super().visit_FunctionDef(node))


def _counted(budget: Budget) -> type:
    class Counted:
        """An iterator that spends one step per item (for unbounded iterators)."""
        __slots__ = ("_it",)

        def __init__(self, it: Any) -> None:
            self._it = iter(it)

        def __iter__(self) -> Any:
            return self

        def __next__(self) -> Any:
            budget.steps += 1
            if budget.steps > budget.limit:
                raise sched.BudgetExceeded(budget.limit)
            return next(self._it)
    return Counted


def make_globals(budget: Budget, module_name: str) -> dict[str, Any]:
    """Fresh globals for one compiled source, wired to the kernel's step budget."""
    Counted = _counted(budget)

    def _step_() -> None:
        budget.steps += 1
        if budget.steps > budget.limit:
            raise sched.BudgetExceeded(budget.limit)

    def _getiter_(it: Any) -> Any:
        return it

    class CountedRange:
        """range() over more than 4096 numbers: each number handed out costs a step, also
        inside builtins such as sum() or list()."""
        __slots__ = ("_r",)

        def __init__(self, r: range) -> None:
            self._r = r

        def __iter__(self) -> Any:
            return Counted(self._r)

        def __reversed__(self) -> Any:
            return Counted(reversed(self._r))

        def __len__(self) -> int:
            return len(self._r)

        def __getitem__(self, i: Any) -> Any:
            return self._r[i]

        def __contains__(self, x: Any) -> bool:
            return x in self._r

        def __repr__(self) -> str:
            return repr(self._r)

    def _range_(*args: Any) -> Any:
        r = range(*args)
        return r if len(r) <= 4096 else CountedRange(r)

    itertools_proxy = types.ModuleType("itertools")
    for name in dir(_itertools):
        if not name.startswith("_"):
            setattr(itertools_proxy, name, getattr(_itertools, name))
    itertools_proxy.count = lambda *a: Counted(_itertools.count(*a))            # type: ignore
    itertools_proxy.cycle = lambda *a: Counted(_itertools.cycle(*a))            # type: ignore
    itertools_proxy.repeat = lambda obj, *times: (                              # type: ignore
        _itertools.repeat(obj, *times) if times else Counted(_itertools.repeat(obj)))

    def _import_(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                 level: int = 0) -> Any:
        if level != 0 or name.partition(".")[0] not in ALLOWED_IMPORTS:
            raise ImportError(f"import of {name!r} is not allowed in gesmas classes "
                              f"(allowed: {', '.join(ALLOWED_IMPORTS)})")
        if name == "itertools":
            return itertools_proxy
        return builtins.__import__(name, globals, locals, fromlist, level)

    b = dict(safe_builtins)
    for name in ("id",):
        b.pop(name, None)
    for name in ("dict", "list", "set", "frozenset", "tuple", "sorted", "min", "max", "sum",
                 "any", "all", "enumerate", "zip", "map", "filter", "reversed", "iter", "next",
                 "isinstance", "issubclass", "object", "property", "staticmethod",
                 "classmethod", "super", "type", "bytes", "bytearray", "hasattr",
                 "NotImplemented", "StopIteration", "PermissionError", "RecursionError",
                 "TimeoutError", "ConnectionError", "NotImplementedError"):
        b[name] = getattr(builtins, name)
    b["getattr"] = safer_getattr
    b["range"] = _range_
    b["__import__"] = _import_
    return {
        "__builtins__": b,
        "__name__": module_name,
        "__metaclass__": type,
        "_step_": _step_,
        "_getiter_": _getiter_,
        "_getattr_": safer_getattr,
        "_getitem_": lambda obj, key: obj[key],
        "_write_": lambda obj: obj,
        "_apply_": lambda f, *a, **kw: f(*a, **kw),
        "_inplacevar_": _inplace,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_print_": PrintCollector,
        # the dialect's own names
        "Semaphore": sched.Semaphore,
        "context": sched.context,
        "Timeout": sched.Timeout,
        "Aborted": sched.Aborted,
        "SessionEnded": sched.SessionEnded,
        "Interrupted": sched.Interrupted,
        "WaitError": sched.WaitError,
        "SyncObject": SyncObject,
    }


class SyncObject:
    """Optional base class for gesmas objects. Public methods are invocable; a method
    `_on_session_end(self, session)` is called when a session that used the object ends."""

    __slots__ = ()


_INPLACE = {
    "+=": lambda a, b: a + b, "-=": lambda a, b: a - b, "*=": lambda a, b: a * b,
    "/=": lambda a, b: a / b, "//=": lambda a, b: a // b, "%=": lambda a, b: a % b,
    "**=": lambda a, b: a ** b, "<<=": lambda a, b: a << b, ">>=": lambda a, b: a >> b,
    "|=": lambda a, b: a | b, "&=": lambda a, b: a & b, "^=": lambda a, b: a ^ b,
    "@=": lambda a, b: a @ b,
}


def _inplace(op: str, a: Any, b: Any) -> Any:
    # `x += y` on a name: mutable containers keep their identity, as in plain Python
    if op == "+=" and type(a) is list:
        a += b
        return a
    if op == "|=" and type(a) in (set, dict):
        a |= b
        return a
    return _INPLACE[op](a, b)


def compile_source(source: str, filename: str) -> types.CodeType:
    """Compile `source` in the dialect or raise DialectError naming the line and problem."""
    if not isinstance(source, str) or not source.strip():
        raise DialectError("class source is empty")
    result = compile_restricted_exec(source, filename=filename, policy=_Policy)
    if result.errors:
        raise DialectError("; ".join(
            "line" + e[4:] if e.startswith("Line") else e for e in result.errors))
    assert result.code is not None
    return result.code


def line_of(exc: BaseException, filename: str) -> int | None:
    """The line in `filename` where `exc` was raised (deepest frame in that file)."""
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
