"""The kernel: committed commands in, completions out.

Theory of operation
-------------------
`Kernel.apply(index, command)` is the only entry point. It advances kernel time to the
command's timestamp (never backwards), times out the waits that are due, then handles the
command. An `Invoke` becomes a `Request` run by a greenlet (`sched.Task`). The request runs
until it returns or blocks in `Semaphore.acquire`; `release` only moves woken requests to the
ready queue; after the current request blocks or ends the kernel drains the ready queue, in
FIFO order, before `apply` returns (GESMAS Algorithm 1). So at every command boundary each
request in flight is blocked on exactly one semaphore.

Exactly-once: every invoke carries (session, seq). A session remembers the results it has not
yet acknowledged (`ack`, the client's low-water mark) and the requests it has in flight; a retry
gets the stored result, or joins the wait of the request in flight (its tag is added, so the
completion is sent to both callers). Nothing runs twice.

Checkpoints (DESIGN §5): greenlets cannot be pickled, so `Checkpoint` writes every waiting
call as a pending call (request id, command, deadlines) next to the pickled state. Waiters of
the standard classes stay where they are (their methods block before changing anything);
the others are detached, unwound with `Interrupted` (oldest block first) and re-run at once
with the same request ids and deadlines. Every replica does the same at the same log index;
`Kernel.restore(blob)` re-runs every pending call, which leaves it in the same state
(checkpoint.py; the records the kernel keeps are in records.py, classes and objects in
lifecycle.py).

Determinism: no clock, randomness, threads or I/O here; time and random numbers come from the
log (`sched.Context`); dicts are the only containers iterated for decisions, and they iterate
in insertion order.
"""
from __future__ import annotations

import heapq
import logging

import greenlet
from collections import deque
from typing import Any, Callable


from . import checkpoint, codec, lifecycle, queries, sessions
from .auth import AuthState, Usage
from .budget import Budget, ResourceLimit
from .codec import Command
from .errors import Code, Error, KernelError
from .records import (Completion, Config, Kind, ObjectRecord, PendingCall, Request,
                      Session)
from .registry import Registry, safe_str, type_name
from .sched import (Aborted, BudgetExceeded, Interrupted, Semaphore, SessionEnded, Task,
                    Timeout, Waiter)

log = logging.getLogger(__name__)

_INTERRUPTED = object()          # a request's outcome: interrupted by a checkpoint


