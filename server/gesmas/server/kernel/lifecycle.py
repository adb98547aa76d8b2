"""Classes and objects in the kernel: registering a class, making, measuring, dropping and
deleting an object. Functions of the kernel (`self`), bound as its methods of the same names
with a leading underscore (kernel.py)."""
from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from . import codec
from .auth import SYSTEM
from .errors import Code, KernelError
from .measure import state_size
from .records import Kind, ObjectRecord, Request
from .sched import Aborted

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel

log = logging.getLogger("gesmas.server.kernel.kernel")


def register_class(self: Kernel, cmd: codec.RegisterClass) -> None:
    if type(cmd.source) is not str or type(cmd.user) is not str:
        raise KernelError(Code.INVALID_ARGUMENT, "class source must be a string")
    user = cmd.user
    self.auth.may_register(user)
    self._within(user, "source_bytes", len(cmd.source))

    def allow(names: list[str]) -> None:
        for name in names:
            if name in self.config.reserved_classes and user != SYSTEM:
                raise KernelError(Code.PERMISSION_DENIED, f"class name {name!r} is "
                                  "reserved for a standard class; choose another name",
                                  "PermissionDenied")
            self.auth.check(user, "register", name)

    value, new = self.registry.register(cmd.source, allow)
    if new:
        self.auth.source_used[user] = self.auth.source_used.get(user, 0) + len(cmd.source)
    self._complete(cmd.tag, value)


def create_object(self: Kernel, cmd: codec.CreateObject) -> None:
    name = cmd.name
    if type(name) is not str or not name or len(name) > 256:
        raise KernelError(Code.INVALID_ARGUMENT,
                          f"object name must be a non-empty string of at most 256 "
                          f"characters, not {name!r}")
    user = cmd.user
    rec = self.objects.get(name)
    self.auth.check(user, "create" if rec is None else "invoke", name)
    if cmd.session:
        self._own(cmd.session, cmd)
    if rec is not None:
        if rec.cls.name != cmd.class_name:
            raise KernelError(Code.ALREADY_EXISTS,
                              f"object {name!r} exists with class {rec.cls.name}, "
                              f"not {cmd.class_name}")
        self._complete(cmd.tag, {"created": False, "version": rec.cls.version})
        return
    rec = self._make(name, cmd.class_name, cmd.args, cmd.kwargs,
                     cmd.session if type(cmd.session) is int else 0, user)
    self._complete(cmd.tag, {"created": True, "version": rec.cls.version})


def make(self: Kernel, name: str, class_name: Any, args: Any, kwargs: Any, session: int,
          user: str) -> ObjectRecord:
    """Construct the new object `name` (its creator's permission already checked)."""
    cls = self.registry.latest(class_name) if type(class_name) is str else None
    if cls is None:
        raise KernelError(Code.NOT_FOUND, f"no class named {class_name!r}")
    self._within(user, "objects")
    args, kwargs = args_of(args, kwargs)
    try:
        sig = inspect.signature(cls.cls)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        bind_sig(sig, cls.name, tuple(args), kwargs)
    req = Request(self, Kind.CONSTRUCTOR, self.index, session, f"{cls.name}()", name)
    made: list[Any] = []

    def construct() -> None:
        made.append(cls.cls(*args, **kwargs))

    self._spawn(req, construct, (), {})
    error = req.outcome[1]
    if error is not None:
        raise KernelError(error.code, error.message, error.type)
    rec = self.objects[name] = ObjectRecord(name, cls, made[0], user)
    self.usage.add(user, "objects", 1)
    self.dropped.pop(name, None)
    return rec


def delete_object(self: Kernel, cmd: codec.DeleteObject) -> None:
    if type(cmd.name) is not str:
        raise KernelError(Code.INVALID_ARGUMENT, "object name must be a string")
    self.auth.check(cmd.user, "delete", cmd.name)
    rec = self.objects.get(cmd.name)
    if rec is None:
        raise KernelError(Code.NOT_FOUND, f"no object named {cmd.name!r}")
    for req in self._blocked(lambda r: r.obj == cmd.name):
        self._abort(req, Aborted(f"object {cmd.name!r} was deleted"))
    self._drain()
    self._forget(cmd.name)
    self._complete(cmd.tag, True)


def account(self: Kernel, rec: ObjectRecord) -> None:
    """The runs on `rec` spent steps enough to have grown it by a quarter of
    max_object_bytes (growth costs one step per 64 bytes made; `_run` and `_drain` add the
    steps up): measure it again. An object over the limit takes no new calls (`_start`)."""
    rec.steps = 0
    self._measure(rec)


def measure(self: Kernel, rec: ObjectRecord) -> None:
    limit = self.config.max_object_bytes
    self._budget.steps = 0
    try:
        size = state_size(rec.instance, limit)
    except BaseException:            # cannot happen by design (no uploaded code runs)
        log.exception("measuring object %r failed", rec.name)
        size = limit + 1
    self.usage.add(rec.owner, "state_bytes", size - rec.size)
    rec.size = size
    if size > limit:
        self.over_limit[rec.name] = size
    else:
        self.over_limit.pop(rec.name, None)


def drop(self: Kernel, name: str, why: str) -> None:
    log.warning("object %r dropped at log index %d: %s", name, self.index, why)
    self._forget(name)
    self.dropped[name] = f"object {name!r} was dropped at log index {self.index}: {why}"
    while len(self.dropped) > 1000:
        del self.dropped[next(iter(self.dropped))]


def forget(self: Kernel, name: str) -> None:
    rec = self.objects.pop(name, None)    # a restore drops objects it never added
    self.over_limit.pop(name, None)
    if rec is not None:
        self.usage.add(rec.owner, "objects", -1)
        self.usage.add(rec.owner, "state_bytes", -rec.size)


def args_of(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    if type(args) is not list or type(kwargs) is not dict:
        raise KernelError(Code.INVALID_ARGUMENT, "args must be a list and kwargs a map")
    return args, kwargs


def bind_sig(sig: Any, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise KernelError(Code.INVALID_ARGUMENT, f"{label}(): {e}") from None
