"""What compiled uploaded code runs with: its builtins and the guards `dialect.py`'s rewrites
call (`make_globals`).

The builtins are Python's, minus the reflective and nondeterministic ones, with checked
stand-ins where a builtin could do unbounded native work or show identity: containers and
scalars (sandbox.py), sorted/min/max/any/all (natives.py), range and iter counted per item,
sum, isinstance/issubclass over tuples of classes, `is` between values. The rewrites' names
(`_key_`, `_cmp_`, `_consume_`...) are charge.py's and limits.py's functions.
"""
from __future__ import annotations

import builtins
import logging
import sys
from typing import Any

import greenlet

from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence

from . import charge, limits, measure, modules, natives, sandbox, sched
from .limits import Budget
from .modules import ALLOWED_IMPORTS


_BUILTINS = ("""None False True Ellipsis NotImplemented abs bool callable chr complex divmod
    float int isinstance issubclass len oct hex ord round slice str dict list set frozenset
    tuple sorted min max any all enumerate zip map filter reversed iter next property
    staticmethod classmethod""".split()
    + [n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
       and issubclass(getattr(builtins, n), BaseException)
       # groups: split/subgroup/derive walk nested groups natively
       and n not in ("ExceptionGroup", "BaseExceptionGroup")])


class _CountedRange:
    """range() over more than 4096 numbers: each number handed out costs a step, also
    inside builtins such as sum() or list()."""
    __slots__ = ("_r",)

    def __init__(self, r: range) -> None:
        self._r = r

    def __iter__(self) -> Any:
        return modules._Counted(self._r)

    def __reversed__(self) -> Any:
        return modules._Counted(reversed(self._r))

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, i: Any) -> Any:
        return _range_wrap(self._r[i])        # a slice of a big range is counted too

    def __contains__(self, x: Any) -> bool:
        if type(x) is not int and type(x) is not bool:
            charge.charge_items(len(self._r))   # not an int: compared with every number
        return x in self._r

    def __repr__(self) -> str:
        return repr(self._r)


charge.SELF_COUNTED.add(_CountedRange)


def _range_wrap(r: Any) -> Any:
    return r if type(r) is not range or len(r) <= 4096 else _CountedRange(r)


def _range_(*args: Any) -> Any:
    return _range_wrap(range(*args))


class _CallIter:
    """iter(callable, sentinel): each value is compared with the sentinel, charged first."""
    __slots__ = ("_f", "_end", "_done")

    def __init__(self, f: Any, sentinel: Any) -> None:
        if not callable(f):
            raise TypeError("iter(v, w): v must be callable")
        self._f, self._end, self._done = f, sentinel, False

    def __iter__(self) -> _CallIter:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        limits._charge(1)
        value = self._f()
        if charge._cmp_(value, "==", self._end):
            self._done = True
            raise StopIteration
        return value


charge.SELF_COUNTED.add(_CallIter)


def _iter_(*args: Any) -> Any:
    """iter(x), or iter(callable, sentinel) counted per item (it has no end of its own)."""
    if len(args) == 2:
        return _CallIter(*args)
    return iter(limits._set_iter(*args))


def _sum_(iterable: Any, start: Any = 0) -> Any:
    if type(start) in (int, float, bool, complex):
        total = start
        for x in iterable:
            limits._charge(1)
            total = limits._add_(total, x)
        return total
    raise TypeError("sum() takes numbers in gesmas classes (join or extend sequences instead)")


def _unpack_sequence_(it: Any, spec: Any, _getiter_: Any) -> Any:
    return guarded_unpack_sequence(it, spec, _unpack_getiter)


def _iter_unpack_sequence_(it: Any, spec: Any, _getiter_: Any) -> Any:
    return guarded_iter_unpack_sequence(it, spec, _unpack_getiter)


def _unpack_getiter(it: Any) -> Any:
    return charge.consume(limits._set_iter(it))


def _types_arg(types: Any) -> None:
    if type(types) is tuple:
        charge.consume(types)
        for t in types:
            if type(t) is tuple:
                raise TypeError("nested tuples of classes are not allowed in gesmas classes")