class Kernel:
    def __init__(self, config: Config = Config()) -> None:
        self.config = config
        self.index = 0
        self.now = 0.0
        self.sessions: dict[int, Session] = {}
        self.objects: dict[str, ObjectRecord] = {}
        self._budget = Budget(config.step_budget)
        self.registry = Registry(self._budget, config.max_source,
                                 failpoints=config.failpoint_native_stall)
        self.dropped: dict[str, str] = {}   # objects a checkpoint had to drop -> why (bounded)
        # output besides completions, for the host (the leader's duties): sessions opened
        # (id, ttl, secret) and ended (id, None, "") by the last apply
        self.session_changes: list[tuple[int, float | None, str]] = []
        self.auth = AuthState()
        self.usage = Usage()
        self._default_quota = dict(config.default_quota)
        self.over_limit: dict[str, int] = {}   # objects over max_object_bytes -> their size
        self._measure_every = (config.max_object_bytes >> 2) // 64   # steps between measures
        self._order = 0                  # block sequence number
        self._raw: bytes | None = None   # the command being applied, as the log holds it
        self._waiting = 0                # live waiters
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._ready: deque[tuple[Request, BaseException | None]] = deque()
        self._out: list[Completion] = []
        self.checkpoint_index: int | None = None
        self.checkpoint_blob: bytes | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            codec.OpenSession: self._open_session,
            codec.CloseSession: lambda c: self._end_session(c, "closed"),
            codec.ExpireSession: lambda c: self._end_session(c, "expired"),
            codec.RegisterClass: self._register_class,
            codec.CreateObject: self._create_object,
            codec.Invoke: self._invoke,
            codec.DeleteObject: self._delete_object,
            codec.Tick: lambda c: None,
            codec.Checkpoint: self._checkpoint,
            codec.Query: self._query,
            codec.Cancel: self._cancel,
            codec.Auth: lambda c: self._complete(c.tag, self.auth.apply(c.op, c.args, c.user)),
        }

    # -- the entry point ---------------------------------------------------------------------

    def apply(self, index: int, command: bytes | Command,
              raw: bytes | None = None) -> list[Completion]:
        """Apply one committed command at log `index`; returns the completions it caused.
        `raw`: the command's encoded bytes when `command` was decoded already (a checkpoint
        writes waiting calls with them).

        Never raises (but for an `index` that is not after the last one): whatever uploaded
        code does becomes its caller's error, and a failure of the kernel itself becomes an
        INTERNAL error for that command, the same on every replica."""
        if index <= self.index:
            raise ValueError(f"log index {index} is not after {self.index}")
        self.index = index
        out = self._out = []
        if self.session_changes:
            self.session_changes = []
        Budget.current = self._budget
        self._raw = command if type(command) is bytes else raw if type(raw) is bytes else None
        if isinstance(command, Command):
            cmd = command
        else:
            try:
                cmd = codec.decode(command)
            except BaseException as e:       # DecodeError, or RecursionError on deep nesting
                log.error("log entry %d is not a command: %s", index, type(e).__name__)
                return out
        if index in self.config.skip_entries:
            log.warning("log entry %d skipped (skip_entries)", index)
            self._complete(cmd.tag, None, Error(
                Code.INTERNAL, f"log entry {index} was skipped by the operator"))
            return out
        try:
            self._apply(cmd)
        except BaseException as e:   # a kernel bug: fail this command, keep the replica going
            log.exception("kernel failed applying log entry %d", index)
            self._ready.clear()
            self._complete(cmd.tag, None, Error(
                Code.INTERNAL, f"the server failed applying this command: "
                               f"{type(e).__name__}", type(e).__name__))
        return out

    def abort(self, index: int, command: bytes, message: str) -> list[Completion]:
        """Take the committed entry at `index` without running it: the cluster aborted it
        (it ran native code past the replicas' runaway limit, replication/applier.py).
        Its caller gets RESOURCE_EXHAUSTED with `message` (the same on every replica); an
        invoke's (session, seq) keeps that error as its result, so that a retry gets it
        instead of running the call again. Like `apply`: deterministic, never raises (but
        for an `index` that is not after the last one)."""
        if index <= self.index:
            raise ValueError(f"log index {index} is not after {self.index}")
        self.index = index
        out = self._out = []
        if self.session_changes:
            self.session_changes = []
        try:
            cmd = codec.decode(command)
        except BaseException:
            return out
        error = Error(Code.RESOURCE_EXHAUSTED, message, "RunawayAborted")
        if type(cmd) is codec.Invoke and type(cmd.seq) is int and type(cmd.session) is int:
            s = self.sessions.get(cmd.session)
            if s is not None and self._owns(s, cmd) and cmd.seq > s.acked and \
                    cmd.seq not in s.results and cmd.seq not in s.inflight:
                s.results[cmd.seq] = (None, error)
                if len(s.results) > self.config.max_results:
                    old = next(iter(s.results))
                    del s.results[old]
                    s.dropped = max(s.dropped, old)
        self._complete(cmd.tag, None, error)
        return out

    def _apply(self, cmd: Command) -> None:
        ts = cmd.ts
        if type(ts) in (int, float) and self.now < ts < 1e15:    # not NaN, not infinite
            self.now = ts
        if self._deadlines and self._deadlines[0][0] <= self.now:
            self._expire_due()
            self._drain()
        try:
            self._handlers[type(cmd)](cmd)
        except KernelError as e:
            self._complete(cmd.tag, None, e.error)
        except (TypeError, ValueError, AttributeError) as e:   # a malformed field
            self._complete(cmd.tag, None, Error(Code.INVALID_ARGUMENT,
                                                f"{type(cmd).__name__}: {e}"))
        self._drain()

    def next_deadline(self) -> float | None:
        """The earliest time at which a wait times out (the leader proposes a Tick then)."""
        while self._deadlines and not self._deadlines[0][2].live:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    # -- sessions (sessions.py) ----------------------------------------------------------------

    _open_session = sessions.open_session
    _session = sessions.session
    _owns = sessions.owns
    _own = sessions.own
    _within = sessions.within
    _end_session = sessions.end_session
    _run_hook = sessions.run_hook

    # -- classes and objects (lifecycle.py) ------------------------------------------------------

    _register_class = lifecycle.register_class
    _create_object = lifecycle.create_object
    _make = lifecycle.make
    _delete_object = lifecycle.delete_object
    _account = lifecycle.account
    _measure = lifecycle.measure
    _drop = lifecycle.drop
    _forget = lifecycle.forget

    def _cancel(self, cmd: codec.Cancel) -> None:
        s = self.sessions.get(cmd.session) if type(cmd.session) is int else None
        if s is not None and not self._owns(s, cmd):
            s = None                      # not the caller's session: nothing to withdraw
        req = s.inflight.get(cmd.seq) if s is not None else None
        if req is not None and cmd.call_tag in req.tags:
            req.tags.remove(cmd.call_tag)
        if s is not None and req is not None and req.waiter is not None and not req.tags:
            self._abort(req, Aborted("cancelled by the caller"))
            self._drain()
            s.results.pop(cmd.seq, None)    # as if it never ran: a retry runs it afresh
        self._complete(cmd.tag, True)

    # -- invoke --------------------------------------------------------------------------------

    def _invoke(self, cmd: codec.Invoke) -> None:
        s = self._own(cmd.session, cmd)
        seq, ack = cmd.seq, cmd.ack
        if type(seq) is not int or type(ack) is not int or not 0 <= ack < seq:
            raise KernelError(Code.INVALID_ARGUMENT, "seq must be an int >= 1 and ack an int "
                              "in [0, seq)")
        if type(cmd.name) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "object name must be a string")
        self.auth.check(cmd.user, "invoke", cmd.name)
        if ack > s.acked:
            s.acked = ack
            for old in [k for k in s.results if k <= ack]:
                del s.results[old]
        done = s.results.get(seq)
        if done is not None:                          # a retry of a finished call
            self._complete(cmd.tag, done[0], done[1])
            return
        req = s.inflight.get(seq)
        if req is not None:                           # a retry of a call still waiting
            if cmd.tag:
                req.tags.append(cmd.tag)
            return
        if seq <= s.acked:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"seq {seq} is at or below the acknowledged mark {s.acked}")
        if seq <= s.dropped:
            raise KernelError(Code.RESOURCE_EXHAUSTED,
                              f"the result of seq {seq} may have been dropped: more than "
                              f"{self.config.max_results} results were left unacknowledged")
        if cmd.create is True:                       # get-or-create in the same command
            rec = self.objects.get(cmd.name)
            if rec is None and cmd.name in self.dropped:   # a loss is reported, not hidden
                raise KernelError(Code.NOT_FOUND, self.dropped[cmd.name])
            if rec is None:
                self.auth.check(cmd.user, "create", cmd.name)
                if not cmd.name or len(cmd.name) > 256:
                    raise KernelError(Code.INVALID_ARGUMENT, "object name must be 1 to 256 "
                                      "characters")
                self._make(cmd.name, cmd.class_name, cmd.ctor_args, cmd.ctor_kwargs, s.id,
                           cmd.user)
            elif rec.cls.name != cmd.class_name:
                raise KernelError(Code.ALREADY_EXISTS, f"object {cmd.name!r} exists with class "
                                  f"{rec.cls.name}, not {cmd.class_name}")
        self._start(cmd, s, self.index, [cmd.tag] if cmd.tag else [], None, (),
                    raw=self._raw)

    def _start(self, cmd: codec.Invoke, s: Session, index: int, tags: list[str],
               deadline: float | None, replay: tuple[float | None, ...],
               rerun: bool = False, raw: bytes | None = None) -> None:
        rec = self.objects.get(cmd.name)
        if rec is None:
            why = self.dropped.get(cmd.name) if type(cmd.name) is str else None
            raise KernelError(Code.NOT_FOUND, why or f"no object named {cmd.name!r}")
        if not rerun and cmd.name in self.over_limit:
            raise KernelError(Code.RESOURCE_EXHAUSTED,
                              f"object {cmd.name!r} holds more than "
                              f"{self.config.max_object_bytes} bytes of state: it takes no new "
                              "calls (delete it)")
        if not rerun:
            self._within(rec.owner, "state_bytes", 0)
        if cmd.class_name and cmd.class_name != rec.cls.name:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"object {cmd.name!r} is a {rec.cls.name}, not a {cmd.class_name}")
        found = rec.cls.method(cmd.method) if type(cmd.method) is str else None
        if found is None:
            raise KernelError(Code.NOT_FOUND,
                              f"{rec.cls.name} has no method {cmd.method!r} "
                              f"(methods: {', '.join(rec.cls.methods())})")
        fn, sig = found
        args, kwargs = lifecycle.args_of(cmd.args, cmd.kwargs)
        if not rerun:                        # a re-run was checked when it first ran
            lifecycle.bind_sig(sig, f"{rec.cls.name}.{cmd.method}", (rec.instance, *args), kwargs)
        timeout = cmd.timeout
        call_deadline = None if timeout is None else self._deadline(timeout, KernelError)
        req = Request(self, Kind.CALL, index, s.id, f"{rec.cls.name} {cmd.name!r}.{cmd.method}",
                      cmd.name)
        req.user = s.user
        if timeout == 0:
            req.nowait = "would wait, and the call's timeout is 0"
        req.seq = cmd.seq
        req.tags = tags
        req.cmd = cmd
        req.raw = raw
        req.replay = list(replay)
        if rerun:
            req.deadline = deadline
        elif timeout:
            req.deadline = call_deadline
        s.touched[cmd.name] = None
        s.inflight[cmd.seq] = req
        self._spawn(req, fn, (rec.instance, *args), kwargs)

    # -- running requests ----------------------------------------------------------------------

    def _body(self, req: Request, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """Runs inside the request's greenlet; returns (value, error) or _INTERRUPTED.
        Whatever the method raises, BaseException included, is the caller's error."""
        budget = self._budget
        try:
            value = fn(*args, **kwargs)
            if budget.steps > budget.limit:
                raise BudgetExceeded(budget.limit)
            value = codec.plain_copy(value, "result")
            if codec.may_exceed(value, self.config.max_result_bytes) and \
                    codec.encoded_size(value) > self.config.max_result_bytes:
                return None, Error(Code.RESOURCE_EXHAUSTED,
                                   f"{req.label} returned more than "
                                   f"{self.config.max_result_bytes} bytes", "ResourceLimit")
            return value, None
        except BudgetExceeded:
            return None, Error(Code.RESOURCE_EXHAUSTED,
                               f"{req.label} exceeded its budget of {budget.limit} steps",
                               "BudgetExceeded")
        except Interrupted:
            if req.interrupting:
                return _INTERRUPTED
            return None, Error(Code.APPLICATION, f"{req.label} raised Interrupted itself "
                               "(only a checkpoint may)", "Interrupted")
        except Timeout as e:
            return None, Error(Code.TIMEOUT, f"{req.label}: {safe_str(e) or 'timed out'}",
                               "Timeout")
        except SessionEnded as e:
            return None, Error(Code.ABORTED, f"{req.label}: {safe_str(e)}", "SessionExpired")
        except Aborted as e:
            return None, Error(Code.ABORTED, f"{req.label}: {safe_str(e)}", "Aborted")
        except KernelError as e:
            return None, e.error
        except codec.NotPlainValue as e:
            return None, Error(Code.APPLICATION, f"{req.label} returned {e}", "TypeError")
        except (ResourceLimit, codec.TooLarge) as e:
            return None, Error(Code.RESOURCE_EXHAUSTED, f"{req.label}: {safe_str(e)}",
                               "ResourceLimit")
        except MemoryError:
            return None, Error(Code.RESOURCE_EXHAUSTED, f"{req.label}: out of memory",
                               "MemoryError")
        except greenlet.GreenletExit:
            raise                            # the kernel ends this greenlet (see _interrupt)
        except BaseException as e:
            return None, Error(Code.APPLICATION, safe_str(e), type_name(e))

    def _spawn(self, req: Request, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        """Start `req` in a greenlet of its own that runs `fn(*args, **kwargs)`."""
        task = req.task = Task(lambda: self._body(req, fn, args, kwargs))
        task.kernel = self
        task.request = req
        self._run(req)

    def _run(self, req: Request, throw: BaseException | None = None,
             woken: bool = False) -> None:
        """Run `req` until it blocks or ends: start it, wake it (`woken`: its acquire returns
        True) or raise `throw` at its blocking point."""
        task = req.task
        assert task is not None
        self._budget.steps = 0
        if throw is None:
            outcome = task.switch(True) if woken else task.switch()
        else:
            req.interrupting = isinstance(throw, Interrupted)
            outcome = task.throw(throw)
            req.interrupting = False
        rec = self.objects.get(req.obj)          # charge the run's steps to its object
        if rec is not None:
            rec.steps += self._budget.steps
            if rec.steps > self._measure_every:
                self._account(rec)
        if task.dead:
            self._finish(req, outcome)

    def _finish(self, req: Request, outcome: Any) -> None:
        req.task = None
        s = self.sessions.get(req.session)
        call = req.kind is Kind.CALL
        if s is not None and call:
            s.inflight.pop(req.seq, None)
        if outcome is _INTERRUPTED:
            assert call and req.cmd is not None   # only waiters are interrupted; calls alone wait
            # the re-run waits again where it was waiting, until the same deadline
            self._pending.append(PendingCall(req.index, req.cmd, tuple(req.tags),
                                             req.deadline, tuple(req.deadlines[-1:]),
                                             req.raw))
            return
        req.outcome = outcome
        value, error = outcome
        if call:
            if s is not None:
                s.results[req.seq] = (value, error)
                if len(s.results) > self.config.max_results:
                    old = next(iter(s.results))
                    del s.results[old]
                    s.dropped = max(s.dropped, old)
        elif error is not None and req.kind is Kind.HOOK:
            log.warning("%s failed: %s", req.label, error)
        for tag in req.tags:
            self._out.append(Completion(tag, value, error))

    def _block(self, req: Request, sem: Semaphore, timeout: float | None) -> bool:
        """Called by Semaphore.acquire inside `req`'s greenlet: wait for a permit."""
        if req.kind is not Kind.CALL:
            raise RuntimeError(f"a {req.kind.value} may not wait")
        if req.session not in self.sessions:
            raise SessionEnded(f"session {req.session} has ended")
        if req.replay:                                  # re-run after a checkpoint
            deadline = req.replay.pop(0)
        else:
            if req.nowait:
                raise Timeout(req.nowait)
            if timeout == 0:
                raise Timeout("would wait, and acquire's timeout is 0")
            deadline = req.deadline
            own = self._deadline(timeout, ValueError)
            if own is not None:
                deadline = own if deadline is None else min(deadline, own)
            if deadline is not None and deadline <= self.now:
                raise Timeout("deadline passed")
            if self._waiting >= self.config.max_waiters:
                raise KernelError(Code.RESOURCE_EXHAUSTED,
                                  f"too many waiting requests ({self._waiting})")
            self._within(req.user, "waiters")
        req.deadlines.append(deadline)
        self._order += 1
        w = Waiter(req, sem, deadline, self._order)
        sem._enqueue(w)
        req.waiter = w
        self._waiting += 1
        self.usage.add(req.user, "waiters", 1)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, w.order, w))
        assert req.task is not None and req.task.parent is not None
        return req.task.parent.switch()

    def _deadline(self, timeout: Any, error: type[Exception]) -> float | None:
        """The kernel time at which a wait of `timeout` seconds ends; None for no timeout or
        an infinite one. The one place where timeouts (a call's, or acquire's) are checked:
        NaN, negative or non-numbers are refused with `error`."""
        if timeout is None:
            return None
        if type(timeout) not in (int, float) or not timeout >= 0:     # NaN fails `>= 0`
            message = f"timeout must be a number of seconds >= 0, not {timeout!r}"
            if error is KernelError:
                raise KernelError(Code.INVALID_ARGUMENT, message)
            raise error(message)
        deadline = self.now + timeout
        return deadline if deadline < 1e15 else None    # inf or astronomically far: no limit

    def _wake(self, w: Waiter) -> None:
        """Semaphore.release handed a permit to `w`: run it after the current request."""
        req = w.request
        req.waiter = None
        self._waiting -= 1
        self.usage.add(req.user, "waiters", -1)
        self._ready.append((req, None))

    def _abort(self, req: Request, exc: BaseException) -> None:
        w = req.waiter
        if w is not None and w.live:
            w.semaphore._drop(w)
            req.waiter = None
            self._waiting -= 1
            self.usage.add(req.user, "waiters", -1)
            self._ready.append((req, exc))

    def _expire_due(self) -> None:
        dl = self._deadlines
        while dl and dl[0][0] <= self.now:
            _, _, w = heapq.heappop(dl)
            if w.live:
                self._abort(w.request, Timeout("no result within the timeout"))
        if len(dl) > 64 and len(dl) > 2 * self._waiting:
            self._deadlines = [e for e in dl if e[2].live]
            heapq.heapify(self._deadlines)

    def _drain(self) -> None:
        ready = self._ready
        while ready:
            req, exc = ready.popleft()
            self._run(req, exc, woken=exc is None)

    def _blocked(self, pred: Callable[[Request], bool] = lambda r: True) -> list[Request]:
        """Requests in flight that satisfy `pred`, oldest block first."""
        reqs = [r for s in self.sessions.values() for r in s.inflight.values()
                if r.waiter is not None and pred(r)]
        reqs.sort(key=lambda r: r.waiter.order)  # type: ignore[union-attr]
        return reqs

    def _complete(self, tag: str, value: Any, error: Error | None = None) -> None:
        if tag:
            self._out.append(Completion(tag, value, error))

    # -- checkpoints (checkpoint.py) ---------------------------------------------------------

    _pending: list[PendingCall]
    _checkpoint = checkpoint.take
    _interrupt = checkpoint.interrupt
    _rerun = checkpoint.rerun
    _state = checkpoint.state
    _save_objects = checkpoint.save_objects
    _dump = checkpoint.dump

    @classmethod
    def restore(cls, blob: bytes, config: Config = Config()) -> Kernel:
        """A kernel in the state right after the checkpoint that made `blob`."""
        return checkpoint.restore(cls, blob, config)

    def state_digest(self, volatile: bool = True) -> str:
        """A hash of the whole state, waiters included: equal on replicas that applied the
        same log (without `volatile`, the log index and kernel time are left out)."""
        return checkpoint.state_digest(self, volatile)

    def _detach(self, req: Request) -> None:
        w = req.waiter
        if w is not None and w.live:
            w.semaphore._drop(w)
            self._waiting -= 1
            self.usage.add(req.user, "waiters", -1)
        req.waiter = None

    def _finish_error(self, req: Request, error: Error) -> None:
        s = self.sessions.get(req.session)
        if s is not None and req.kind is Kind.CALL:
            s.results[req.seq] = (None, error)
        for tag in req.tags:
            self._out.append(Completion(tag, None, error))

    # -- reads through the log (queries.py) ---------------------------------------------------

    _query = queries.query
