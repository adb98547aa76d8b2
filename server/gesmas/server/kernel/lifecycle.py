"""Classes and objects in the kernel: registering a class, making an object, measuring its
state, dropping and deleting it.

Interface: `Lifecycle(state, config, registry, budget, runner, keeper)`; the kernel hands it
`RegisterClass` (`register_class`), `CreateObject` (`create_object`) and `DeleteObject`
(`delete_object`), and calls `make` for an invoke that creates its object. The runner calls
`account` when the runs on an object may have grown it; a checkpoint calls `measure` and
`drop`. It changes the shared state's objects, `dropped` and `over_limit` and the users'
object and state_bytes counts; constructors run, and waits on a deleted object are aborted,
through the runner. `args_of` and `bind_sig` check a call's arguments.

A get-or-create of an object that exists (`CreateObject`, an invoke with `create`) does not
run the constructor; `check_args` refuses it when it names a constructor argument with
another value than the object was made with (kazoo's "Inconsistent max leases"). A class
says which arguments it keeps, and where, in `_constructor_args`: a tuple of parameter
names, each kept in the instance attribute of that name, or of (parameter, attribute)
pairs. Arguments left out are not compared (`c.queue("jobs")` takes the queue whatever its
capacity), nor are those a class does not list (an object made by a class version without
the list compares nothing: old objects keep their old behaviour on every replica alike).
The comparison reads plain values only and runs no uploaded code.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any

from . import codec
from .auth import SYSTEM
from .budget import Budget
from .errors import Code, KernelError
from .measure import state_size
from .records import Config, ObjectRecord, State
from .request import Kind, Request
from .registry import Registry
from .runner import Runner
from .sched import Aborted
from .sessions import SessionKeeper

log = logging.getLogger("gesmas.server.kernel.kernel")


class Lifecycle:
    def __init__(self, state: State, config: Config, registry: Registry, budget: Budget,
                 runner: Runner, keeper: SessionKeeper) -> None:
        self.state = state
        self.config = config
        self.registry = registry
        self.budget = budget
        self.runner = runner
        self.keeper = keeper

    def register_class(self, cmd: codec.RegisterClass) -> None:
        if type(cmd.source) is not str or type(cmd.user) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "class source must be a string")
        user, auth = cmd.user, self.state.auth
        auth.may_register(user)
        self.state.within(user, "source_bytes", len(cmd.source))

        def allow(names: list[str]) -> None:
            for name in names:
                if name in self.config.reserved_classes and user != SYSTEM:
                    raise KernelError(Code.PERMISSION_DENIED, f"class name {name!r} is "
                                      "reserved for a standard class; choose another name",
                                      "PermissionDenied")
                auth.check(user, "register", name)

        value, new = self.registry.register(cmd.source, allow)
        if new:
            auth.source_used[user] = auth.source_used.get(user, 0) + len(cmd.source)
        self.runner.complete(cmd.tag, value)

    def create_object(self, cmd: codec.CreateObject) -> None:
        name = cmd.name
        if type(name) is not str or not name or len(name) > 256:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"object name must be a non-empty string of at most 256 "
                              f"characters, not {name!r}")
        user = cmd.user
        rec = self.state.objects.get(name)
        self.state.auth.check(user, "create" if rec is None else "invoke", name)
        if cmd.session:
            self.keeper.own(cmd.session, cmd)
        if rec is not None:
            if rec.cls.name != cmd.class_name:
                raise KernelError(Code.ALREADY_EXISTS,
                                  f"object {name!r} exists with class {rec.cls.name}, "
                                  f"not {cmd.class_name}")
            self.check_args(rec, cmd.args, cmd.kwargs)
            self.runner.complete(cmd.tag, {"created": False, "version": rec.cls.version})
            return
        rec = self.make(name, cmd.class_name, cmd.args, cmd.kwargs,
                        cmd.session if type(cmd.session) is int else 0, user,
                        cmd.measured is True)
        self.runner.complete(cmd.tag, {"created": True, "version": rec.cls.version})

    def make(self, name: str, class_name: Any, args: Any, kwargs: Any, session: int,
             user: str, measured: bool = False) -> ObjectRecord:
        """Construct the new object `name` (its creator's permission already checked).
        `measured` (the command's, version 8): its state is measured now. Otherwise it
        counts 0 bytes until a checkpoint measures it, and a standard class's object, whose
        size the capture measures but applies only after the next checkpoint (capture.py),
        is then saved by a third checkpoint only because its size changed: each object
        made was saved twice."""
        cls = self.registry.latest(class_name) if type(class_name) is str else None
        if cls is None:
            raise KernelError(Code.NOT_FOUND, f"no class named {class_name!r}")
        self.state.within(user, "objects")
        args, kwargs = args_of(args, kwargs)
        sig = cls.constructor()
        if sig is not None:
            bind_sig(sig, cls.name, tuple(args), kwargs)
        req = Request(self.runner, Kind.CONSTRUCTOR, self.state.index, session,
                      f"{cls.name}()", name)
        made: list[Any] = []

        def construct() -> None:
            made.append(cls.cls(*args, **kwargs))

        self.runner.spawn(req, construct, (), {})
        error = req.outcome[1]
        if error is not None:
            raise KernelError(error.code, error.message, error.type)
        rec = self.state.objects[name] = ObjectRecord(name, cls, made[0], user)
        self.runner.made(name)               # no frame: saved by the next checkpoint
        self.runner.touched.add(name)
        self.runner.changed.add(name)
        if cls.name not in self.config.reserved_classes:
            self.runner.changed_uploaded.add(name)
        self.state.usage.add(user, "objects", 1)
        self.state.dropped.pop(name, None)
        if measured:
            self.measure(rec)
        return rec

    def check_args(self, rec: ObjectRecord, args: Any, kwargs: Any) -> None:
        """Refuse (ALREADY_EXISTS, type `ConstructorMismatch`) a get-or-create of the existing
        `rec` whose constructor arguments differ from those it was made with (see above)."""
        if not args and not kwargs:
            return
        kept = kept_args(rec.cls.cls)
        if not kept:
            return
        args, kwargs = args_of(args, kwargs)
        sig = rec.cls.constructor()
        if sig is None:
            return
        try:
            bound = sig.bind(*args, **kwargs).arguments
        except TypeError as e:
            raise KernelError(Code.INVALID_ARGUMENT, f"{rec.cls.name}(): {e}") from None
        try:
            state = object.__getattribute__(rec.instance, "__dict__")
        except AttributeError:
            return
        if type(state) is not dict:
            return
        for param, attr in kept:
            if param not in bound or attr not in state:
                continue
            have, given = state[attr], bound[param]
            if not _same(given, have):
                raise KernelError(
                    Code.ALREADY_EXISTS,
                    f"{rec.cls.name} {rec.name!r} exists with {param}={_show(have)}, not "
                    f"{param}={_show(given)}: a get-or-create must give the arguments the "
                    f"object was made with, or leave them out", "ConstructorMismatch")

    def delete_object(self, cmd: codec.DeleteObject) -> None:
        if type(cmd.name) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "object name must be a string")
        self.state.auth.check(cmd.user, "delete", cmd.name)
        rec = self.state.objects.get(cmd.name)
        if rec is None:
            raise KernelError(Code.NOT_FOUND, f"no object named {cmd.name!r}")
        for req in self.runner.blocked(lambda r: r.obj == cmd.name):
            self.runner.abort(req, Aborted(f"object {cmd.name!r} was deleted"))
        self.runner.drain()
        self.forget(cmd.name)
        self.runner.complete(cmd.tag, True)

    def account(self, rec: ObjectRecord) -> None:
        """The runs on `rec` spent steps enough to have grown it by a quarter of
        max_object_bytes (growth costs one step per 64 bytes made; `Runner.run` adds the
        steps up): measure it again. An object over the limit takes no new calls
        (`Kernel._start`)."""
        rec.steps = 0
        self.measure(rec)

    def measure(self, rec: ObjectRecord) -> None:
        limit = self.config.max_object_bytes
        self.budget.steps = 0
        try:
            size = state_size(rec.instance, limit)
        except BaseException:            # cannot happen by design (no uploaded code runs)
            log.exception("measuring object %r failed", rec.name)
            size = limit + 1
        self.set_size(rec, size)

    def set_size(self, rec: ObjectRecord, size: int, again: bool = True) -> None:
        """`rec`'s state measures `size` (now, or when a checkpoint saved it: capture.py).
        `again`: measured now, so a size measured before is not to be applied."""
        if again:
            self.runner.measured(rec.name)
        self.state.usage.add(rec.owner, "state_bytes", size - rec.size)
        rec.size = size
        rec.measured_at = self.state.index
        if size > self.config.max_object_bytes:
            self.state.over_limit[rec.name] = size
        else:
            self.state.over_limit.pop(rec.name, None)

    def drop(self, name: str, why: str) -> None:
        """Forget the object `name`, and remember why (a call that names it is told)."""
        index, dropped = self.state.index, self.state.dropped
        log.warning("object %r dropped at log index %d: %s", name, index, why)
        self.forget(name)
        dropped[name] = f"object {name!r} was dropped at log index {index}: {why}"
        while len(dropped) > 1000:
            del dropped[next(iter(dropped))]

    def forget(self, name: str) -> None:
        st = self.state
        self.runner.seal(name)              # an open checkpoint capture saves it first
        rec = st.objects.pop(name, None)    # a restore drops objects it never added
        self.runner.removed(name)           # its frame (capture.py)
        self.runner.touched.add(name)
        self.runner.changed.add(name)
        st.over_limit.pop(name, None)
        if rec is not None:
            st.usage.add(rec.owner, "objects", -1)
            st.usage.add(rec.owner, "state_bytes", -rec.size)


def args_of(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    if type(args) is not list or type(kwargs) is not dict:
        raise KernelError(Code.INVALID_ARGUMENT, "args must be a list and kwargs a map")
    return args, kwargs


def kept_args(cls: type) -> tuple[tuple[str, str], ...]:
    """A class's `_constructor_args` as (parameter, attribute) pairs; what is not a tuple of
    names or of pairs of names is ignored."""
    declared = inspect.getattr_static(cls, "_constructor_args", ())
    if type(declared) is not tuple:
        return ()
    out = []
    for item in declared:
        if type(item) is str:
            out.append((item, item))
        elif (type(item) is tuple and len(item) == 2 and type(item[0]) is str
              and type(item[1]) is str):
            out.append((item[0], item[1]))
    return tuple(out)


_SCALARS = (type(None), bool, int, float, str, bytes)
_NUMBERS = (bool, int, float)


def _same(given: Any, have: Any) -> bool:
    """Equality of plain values that runs no uploaded code and walks no more than `given`
    (a decoded argument: acyclic, bounded by the command's size). Numbers compare by value
    (True == 1), a list equals a tuple of the same items, a dict needs str keys; anything
    that is not a plain value is unequal."""
    tg, th = type(given), type(have)
    if tg in _NUMBERS and th in _NUMBERS:
        return bool(given == have)
    if tg in (list, tuple) and th in (list, tuple):
        return len(given) == len(have) and all(_same(a, b) for a, b in zip(given, have))
    if tg is dict and th is dict:
        if len(given) != len(have) or any(type(k) is not str for k in have):
            return False
        return all(k in have and _same(v, have[k]) for k, v in given.items())
    return tg is th and tg in _SCALARS and bool(given == have)


def _show(v: Any, limit: int = 80) -> str:
    """`v` for an error message, short, without running uploaded code."""
    def small(x: Any) -> bool:
        return type(x) in _SCALARS and (type(x) is not int or x.bit_length() <= 128) and \
            (type(x) not in (str, bytes) or len(x) <= 200)

    t = type(v)
    if t in (list, tuple, dict):
        items = [] if len(v) > 16 else [y for kv in v.items() for y in kv] if t is dict \
            else list(v)
        text = repr(v) if items and all(map(small, items)) or not v \
            else f"<{t.__name__} of {len(v)} items>"
    elif small(v):
        text = repr(v)
    elif t is int:
        text = f"<int of {v.bit_length()} bits>"
    elif t in (str, bytes):
        text = repr(v[:60]) + "..."
    else:
        text = f"<{t.__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def bind_sig(sig: Any, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise KernelError(Code.INVALID_ARGUMENT, f"{label}(): {e}") from None
