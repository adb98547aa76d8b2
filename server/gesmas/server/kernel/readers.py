"""Readers: methods a class declares read-only, run against the applied state without a log
entry (issue "Reads and waits that do not touch the log").

A class lists them in `_readers` (a tuple of method names), as it lists `_restartable`. A
replica runs such a call on its own state between two entries, so it must change nothing:

- a standard class (a name only the replicas may register) is trusted, as for
  `_restartable`: its readers run on the live object;
- an uploaded class's reader runs on a copy of the object, made by the checkpoint's pickling
  (and kept while no entry runs on the object). After the reader the copy is pickled again;
  bytes that differ mean the reader wrote, and the read fails (APPLICATION, type
  ReadOnlyViolation) naming it (the copy is thrown away). The live state is never reached, so no reader, however
  written, changes what the replicas hold.
- in every reader, semaphore operations and `context()` are refused (sched.READING).

A reader may raise `NotYet` when what it waits for does not hold yet: the caller (the node)
runs it again after the next entry that ran on the object (`touched`), until it returns or
its time is up. Nothing of that wait is replicated.

Interface: `Readers(state, config, budget)`; `is_reader(name, method)`, `read(user, name,
method, args, kwargs)` -> the plain result or KernelError (NotYet for a wait that goes on).
The caller holds the kernel still (the apply lock) while a reader runs.
"""
from __future__ import annotations

from typing import Any

from . import codec, stack
from .budget import Budget, ResourceLimit
from .errors import Code, KernelError
from .lifecycle import args_of, bind_sig
from .records import Config, ObjectRecord, State
from .registry import Registry, safe_str, type_name
from .sched import READING, BudgetExceeded, NotYet


def readers_of(cls: type) -> tuple[str, ...]:
    names = getattr(cls, "_readers", ())
    if type(names) is not tuple or not all(type(n) is str for n in names):
        return ()
    return names


