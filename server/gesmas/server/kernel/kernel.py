"""The kernel: committed commands in, completions out.

Theory of operation
-------------------
`Kernel.apply(index, command)` is the only entry point. It advances kernel time to the
command's timestamp (never backwards), times out the waits that are due, then hands the
command to the part whose job it is. An `Invoke` (handled here) becomes a `Request` that the
runner runs in a greenlet of its own (runner.py) until it returns or blocks in
`Semaphore.acquire`; `release` only moves woken requests to the ready queue; after the current
request blocks or ends the runner drains the ready queue, in FIFO order, before `apply` returns
(GESMAS Algorithm 1). So at every command boundary each request in flight is blocked on
exactly one semaphore.

The kernel owns its parts, as trio's runner holds its own; each gets at construction the
shared `State` (records.py) and the few parts it works through, never the kernel:

    runner       runs requests: greenlets, waits, deadlines, the ready queue (runner.py)
    keeper       sessions: open, ownership, end and session hooks (sessions.py)
    lifecycle    classes and objects: register, make, measure, drop, delete (lifecycle.py)
    checkpoints  checkpoints taken and restored, the state digest (checkpoint.py)
    queries      reads through the log (queries.py)

Each module imports only the ones listed above it, and this one imports them all.

Exactly-once: every invoke carries (session, seq). A session remembers the results it has not
yet acknowledged (`ack`, the client's low-water mark) and the requests it has in flight; a retry
gets the stored result, or joins the wait of the request in flight (its tag is added, so the
completion is sent to both callers). Nothing runs twice.

Checkpoints (DESIGN §5): greenlets cannot be pickled, so `Checkpoint` writes every waiting
call as a pending call (request id, command, deadlines) next to the pickled state, and
`Kernel.restore(blob)` re-runs every pending call (`_start` with `rerun`), which leaves it in
the same state (checkpoint.py).

Determinism: no clock, randomness, threads or I/O here; time and random numbers come from the
log (`sched.Context`); dicts are the only containers iterated for decisions, and they iterate
in insertion order.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from . import codec, stack
from .auth import AuthState, Usage
from .budget import Budget
from .capture import PendingBlob
from .deferred import SIZES_PER_ENTRY
from .checkpoint import Checkpoints
from .codec import Command
from .errors import Code, Error, KernelError
from .lifecycle import Lifecycle, args_of, bind_sig
from .queries import Queries
from .readers import Readers
from .records import Completion, Config, ObjectRecord, ObjectTable, PendingCall, Session, State
from .registry import Registry
from .request import Kind, Request
from .runner import Runner
from .sched import Aborted
from .sessions import SessionKeeper

__all__ = ["Completion", "Config", "Kernel"]

log = logging.getLogger(__name__)


class Kernel:
    def __init__(self, config: Config = Config()) -> None:
        self.config = config
        self.state = state = State(config)
        self._budget = budget = Budget(config.step_budget)
        self.registry = Registry(budget, config.max_source,
                                 failpoints=config.failpoint_native_stall)
        self._raw: bytes | None = None   # the command being applied, as the log holds it
        # the runner measures an object again when its runs may have grown it (lifecycle)
        self.runner = runner = Runner(state, config, budget,
                                      grown=lambda rec: self.lifecycle.account(rec))
        self.keeper = keeper = SessionKeeper(state, runner)
        self.lifecycle = lifecycle = Lifecycle(state, config, self.registry, budget, runner,
                                               keeper)
        self.checkpoints = Checkpoints(state, config, self.registry, budget, runner, lifecycle,
                                       self._restart)
        self._sizes = self.checkpoints.deferred
        self.queries = Queries(state, self.registry, runner, self.checkpoints)
        self.readers = Readers(state, config, self.registry, budget)
        self._handlers: dict[type, Callable[[Any], None]] = {
            codec.OpenSession: keeper.open,
            codec.CloseSession: lambda c: keeper.end(c, "closed"),
            codec.ExpireSession: lambda c: keeper.end(c, "expired"),
            codec.RegisterClass: lifecycle.register_class,
            codec.CreateObject: lifecycle.create_object,
            codec.Invoke: self._invoke,
            codec.DeleteObject: lifecycle.delete_object,
            codec.Tick: lambda c: None,
            codec.Checkpoint: self.checkpoints.take,
            codec.Query: self.queries.query,
            codec.Cancel: self._cancel,
            codec.Auth: lambda c: runner.complete(c.tag, state.auth.apply(c.op, c.args, c.user)),
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
        out = self._begin(index)
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
            self.runner.complete(cmd.tag, None, Error(
                Code.INTERNAL, f"log entry {index} was skipped by the operator"))
            return out
        limit = sys.getrecursionlimit()      # uploaded code moves it (stack.py); put back
        try:
            self._apply(cmd)
        except BaseException as e:   # a kernel bug: fail this command, keep the replica going
            log.exception("kernel failed applying log entry %d", index)
            self.runner.ready.clear()
            self.runner.complete(cmd.tag, None, Error(
                Code.INTERNAL, f"the server failed applying this command: "
                               f"{type(e).__name__}", type(e).__name__))
        finally:
            stack.use(limit)
        return out

    def _begin(self, index: int) -> list[Completion]:
        """Start applying the entry at `index`: the list its completions go to."""
        if index <= self.state.index:
            raise ValueError(f"log index {index} is not after {self.state.index}")
        self.state.index = index
        out = self.runner.out = []
        if self.runner.touched:
            self.runner.touched = set()
        if self.runner.topics:
            self.runner.topics = {}         # a new dict: the host may hold the last one
        if self.state.session_changes:
            self.state.session_changes = []
        return out

    def abort(self, index: int, command: bytes, message: str) -> list[Completion]:
        """Take the committed entry at `index` without running it: the cluster aborted it
        (it ran native code past the replicas' runaway limit, replication/applier.py).
        Its caller gets RESOURCE_EXHAUSTED with `message` (the same on every replica); an
        invoke's (session, seq) keeps that error as its result, so that a retry gets it
        instead of running the call again. Like `apply`: deterministic, never raises (but
        for an `index` that is not after the last one)."""
        out = self._begin(index)
        try:
            cmd = codec.decode(command)
        except BaseException:
            return out
        error = Error(Code.RESOURCE_EXHAUSTED, message, "RunawayAborted")
        if type(cmd) is codec.Invoke and type(cmd.seq) is int and type(cmd.session) is int:
            s = self.state.sessions.get(cmd.session)
            if s is not None and self.keeper.owns(s, cmd) and cmd.seq > s.acked and \
                    cmd.seq not in s.results and cmd.seq not in s.inflight:
                s.results[cmd.seq] = (None, error)
                if len(s.results) > self.config.max_results:
                    old = next(iter(s.results))
                    del s.results[old]
                    s.dropped = max(s.dropped, old)
        self.runner.complete(cmd.tag, None, error)
        return out

    def _apply(self, cmd: Command) -> None:
        st, runner = self.state, self.runner
        if self._sizes.applying_sizes:      # after a format-7 checkpoint (capture.py)
            self._sizes.apply_some(SIZES_PER_ENTRY)
        ts = cmd.ts
        if type(ts) in (int, float) and st.now < ts < 1e15:    # not NaN, not infinite
            st.now = ts
        if runner.deadlines and runner.deadlines[0][0] <= st.now:
            runner.expire_due()
            runner.drain()
        try:
            self._handlers[type(cmd)](cmd)
        except KernelError as e:
            runner.complete(cmd.tag, None, e.error)
        except (TypeError, ValueError, AttributeError) as e:   # a malformed field
            runner.complete(cmd.tag, None, Error(Code.INVALID_ARGUMENT,
                                                 f"{type(cmd).__name__}: {e}"))
        runner.drain()

    def next_deadline(self) -> float | None:
        """The earliest time at which a wait times out (the leader proposes a Tick then)."""
        return self.runner.next_deadline()

    # -- checkpoints (checkpoint.py) -----------------------------------------------------------

    @classmethod
    def restore(cls, blob: bytes, config: Config = Config()) -> Kernel:
        """A kernel in the state right after the checkpoint that made `blob`."""
        k = cls(config)
        limit = sys.getrecursionlimit()
        try:
            with k.state.objects.bulk():     # the sorted names: one sort, not 10^6 inserts
                k.checkpoints.load(blob)
        finally:
            stack.use(limit)
        return k

    # -- readers (readers.py): between two entries, on the caller's thread --------------------

    def read(self, user: str, name: str, method: str, args: Any = (),
             kwargs: Any = None, class_name: str = "",
             ctor: tuple[Any, Any] | None = None) -> Any:
        """Run the declared reader `name.method` on the applied state; its plain result, or
        KernelError (NotYet: the reader waits for a later entry that runs on the object).
        `class_name` and `ctor` (a get-or-create's constructor arguments) are checked
        against the object as an Invoke checks them."""
        rec = self.state.objects.get(name) if type(name) is str else None
        if rec is not None and class_name and class_name != rec.cls.name:
            raise KernelError(Code.ALREADY_EXISTS if ctor is not None else
                              Code.INVALID_ARGUMENT, f"object {name!r} is a {rec.cls.name}, "
                              f"not a {class_name}")
        if rec is not None and ctor is not None:
            self.lifecycle.check_args(rec, ctor[0], ctor[1])
        limit = sys.getrecursionlimit()
        try:
            return self.readers.read(user, name, method, list(args), dict(kwargs or {}))
        finally:
            stack.use(limit)

    def is_reader(self, name: str, method: str) -> bool:
        return self.readers.is_reader(name, method)

    def declares_reader(self, name: str, class_name: str, method: str) -> bool:
        return self.readers.declares_reader(name, class_name, method)

    @property
    def touched(self) -> set[str]:
        """The objects the last entry applied ran on, made or removed (readers waiting on
        them may hold now)."""
        return self.runner.touched

    @property
    def topics(self) -> dict[str, list[str] | None]:
        """What the last entry's object code announced it changed, per object
        (Context.changed; None: too many to list). Readers waiting with NotYet(topic)
        wake only for entries on their object whose topics match, or that named none."""
        return self.runner.topics

    def state_digest(self, volatile: bool = True) -> str:
        """A hash of the whole state, waiters included: equal on replicas that applied the
        same log (without `volatile`, the log index and kernel time are left out)."""
        return self.checkpoints.digest(volatile)

    # -- calls ---------------------------------------------------------------------------------

    def _cancel(self, cmd: codec.Cancel) -> None:
        self._withdraw(cmd)
        more = cmd.more if type(cmd.more) is list else ()
        for item in more:                 # [session, seq, call_tag, secret, user] each
            if type(item) is list and len(item) == 5 and type(item[0]) is int and \
                    type(item[1]) is int and all(type(x) is str for x in item[2:]):
                self._withdraw(codec.Cancel(ts=cmd.ts, session=item[0], seq=item[1],
                                            call_tag=item[2], secret=item[3], user=item[4]))
        self.runner.complete(cmd.tag, True)

    def _withdraw(self, cmd: codec.Cancel) -> None:
        s = self.state.sessions.get(cmd.session) if type(cmd.session) is int else None
        if s is not None and not self.keeper.owns(s, cmd):
            s = None                      # not the caller's session: nothing to withdraw
        req = s.inflight.get(cmd.seq) if s is not None else None
        if req is not None and cmd.call_tag in req.tags:
            req.tags.remove(cmd.call_tag)
            req.saved = None
        if s is not None and req is not None and req.waiter is not None and not req.tags:
            self.runner.abort(req, Aborted("cancelled by the caller"))
            self.runner.drain()
            s.results.pop(cmd.seq, None)    # as if it never ran: a retry runs it afresh

    def _invoke(self, cmd: codec.Invoke) -> None:
        st = self.state
        s = self.keeper.own(cmd.session, cmd)
        seq, ack = cmd.seq, cmd.ack
        if type(seq) is not int or type(ack) is not int or not 0 <= ack < seq:
            raise KernelError(Code.INVALID_ARGUMENT, "seq must be an int >= 1 and ack an int "
                              "in [0, seq)")
        if type(cmd.name) is not str:
            raise KernelError(Code.INVALID_ARGUMENT, "object name must be a string")
        st.auth.check(cmd.user, "invoke", cmd.name)
        if ack > s.acked:
            s.acked = ack
            for old in [k for k in s.results if k <= ack]:
                del s.results[old]
        done = s.results.get(seq)
        if done is not None:                          # a retry of a finished call
            self.runner.complete(cmd.tag, done[0], done[1])
            return
        req = s.inflight.get(seq)
        if req is not None:                           # a retry of a call still waiting
            if cmd.tag:
                req.tags.append(cmd.tag)
                req.saved = None
            return
        if seq <= s.acked:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"seq {seq} is at or below the acknowledged mark {s.acked}")
        if seq <= s.dropped:
            raise KernelError(Code.RESOURCE_EXHAUSTED,
                              f"the result of seq {seq} may have been dropped: more than "
                              f"{self.config.max_results} results were left unacknowledged")
        if cmd.create is True:                       # get-or-create in the same command
            rec = st.objects.get(cmd.name)
            if rec is None and cmd.name in st.dropped:   # a loss is reported, not hidden
                raise KernelError(Code.NOT_FOUND, st.dropped[cmd.name])
            if rec is None:
                st.auth.check(cmd.user, "create", cmd.name)
                if not cmd.name or len(cmd.name) > 256:
                    raise KernelError(Code.INVALID_ARGUMENT, "object name must be 1 to 256 "
                                      "characters")
                self.lifecycle.make(cmd.name, cmd.class_name, cmd.ctor_args, cmd.ctor_kwargs,
                                    s.id, cmd.user, cmd.measured is True)
            elif rec.cls.name != cmd.class_name:
                raise KernelError(Code.ALREADY_EXISTS, f"object {cmd.name!r} exists with class "
                                  f"{rec.cls.name}, not {cmd.class_name}")
            else:
                self.lifecycle.check_args(rec, cmd.ctor_args, cmd.ctor_kwargs)
        self._start(cmd, s, st.index, [cmd.tag] if cmd.tag else [], None, (),
                    raw=self._raw)

    def _restart(self, p: PendingCall, s: Session) -> None:
        """Run a checkpoint's pending call again, to the same wait (Checkpoints.restart)."""
        self._start(p.cmd, s, p.index, list(p.tags), p.deadline, p.deadlines, rerun=True,
                    raw=p.raw)

    def _start(self, cmd: codec.Invoke, s: Session, index: int, tags: list[str],
               deadline: float | None, replay: tuple[float | None, ...],
               rerun: bool = False, raw: bytes | None = None) -> None:
        st = self.state
        rec = st.objects.get(cmd.name)
        if rec is None:
            why = st.dropped.get(cmd.name) if type(cmd.name) is str else None
            raise KernelError(Code.NOT_FOUND, why or f"no object named {cmd.name!r}")
        if not rerun and cmd.name in st.over_limit:
            raise KernelError(Code.RESOURCE_EXHAUSTED,
                              f"object {cmd.name!r} holds more than "
                              f"{self.config.max_object_bytes} bytes of state: it takes no new "
                              "calls (delete it)")
        if not rerun:
            st.within(rec.owner, "state_bytes", 0)
        if cmd.class_name and cmd.class_name != rec.cls.name:
            raise KernelError(Code.INVALID_ARGUMENT,
                              f"object {cmd.name!r} is a {rec.cls.name}, not a {cmd.class_name}")
        found = rec.cls.method(cmd.method) if type(cmd.method) is str else None
        if found is None:
            raise KernelError(Code.NOT_FOUND,
                              f"{rec.cls.name} has no method {cmd.method!r} "
                              f"(methods: {', '.join(rec.cls.methods())})")
        fn, sig = found
        args, kwargs = args_of(cmd.args, cmd.kwargs)
        if not rerun:                        # a re-run was checked when it first ran
            bind_sig(sig, f"{rec.cls.name}.{cmd.method}", (rec.instance, *args), kwargs)
        timeout = cmd.timeout
        call_deadline = None if timeout is None else self.runner.deadline(timeout, KernelError)
        req = Request(self.runner, Kind.CALL, index, s.id,
                      f"{rec.cls.name} {cmd.name!r}.{cmd.method}", cmd.name)
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
        s.remember(cmd.name, rec, st.hooked_touched)
        s.inflight[cmd.seq] = req
        self.runner.seal(cmd.name)           # an open checkpoint capture saves it first
        self.runner.spawn(req, fn, (rec.instance, *args), kwargs)

    # -- the state, as the host and the tests read it ------------------------------------------

    def close(self) -> None:
        """This kernel is no longer used (Runner.close): let its memory go."""
        self.runner.close()

    @property
    def index(self) -> int:
        return self.state.index

    @property
    def now(self) -> float:
        return self.state.now

    @property
    def sessions(self) -> dict[int, Session]:
        return self.state.sessions

    @property
    def objects(self) -> ObjectTable:
        return self.state.objects

    @property
    def dropped(self) -> dict[str, str]:
        """Objects a checkpoint had to drop -> why (bounded)."""
        return self.state.dropped

    @property
    def over_limit(self) -> dict[str, int]:
        """Objects over max_object_bytes -> their size."""
        return self.state.over_limit

    @property
    def auth(self) -> AuthState:
        return self.state.auth

    @property
    def usage(self) -> Usage:
        return self.state.usage

    @property
    def session_changes(self) -> list[tuple[int, float | None, str]]:
        """Sessions opened (id, ttl, secret) and ended (id, None, "") by the last apply: for
        the host (the leader's duties)."""
        return self.state.session_changes

    @property
    def checkpoint_index(self) -> int | None:
        return self.checkpoints.index

    @property
    def checkpoint_blob(self) -> bytes | None:
        """The last checkpoint's bytes (its capture finished first if still open)."""
        return self.checkpoints.blob

    @checkpoint_blob.setter
    def checkpoint_blob(self, blob: bytes | None) -> None:
        self.checkpoints.blob = blob

    @property
    def checkpoint_format(self) -> int | None:
        """The format of the last checkpoint's bytes (checkpoint.FORMAT is the newest)."""
        return self.checkpoints.format

    @property
    def checkpoint_result(self) -> bytes | PendingBlob | None:
        """The last checkpoint's bytes, or a PendingBlob while its capture is open
        (capture.py): `.done`, and `.result()` on this kernel's thread."""
        return self.checkpoints.result

    @property
    def capturing(self) -> bool:
        """Whether the last checkpoint still has objects to save (capture.py)."""
        return self.checkpoints.capture is not None

    def capture_some(self, limit: int = 200) -> bool:
        """Save up to `limit` objects for the open checkpoint capture, between two entries
        (the host's idle time); whether some are left."""
        return self.checkpoints.capture_some(limit)

    @property
    def checkpoint_size(self) -> int | None:
        """The size of the last checkpoint's blob, None while it is being captured (any
        thread: it assembles nothing)."""
        r = self.checkpoints.result
        if isinstance(r, PendingBlob):
            r = r.blob
        return None if r is None else len(r)

    @property
    def _waiting(self) -> int:
        """Calls blocked now (the status page and metrics read it outside the log)."""
        return self.runner.waiting

    def _blocked(self, pred: Callable[[Request], bool] = lambda r: True) -> list[Request]:
        """Requests in flight that satisfy `pred`, oldest block first."""
        return self.runner.blocked(pred)
