"""Compiling uploaded classes: RestrictedPython, an import allow-list and a step counter.

The dialect is plain Python 3 with these differences, all checked when the source is
registered (errors name the line):

- Names and attributes starting with ``__`` are refused, except the usual special methods
  (``__init__``, ``__eq__``, ``__len__`` ...). ``global`` and ``nonlocal`` are refused.
- Imports are limited to ALLOWED_IMPORTS, handed out as proxies of vetted public names;
  `Semaphore`, `context`, the wait exceptions (`Timeout`, `Aborted`, `SessionEnded`,
  `Interrupted`, `WaitError`) and `SyncObject` (an optional base class) need no import.
- No `id()`, `open`, `exec`, `eval`, `globals` or other reflective / nondeterministic builtins.
- Every loop iteration, comprehension item and function call counts one step; a request that
  takes more than its budget of steps between two waits gets `BudgetExceeded` raised at its
  next step. Operators and builtins that can make big values (``*``, ``**``, ``<<``, ``+``,
  ``%``, formatting, ``join``...) check the size of what they make and charge steps for it.
- Variable annotations at class and module level are evaluated (rewritten like any
  expression, so charged; `sandbox.seal` checks that what they hold is immutable); in a
  function they are not evaluated (CPython's rule), an attribute's or item's becomes a plain
  assignment, and a signature's become their source text. Compiled with `dont_inherit`, so no
  `from __future__` of this module or of RestrictedPython's changes that.
- ``super()`` in a method becomes ``super(__class__, first_argument)``; the ``super`` the code
  sees is `sandbox`'s, which takes only uploaded classes and their instances. Special methods
  may be named (``Base.__init__``) and are looked up by `sandbox._special`.
- ``print`` writes to the replica's log through `runtime.PrintLog` (charged, rate-limited).
- The runtime rules (who may read ``_`` attributes, what may be written, which classes may be
  made, what module and class level may hold) are in `sandbox.py`.

Rewrites done here: ``obj._x`` and a few size-sensitive attribute names become
``_getattr_(obj, "_x")`` except on ``self`` inside a method that never rebinds it (the method
then checks ``self`` on entry with ``_self_``); ``obj.x = v`` becomes ``_write_(obj).x = v``;
the operators above become calls of `sandbox` functions; f-string fields go through ``_fmt_``.
"""
from __future__ import annotations

import ast
from typing import Any

from RestrictedPython.transformer import INSPECT_ATTRIBUTES, RestrictingNodeTransformer

from . import limits
from .limits import Budget, SyncObject  # noqa: F401
from .runtime import make_globals  # noqa: F401 - the globals compiled code runs with
from .sandbox import SPECIAL_METHODS
# The names uploaded code gets without an import (make_globals), importable from here so that
# type checkers and editors know them: `if TYPE_CHECKING: from ...dialect import Semaphore`.
from .sched import (  # noqa: F401
    Aborted,
    Interrupted,
    NotYet,
    Semaphore,
    SessionEnded,
    Timeout,
    WaitError,
    context,
)

_BINOPS = {ast.Mult: "_mul_", ast.Add: "_add_", ast.Pow: "_pow_", ast.LShift: "_lshift_",
           ast.Mod: "_mod_", ast.FloorDiv: "_floordiv_"}
_TRUSTING_DECORATORS = ("property", "cached_property")
_GROWING = (ast.Add, ast.Mult, ast.Pow, ast.LShift, ast.Mod, ast.FloorDiv)


class DialectError(ValueError):
    """The source is not valid in the dialect; the message names the line."""


def _call(name: str, args: list[ast.expr], like: ast.AST) -> ast.Call:
    node = ast.Call(ast.Name(name, ast.Load()), args, [])
    ast.copy_location(node, like)
    ast.fix_missing_locations(node)
    return node


def _own_nodes(node: ast.AST) -> Any:
    """The nodes of a function body, not those of functions, lambdas or classes inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
                              ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        yield child
        yield from _own_nodes(child)


def _yield_in_cleanup(fn: ast.FunctionDef) -> ast.AST | None:
    for node in _own_nodes(fn):
        if isinstance(node, (ast.Try, ast.With)):
            for inner in _own_nodes(node):
                if isinstance(inner, (ast.Yield, ast.YieldFrom)):
                    return inner
    return None


def _bounds(s: ast.Slice) -> list[ast.expr]:
    return [x if x is not None else ast.Constant(None) for x in (s.lower, s.upper, s.step)]


def _rebinds(fn: ast.FunctionDef, name: str) -> bool:
    """Whether anything in `fn` (nested scopes included, to be safe) could bind `name` other
    than `fn`'s first parameter: an assignment, a del, another parameter, an `except ... as`,
    an import alias, a def or class of that name, a match capture."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.arg) and node.arg == name and node is not fn.args.args[0]:
            return True
        if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and \
                node.name == name:
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == name:
            return True
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not fn and \
                node.name == name:
            return True
        if isinstance(node, ast.MatchMapping) and node.rest == name:
            return True
    return False