# values whose identity is not kept by a checkpoint (a number is pickled without a memo, a
# module-level constant held in state comes back as a copy), so `is` between two of them
# could answer differently on a replica restored from a checkpoint
_VALUE_TYPES = (int, float, complex, str, bytes, tuple, frozenset, range)


def _is_(a: Any, b: Any) -> bool:
    """`a is b` of two non-constants."""
    if a is None or b is None or type(a) is bool or type(b) is bool:
        return a is b
    if isinstance(a, _VALUE_TYPES) and isinstance(b, _VALUE_TYPES):
        raise TypeError(f"'is' between two {type(a).__name__}/{type(b).__name__} values "
                        "depends on how they were made and is not the same on every replica "
                        "(use ==)")
    if charge.kind(type(a)) == charge.ALIAS or charge.kind(type(b)) == charge.ALIAS:
        raise TypeError("'is' with a typing expression depends on typing's cache and is not "
                        "the same on every replica (use ==)")
    return a is b


def _delfrom_(container: Any) -> Any:
    """The container of `del container[...]`: a list, bytearray or deque moves the rest."""
    t = type(container)
    if t is list or t is bytearray or t is charge._deque:
        n = len(container)
        if n > 4096:
            limits._charge(n >> 6)
    return container


def _excepts_(types: Any) -> Any:
    """The class(es) of an `except` clause, evaluated as an exception reaches it. A call that
    the kernel is ending for good (GreenletExit thrown into it) passes every handler: code
    that caught it and waited again would keep a waiter no checkpoint can account for."""
    exc = sys.exc_info()[1]
    if isinstance(exc, greenlet.GreenletExit):
        raise exc
    _types_arg(types)
    return types


def _isinstance_(obj: Any, types: Any) -> bool:
    _types_arg(types)
    return isinstance(obj, types)


def _issubclass_(cls: Any, types: Any) -> bool:
    _types_arg(types)
    return issubclass(cls, types)


def _import_(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
             level: int = 0) -> Any:
    proxy = modules.MODULES.get(name) if level == 0 else None
    if proxy is None:
        raise ImportError(f"import of {name!r} is not allowed in gesmas classes "
                          f"(allowed: {', '.join(ALLOWED_IMPORTS)})")
    return proxy


# -- print() ------------------------------------------------------------------------------------

print_log = logging.getLogger("gesmas.print")
PRINT_LINE = 500        # characters of one print() kept in the log
PRINT_RATE = 10.0       # lines a second of kernel time, on average
PRINT_BURST = 50        # lines at once


class PrintLog:
    """Where one kernel's print() goes: the replica's log (logger `gesmas.print`, WARNING),
    one line per print, at most PRINT_BURST lines at once and PRINT_RATE a second of kernel
    time (the log's timestamps, not a clock: every replica applying the same entries prints
    the same lines; a replica restored from a checkpoint starts with a full allowance).
    Lines over the allowance are dropped and counted; the count is logged with the next line
    that gets through. Nothing here is part of the kernel's state."""

    def __init__(self) -> None:
        self.tokens = float(PRINT_BURST)
        self.at: float | None = None
        self.dropped = 0

    def emit(self, where: str, now: float | None, line: str) -> None:
        if now is not None:
            if self.at is not None and now > self.at:
                self.tokens = min(float(PRINT_BURST), self.tokens + (now - self.at) * PRINT_RATE)
            if self.at is None or now > self.at:
                self.at = now
        if self.tokens < 1:
            self.dropped += 1
            return
        self.tokens -= 1
        if self.dropped:
            print_log.warning("%d print() lines of uploaded code dropped (at most %d at once, "
                              "%g a second)", self.dropped, PRINT_BURST, PRINT_RATE)
            self.dropped = 0
        if len(line) > PRINT_LINE:
            line = f"{line[:PRINT_LINE]}... ({len(line) - PRINT_LINE} more characters)"
        print_log.warning("print in %s: %s", where, line.translate(_CONTROL))


# a printed newline or escape sequence must not forge a log line of its own
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def _where() -> tuple[str, float | None]:
    g = greenlet.getcurrent()
    if isinstance(g, sched.Task):
        return g.request.label, g.runner.now        # type: ignore[attr-defined]
    if sched.READING[0] is not None:
        return str(sched.READING[0]), None
    return "a class source while it loads", None