class Readers:
    def __init__(self, state: State, config: Config, registry: Registry,
                 budget: Budget) -> None:
        self.state = state
        self.config = config
        self.registry = registry
        self.budget = budget
        # name -> (the live instance and its run count when copied, pristine bytes, copy)
        self._copies: dict[str, tuple[Any, int, bytes, Any]] = {}

    def is_reader(self, name: str, method: str) -> bool:
        rec = self.state.objects.get(name)
        return rec is not None and method in readers_of(rec.cls.cls)

    def declares_reader(self, name: str, class_name: str, method: str) -> bool:
        """Whether `method` is a declared reader of the object `name`, or, while no such
        object exists, of the newest version of the class `class_name` (a get-or-create)."""
        rec = self.state.objects.get(name)
        if rec is not None:
            return method in readers_of(rec.cls.cls)
        cv = self.registry.latest(class_name) if class_name else None
        return cv is not None and method in readers_of(cv.cls)

    def read(self, user: str, name: str, method: str, args: Any, kwargs: Any) -> Any:
        st = self.state
        if type(name) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "object name must be a string")
        st.auth.check(user, "invoke", name)
        rec = st.objects.get(name)
        if rec is None:
            why = st.dropped.get(name)
            raise KernelError(Code.NOT_FOUND, why or f"no object named {name!r}")
        label = f"{rec.cls.name} {name!r}.{method}"
        if type(method) is not str or method not in readers_of(rec.cls.cls):
            raise KernelError(Code.INVALID_ARGUMENT, f"{rec.cls.name}.{method} is not a "
                              "declared reader (listed in the class's _readers)")
        found = rec.cls.method(method)
        if found is None:
            raise KernelError(Code.NOT_FOUND, f"{rec.cls.name} has no method {method!r}")
        fn, sig = found
        args, kwargs = args_of(args, kwargs)
        bind_sig(sig, f"{rec.cls.name}.{method}", (rec.instance, *args), kwargs)
        trusted = rec.cls.name in self.config.reserved_classes
        instance = rec.instance if trusted else self._copy(rec)
        try:
            return self._run(label, fn, instance, args, kwargs)
        finally:        # also when it failed: a reader that wrote, then raised, wrote
            if not trusted:
                self._verify(rec, label)

    # -- running -----------------------------------------------------------------------------

    def _run(self, label: str, fn: Any, instance: Any, args: list[Any],
             kwargs: dict[str, Any]) -> Any:
        budget = self.budget
        outer, Budget.current = Budget.current, budget
        budget.steps = 0
        READING[0] = label
        try:
            with stack.relative():
                value = fn(instance, *args, **kwargs)
            if budget.steps > budget.limit:
                raise BudgetExceeded(budget.limit)
            value = codec.plain_copy(value, "result")
            if codec.may_exceed(value, self.config.max_result_bytes) and \
                    codec.encoded_size(value) > self.config.max_result_bytes:
                raise KernelError(Code.RESOURCE_EXHAUSTED, f"{label} returned more than "
                                  f"{self.config.max_result_bytes} bytes", "ResourceLimit")
            return value
        except (KernelError, NotYet):
            raise
        except BudgetExceeded:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"{label} exceeded its budget of "
                              f"{budget.limit} steps", "BudgetExceeded") from None
        except codec.NotPlainValue as e:
            raise KernelError(Code.APPLICATION, f"{label} returned {e}", "TypeError") from None
        except (ResourceLimit, codec.TooLarge) as e:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"{label}: {safe_str(e)}",
                              "ResourceLimit") from None
        except MemoryError:
            raise KernelError(Code.RESOURCE_EXHAUSTED, f"{label}: out of memory",
                              "MemoryError") from None
        except BaseException as e:
            raise KernelError(Code.APPLICATION, safe_str(e), type_name(e)) from None
        finally:
            READING[0] = None
            budget.steps = 0
            Budget.current = outer

    # -- copies of uploaded objects ------------------------------------------------------------

    def _copy(self, rec: ObjectRecord) -> Any:
        from .checkpoint import pickle_state, unpickle_state
        got = self._copies.get(rec.name)
        if got is not None and got[0] is rec.instance and got[1] == rec.runs:
            return got[3]
        outer, Budget.current = Budget.current, self.budget
        READING[0] = f"a copy of {rec.name!r}"
        try:
            with stack.relative():
                self.budget.steps = 0
                copy = unpickle_state(self.registry, pickle_state(self.registry, rec.instance))
                self.budget.steps = 0
                pristine = pickle_state(self.registry, copy)
        except BaseException as e:
            raise KernelError(Code.APPLICATION,
                              f"{rec.cls.name} {rec.name!r} cannot be read without the log: "
                              f"its state cannot be copied ({type_name(e)}: "
                              f"{safe_str(e, 200)})", "NotCopyable") from None
        finally:
            READING[0] = None
            self.budget.steps = 0
            Budget.current = outer
        self._copies[rec.name] = (rec.instance, rec.runs, pristine, copy)
        if len(self._copies) > 4096:            # keep the most recent copies only
            del self._copies[next(iter(self._copies))]
        return copy

    def _verify(self, rec: ObjectRecord, label: str) -> None:
        from .checkpoint import pickle_state
        got = self._copies.get(rec.name)
        if got is None:
            return
        READING[0] = label
        try:
            with stack.relative():
                after = pickle_state(self.registry, got[3])
        except BaseException:
            after = b""
        finally:
            READING[0] = None
            self.budget.steps = 0
        if after != got[2]:
            del self._copies[rec.name]
            raise KernelError(Code.APPLICATION, f"{label} is declared a reader (_readers) "
                              "but changed the object's state; a reader may not write (the "
                              "change was made to a copy and is gone)", "ReadOnlyViolation")

    def forget(self, name: str) -> None:
        self._copies.pop(name, None)