class _Policy(RestrictingNodeTransformer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trusted: list[str | None] = [None]    # the trusted `self` of each function
        self._first: list[str | None] = [None]      # the first parameter of the method

    def error(self, node: Any, info: str) -> None:
        super().error(node, _REWORDED.get(info, info))

    def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
        if name is None or name == "_":
            return
        if name.startswith("__"):
            if allow_magic_methods and name in SPECIAL_METHODS and node.col_offset != 0:
                return
            self.error(node, f'"{name}": names starting with "__" are not allowed'
                             + _DUNDER_HINTS.get(name, " (special methods such as __init__, "
                                                 "__eq__ or __len__ may be defined in a "
                                                 "class)"))
        elif name.startswith("_") and name.endswith("_"):
            self.error(node, f'"{name}" is reserved for the runtime')
        elif name in ("print", "printed", "builtins", "breakpoint"):
            self.error(node, f'"{name}" is a reserved name: choose another')

    def not_allowed(self, node: ast.AST) -> None:
        kind = type(node).__name__
        self.error(node, _REFUSED.get(kind, f"{kind} statements are not allowed in gesmas "
                                            "classes"))

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id == "printed" and isinstance(node.ctx, ast.Load):
            self.error(node, '"printed" is not available: print() writes to the replica\'s '
                             "log; return the value from the method instead")
            return node
        if node.id == "super" and isinstance(node.ctx, ast.Load) and \
                not getattr(node, "_gesmas_called", False):
            self.error(node, "super can only be called, as super() in a method or "
                             "super(Class, obj)")
            return node
        return super().visit_Name(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        """`x: T = v` and `x: T` on a name stay annotations (a class body keeps them for
        dataclasses; CPython evaluates them only at class and module level, and the annotation
        is rewritten like any expression, so what it evaluates is charged). `obj.x: T = v` and
        `obj[k]: T = v` become plain assignments: their annotation is never evaluated."""
        target = node.target
        if isinstance(target, ast.Name):
            return self.node_contents_visit(node)
        if node.value is None:
            self.error(node, "an annotation of an attribute or item needs a value "
                             "(self.x: int = 0), or declare the field in the class body "
                             "(x: int)")
            return node
        assign = ast.copy_location(ast.Assign([target], node.value), node)
        return self.visit(ast.fix_missing_locations(assign))

    def visit_Global(self, node: ast.Global) -> Any:
        self.error(node, "global statements are not allowed: module-level values are "
                         "read-only; keep state in the object")

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        attr = node.attr
        if attr in SPECIAL_METHODS and isinstance(node.ctx, ast.Load):
            # `Base.__init__(self)`, `super().__eq__(other)`: looked up by the sandbox, which
            # hands out only special methods written in uploaded code (and a few harmless
            # natives for __init__), never through a trusted `self`
            node = self.node_contents_visit(node)
            return _call("_getattr_", [node.value, ast.Constant(attr)], node)
        if attr.startswith("__"):
            self.error(node, f'attribute "{attr}": names starting with "__" are not allowed'
                             + _DUNDER_HINTS.get(attr, ""))
        elif attr.startswith("_") and attr.endswith("_") and attr != "_":
            self.error(node, f'attribute "{attr}" is reserved for the runtime')
        elif attr in INSPECT_ATTRIBUTES:
            self.error(node, f'attribute "{attr}" is not allowed')
        node = self.node_contents_visit(node)
        if isinstance(node.ctx, ast.Load):
            base = node.value
            if isinstance(base, ast.Name) and base.id == self._trusted[-1]:
                return node     # `self.x` in a method: an instance of an uploaded class
            # every other attribute is looked up by the sandbox: a builtin value's methods are
            # checked and charged (natives.py), unknown ones are not available
            return _call("_getattr_", [node.value, ast.Constant(attr)], node)
        base = node.value
        if isinstance(base, ast.Name) and base.id == self._trusted[-1]:
            return node         # checked on entry (_self_): an instance of an uploaded class
        node.value = _call("_write_", [node.value], node.value)
        return node

    def visit_Assign(self, original: ast.Assign) -> Any:
        node = super().visit_Assign(original)
        if not isinstance(node, ast.Assign):       # tuple unpacking became several statements
            return node
        for target in node.targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Slice):
                    if len(node.targets) != 1 or t is not target:
                        self.error(node, "a slice assignment must be the only target")
                        return node
                    stmt = ast.Expr(_call("_setslice_", [t.value, *_bounds(t.slice),
                                                         node.value], node))
                    return ast.copy_location(stmt, node)
        return node

    def visit_Compare(self, node: ast.Compare) -> Any:
        node = self.node_contents_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            test: ast.expr = _call("_in_", [node.left, node.comparators[0]], node)
            if isinstance(node.ops[0], ast.NotIn):
                test = ast.copy_location(ast.UnaryOp(ast.Not(), test), node)
            return test
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            self.error(node, "write chained comparisons with `in` as separate tests")
            return node
        operands = [node.left, *node.comparators]
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot)) and \
                not any(isinstance(x, ast.Constant) for x in operands):
            test = _call("_is_", [node.left, node.comparators[0]], node)
            if isinstance(node.ops[0], ast.IsNot):
                test = ast.copy_location(ast.UnaryOp(ast.Not(), test), node)
            return test
        if len(node.ops) == 1:
            op = _CMP_TEXT.get(type(node.ops[0]))
            if op is None or any(isinstance(x, ast.Constant) for x in operands):
                return node          # `is`, or a constant: nothing is walked
            return _call("_cmp_", [node.left, ast.Constant(op), node.comparators[0]], node)
        # a chain: each operand that is not a constant is charged what it can make walk
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return node
        node.left = _charged_operand(node.left)
        node.comparators = [_charged_operand(x) for x in node.comparators]
        return node

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        node = self.node_contents_visit(node)
        if isinstance(node.slice, ast.Slice):
            if isinstance(node.ctx, ast.Load):
                return _call("_slice_", [node.value, *_bounds(node.slice)], node)
            return node
        if not isinstance(node.slice, ast.Constant):
            node.slice = _call("_key_", [node.slice], node.slice)    # hashed if a dict's key
        if isinstance(node.ctx, ast.Load):      # a typing alias walks itself (charge._sub_)
            node.value = _call("_sub_", [node.value], node.value)
        if isinstance(node.ctx, ast.Del):       # `del seq[i]` moves every item after i
            node.value = _call("_delfrom_", [node.value], node.value)
        return node

    def visit_Dict(self, node: ast.Dict) -> Any:
        node = self.node_contents_visit(node)
        node.keys = [k if k is None or isinstance(k, ast.Constant) else _call("_key_", [k], k)
                     for k in node.keys]
        node.values = [v if k is not None else _call("_consume_", [v], v)
                       for k, v in zip(node.keys, node.values)]
        return node

    def visit_Set(self, node: ast.Set) -> Any:
        node = self.node_contents_visit(node)
        node.elts = [_keyed(e) for e in node.elts]
        return node

    def visit_SetComp(self, node: ast.SetComp) -> Any:
        node = super().visit_SetComp(node)  # type: ignore[assignment]
        node.elt = _keyed(node.elt)
        return node

    def visit_DictComp(self, node: ast.DictComp) -> Any:
        node = super().visit_DictComp(node)  # type: ignore[assignment]
        if not isinstance(node.key, ast.Constant):
            node.key = _call("_key_", [node.key], node.key)
        return node

    def visit_Starred(self, node: ast.Starred) -> Any:
        node = self.node_contents_visit(node)
        if isinstance(node.ctx, ast.Load):          # *xs in a call or a display: consumed whole
            node.value = _call("_consume_", [node.value], node.value)
        return node

    def visit_Call(self, node: ast.Call) -> Any:
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.func._gesmas_called = True  # type: ignore[attr-defined]
            if not node.args and not node.keywords:
                first = self._first[-1]
                if first is None:
                    self.error(node, "super() without arguments works only in a method "
                                     "that takes self (or cls); elsewhere write "
                                     "super(Class, obj)")
                    return node
                # the cell __class__ is made by the compiler for a method that names it,
                # exactly as for a bare super()
                node.args = [ast.copy_location(ast.Name("__class__", ast.Load()), node),
                             ast.copy_location(ast.Name(first, ast.Load()), node)]
                return node         # nothing in it to visit: two names of our own
        out = super().visit_Call(node)
        if isinstance(out, ast.Call):
            for kw in out.keywords:
                if kw.arg is None:                   # **kwargs: copied whole
                    kw.value = _call("_consume_", [kw.value], kw.value)
        return out

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> Any:
        node = super().visit_ExceptHandler(node)  # type: ignore[assignment]
        if node.type is None:                    # a bare `except:` is `except BaseException:`
            node.type = ast.copy_location(ast.Name("BaseException", ast.Load()), node)
        if node.type is not None:
            # `except (A, B):` a tuple that could be long, matched natively at every raise
            node.type = _call("_excepts_", [node.type], node.type)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        node = self.node_contents_visit(node)
        if isinstance(node.op, ast.Not) or isinstance(node.operand, ast.Constant):
            return node
        text = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}[type(node.op)]
        return _call("_unary_", [ast.Constant(text), node.operand], node)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        node = self.node_contents_visit(node)
        guard = _BINOPS.get(type(node.op))
        if guard is None:
            if isinstance(node.left, ast.Constant) or isinstance(node.right, ast.Constant):
                return node          # a constant operand: a number operation, or bounded
            return _call("_binop_", [node.left, ast.Constant(_OP_TEXT[type(node.op)]),
                                     node.right], node)
        return _call(guard, [node.left, node.right], node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        if isinstance(target, ast.Name):
            return super().visit_AugAssign(node)     # x = _inplacevar_(op, x, v)
        op = ast.Constant(_OP_TEXT[type(node.op)] + "=")
        if isinstance(target, ast.Attribute) and not isinstance(node.op, _GROWING) and \
                isinstance(node.value, ast.Constant):
            return self.node_contents_visit(node)    # _write_(obj).attr -= 1: bounded
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            # n.attr += v  ->  n.attr = _inplacevar_("+=", n.attr, v): n is a name, so
            # evaluating it twice changes nothing
            load = ast.copy_location(ast.Attribute(
                ast.copy_location(ast.Name(target.value.id, ast.Load()), target.value),
                target.attr, ast.Load()), target)
            value = self.visit(node.value)
            call = _call("_inplacevar_", [op, self.visit(load), value], node)
            stmt: ast.stmt = ast.Assign([self.visit(target)], call)
            return ast.fix_missing_locations(ast.copy_location(stmt, node))
        node = self.node_contents_visit(node)
        if isinstance(target, ast.Attribute):
            call = _call("_augattr_", [target.value, ast.Constant(target.attr), op, node.value],
                         node)
        elif isinstance(target, ast.Subscript):
            call = _call("_augitem_", [target.value, target.slice, op, node.value], node)
        else:  # pragma: no cover - the grammar allows no other target
            self.error(node, "unsupported augmented assignment")
            return node
        stmt = ast.Expr(call)
        ast.copy_location(stmt, node)
        return stmt

    def visit_FormattedValue(self, node: ast.FormattedValue) -> Any:
        node = self.node_contents_visit(node)
        spec = node.format_spec if node.format_spec is not None else ast.Constant("")
        node.value = _call("_fmt_", [node.value, ast.Constant(node.conversion), spec], node)
        node.conversion = -1
        node.format_spec = None
        return node

    def visit_comprehension(self, node: ast.comprehension) -> Any:
        node = super().visit_comprehension(node)  # type: ignore[assignment]  # _getiter_(iter)
        node.ifs.insert(0, _call("_stepc_", [], node.iter))
        return node

    def _count(self, node: Any) -> Any:
        node.body.insert(0, ast.fix_missing_locations(ast.copy_location(
            ast.Expr(_call("_step_", [], node)), node)))
        return node

    def visit_While(self, node: ast.While) -> Any:
        return self._count(super().visit_While(node))

    def visit_For(self, node: ast.For) -> Any:
        return self._count(super().visit_For(node))

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        for child in node.body:
            if isinstance(child, ast.FunctionDef):
                child._gesmas_method = True  # type: ignore[attr-defined]
        self._trusted.append(None)
        self._first.append(None)
        try:
            return super().visit_ClassDef(node)
        finally:
            self._trusted.pop()
            self._first.pop()

    def visit_Lambda(self, node: ast.Lambda) -> Any:
        self._trusted.append(None)
        try:
            return super().visit_Lambda(node)
        finally:
            self._trusted.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        where = _yield_in_cleanup(node)
        if where is not None:
            self.error(where, "yield inside try or with is not allowed: its clean-up would run "
                              "whenever the garbage collector finds the generator, at a "
                              "different moment on each replica")
        trusted = None
        if getattr(node, "_gesmas_method", False) and node.args.args and all(
                isinstance(d, ast.Name) and d.id in _TRUSTING_DECORATORS
                or isinstance(d, ast.Attribute) and d.attr in ("setter", "getter", "deleter")
                for d in node.decorator_list):
            first = node.args.args[0].arg
            if not _rebinds(node, first):
                trusted = first
        # a signature's annotations stay text, never evaluated (what CPython does under
        # `from __future__ import annotations`): they are checked like any code, then
        # replaced by their source text
        signature = [a for a in (*node.args.posonlyargs, *node.args.args,
                                 *node.args.kwonlyargs, node.args.vararg, node.args.kwarg)
                     if a is not None and a.annotation is not None]
        texts = [ast.unparse(a.annotation) for a in signature]  # type: ignore[arg-type]
        returns = ast.unparse(node.returns) if node.returns is not None else None
        self._trusted.append(trusted)
        if getattr(node, "_gesmas_method", False):
            self._first.append(node.args.args[0].arg if node.args.args else
                               node.args.posonlyargs[0].arg if node.args.posonlyargs else None)
        else:
            self._first.append(self._first[-1])     # a function inside a method
        try:
            node = super().visit_FunctionDef(node)  # type: ignore[assignment]
        finally:
            self._trusted.pop()
            self._first.pop()
        for a, text in zip(signature, texts):
            a.annotation = ast.copy_location(ast.Constant(text), a)
        if returns is not None:
            node.returns = ast.copy_location(ast.Constant(returns), node)
        entry = (_call("_self_", [ast.Name(trusted, ast.Load())], node) if trusted
                 else _call("_step_", [], node))
        node.body.insert(0, ast.fix_missing_locations(ast.copy_location(ast.Expr(entry), node)))
        return node


# what to write instead of a dunder name a user is likely to try
_DUNDER_HINTS = {
    "__class__": " (use type(x))",
    "__dict__": " (read attributes by name, with getattr(obj, name))",
    "__name__": " (keep a name of your own in the object)",
    "__slots__": " (a class keeps its attributes in its instances)",
    "__new__": " (define __init__ instead)",
}

# RestrictedPython refuses these statements as "X statements are not allowed."
_REFUSED = {
    "Nonlocal": "nonlocal is not allowed: keep the state in the object (self.x) or return it",
    "AsyncFunctionDef": "async def is not allowed: methods are plain functions; a method "
                        "waits with Semaphore.acquire() and the server runs it as a coroutine",
    "Await": "await is not allowed: wait with Semaphore.acquire()",
    "AsyncFor": "async for is not allowed: use a plain for loop",
    "AsyncWith": "async with is not allowed: use a plain with statement",
    "TryStar": "except* is not allowed: catch with a plain except",
    "Match": "match statements are not allowed in gesmas classes: write if/elif with ==, "
             "isinstance() or len()",
}

# RestrictedPython's own wording, said as what to write instead
_REWORDED = {
    '"*" imports are not allowed.': "from ... import * is not allowed: import the names you "
                                    "use (from collections import deque)",
    'The keyword argument "metaclass" is not allowed.': "metaclass= is not allowed: derive "
        "from a base class, or decorate with dataclasses.dataclass or functools.total_ordering",
    "Exec calls are not allowed.": "exec() is not allowed: gesmas classes cannot run code "
                                   "made from strings",
    "Eval calls are not allowed.": "eval() is not allowed: gesmas classes cannot run code "
                                   "made from strings",
}

_CMP_TEXT = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
             ast.GtE: ">="}