class _Printer:
    """What `print` is in compiled code (RestrictedPython rewrites `print(...)` to
    `_print_(_getattr_)._call_print(...)`): each argument is made a str as str() does in the
    dialect (charged by what it walks, no addresses), and the line goes to the kernel's
    PrintLog."""

    __slots__ = ("_log",)

    def __init__(self, log: PrintLog) -> None:
        self._log = log

    def _call_print(self, *objects: Any, sep: Any = " ", end: Any = "\n", file: Any = None,
                    flush: Any = False) -> None:
        if file is not None:
            raise TypeError("print(file=...) is not available in gesmas classes: print() "
                            "writes to the replica's log")
        for what, v in (("sep", sep), ("end", end)):
            if v is not None and type(v) is not str:
                raise TypeError(f"print(): {what} must be None or a str, not "
                                f"{type(v).__name__}")
        parts = [o if type(o) is str else sandbox.str_(o) for o in objects]
        line = limits._sized((" " if sep is None else sep).join(parts), "print()")
        limits._charge(len(line) >> 6)
        self._log.emit(*_where(), line)

    def __repr__(self) -> str:
        return "<built-in function print>"


def make_globals(budget: Budget, module_name: str, types: sandbox.UserTypes,
                 prints: PrintLog | None = None) -> dict[str, Any]:
    """Fresh globals for one compiled source, wired to the kernel's step budget (and its
    print() log)."""
    printer = _Printer(prints if prints is not None else PrintLog())
    guards = sandbox.make_guards(types, budget)
    b = {n: getattr(builtins, n) for n in _BUILTINS}
    b.update(guards.pop("builtins"))
    b.update({
        "object": limits.Object, "bytes": sandbox.bytes_, "bytearray": sandbox.bytearray_,
        "str": sandbox.str_, "list": sandbox.list_, "tuple": sandbox.tuple_,
        "dict": sandbox.dict_, "set": sandbox.set_, "frozenset": sandbox.frozenset_,
        "enumerate": limits._set_args(enumerate), "zip": limits._set_args(zip),
        "map": limits._set_args(map), "filter": limits._set_args(filter),
        "sorted": natives.sorted_, "min": natives.min_, "max": natives.max_,
        "any": natives.any_, "all": natives.all_, "round": limits._round_,
        "isinstance": _isinstance_, "issubclass": _issubclass_, "float": sandbox.float_,
        "complex": sandbox.complex_,
        "filter": limits._set_args(lambda f, it: filter(f, charge.consume(it))),
        "range": _range_, "sum": _sum_, "iter": _iter_, "int": sandbox.int_, "pow": limits._pow_, "divmod": limits._divmod_,
        "repr": limits._repr_, "hash": limits._hash_, "format": limits._format_,
        "__import__": _import_, "__build_class__": builtins.__build_class__,
        "ResourceLimit": limits.ResourceLimit,
    })
    return {
        "__builtins__": b,
        "__name__": module_name,
        **guards,
        "_getiter_": limits._set_iter,
        "_apply_": lambda f, *a, **kw: f(*a, **kw),
        "_unpack_sequence_": _unpack_sequence_,
        "_iter_unpack_sequence_": _iter_unpack_sequence_,
        # the charges of native work (charge.py)
        "_key_": charge._key_, "_member_": measure._member_,
        "_members_": lambda items: charge.consume(items, measure._member_), "_cmp_": charge._cmp_,
        "_cmpv_": limits._cmpv_, "_binop_": limits._binop_, "_unary_": limits._unary_,
        "_consume_": charge.consume, "_sub_": charge._sub_, "_excepts_": _excepts_, "_is_": _is_,
        "_delfrom_": _delfrom_,
        "_print_": lambda _getattr_: printer,
        # the dialect's own names
        "Semaphore": sched.Semaphore,
        "context": sched.context,
        "Timeout": sched.Timeout,
        "Aborted": sched.Aborted,
        "SessionEnded": sched.SessionEnded,
        "Interrupted": sched.Interrupted, "NotYet": sched.NotYet,
        "WaitError": sched.WaitError,
        "SyncObject": limits.SyncObject,
    }