def _charged_operand(x: ast.expr) -> ast.expr:
    return x if isinstance(x, ast.Constant) else _call("_cmpv_", [x], x)


def _keyed(x: ast.expr) -> ast.expr:
    if isinstance(x, ast.Constant) and type(x.value) in (int, str, bytes, bool, float):
        return x
    if isinstance(x, ast.Starred):
        x.value = _call("_members_", [x.value], x.value)
        return x
    return _call("_member_", [x], x)


_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
            ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
            ast.BitAnd: "&", ast.BitXor: "^", ast.MatMult: "@"}

def compile_source(source: str, filename: str) -> Any:
    """Compile `source` in the dialect or raise DialectError naming the line and problem."""
    if not isinstance(source, str) or not source.strip():
        raise DialectError("class source is empty")
    tree = ast.parse(source, filename, "exec")
    errors: list[str] = []
    _Policy(errors, [], {}).visit(tree)
    if errors:
        raise DialectError("; ".join(
            "line" + e[4:] if e.startswith("Line") else e for e in errors))
    # compiled here rather than by RestrictedPython's compile_restricted_exec, which would
    # pass on the `from __future__` imports of its own module: the dialect's annotations
    # follow the rules written in _Policy (variable annotations at class and module level
    # are evaluated, rewritten and charged like any expression; a signature's are text)
    return compile(tree, filename, "exec", dont_inherit=True)


def line_of(exc: BaseException, filename: str) -> int | None:
    """The line in `filename` where `exc` was raised (deepest frame in that file)."""
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
