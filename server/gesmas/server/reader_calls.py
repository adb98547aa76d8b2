"""Declared readers served by a replica without a log entry (kernel/readers.py), for the
gateway: run on the applied state as the request's ReadOptions ask, again after each entry
that changes the object while the reader says NotYet (a wait off the log: a Map's watch,
observe), until it answers, its timeout passes, or the replica stops.

Identical calls at one state share one run and one encoding (node_reads.ReadMemo): a change
to a key that a hundred watches wait for runs the watch reader once on this replica, and the
hundred re-armed watches that follow once more.
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from gesmas.protocol import values
from gesmas.v1 import gesmas_pb2 as pb

from .calls import STOPPING, CallFailed
from .kernel.errors import Code, Error
from .kernel.sched import NotYet
from .replication.reads import LINEARIZABLE, SEQUENTIAL

_CONSISTENCY = {pb.CONSISTENCY_LINEARIZABLE: LINEARIZABLE, pb.CONSISTENCY_SEQUENTIAL: SEQUENTIAL}

#: The highest log index that the answer of the request being served reflects: raised by
#: the gateway's `_answer` and `_read`, written into the response's applied_index by `Gateway._guard` (and by
#: `Gateway._invoke`, which the Calls stream runs without `_guard`). One value per asyncio task.
reflects: contextvars.ContextVar[int] = contextvars.ContextVar("gesmas_reflects", default=0)


#: Reader calls whose encoded arguments are larger than this are not memoized: a key is kept
#: with its answer (up to ReadMemo.SIZE of them), and a watch or a get is a few dozen bytes.
MEMO_KEY_BYTES = 4096


def read_key(request: Any, user: str) -> Any:
    """What a reader's answer depends on besides the state (node_reads.ReadMemo): the user,
    the object, the method, the arguments, and the constructor's (a get-or-create checks
    them against the object's) as their deterministic encoding. None (not memoized) past
    MEMO_KEY_BYTES of arguments."""
    args = _encoded_args(request.args, request.kwargs)
    ctor = _encoded_args(request.ctor_args, request.ctor_kwargs) if request.create else None
    size = sum(map(len, args[0])) + sum(len(k) + len(v) for k, v in args[1])
    if ctor is not None:
        size += sum(map(len, ctor[0])) + sum(len(k) + len(v) for k, v in ctor[1])
    if size > MEMO_KEY_BYTES:
        return None
    return (user, request.object_name, request.method, request.class_name, request.create,
            args, ctor)


def _encoded_args(args: Any, kwargs: Any) -> Any:
    return (tuple(a.SerializeToString(deterministic=True) for a in args),
            tuple((k, kwargs[k].SerializeToString(deterministic=True)) for k in sorted(kwargs)))


#: The longest Follow.argument and Follow.key.
MAX_FOLLOW_NAME = 128


def follow_names(follow: Any) -> tuple[str, str]:
    """(argument, key) of a Call's Follow, checked."""
    for kind, v in (("follow.argument", follow.argument), ("follow.key", follow.key)):
        if not v or len(v) > MAX_FOLLOW_NAME:
            raise _invalid(f"{kind} must be 1 to {MAX_FOLLOW_NAME} characters, got {len(v)}")
    if not follow.argument.isidentifier():
        raise _invalid(f"follow.argument must name a keyword argument, not "
                       f"{follow.argument!r}")
    return follow.argument, follow.key


def cursor_of(value: Any, key: str, previous: Any, label: str) -> Any:
    """The cursor a followed reader's answer `value` gives its next run: value[key], which
    must differ from `previous` (else the reader would answer the same at once, for ever)."""
    if type(value) is not dict or key not in value:
        raise _invalid(f"follow: {label} answered {type(value).__name__}, not a map with "
                       f"the key {key!r} (Call.follow.key)")
    cursor = value[key]
    if type(cursor) is type(previous) and cursor == previous:
        raise _invalid(f"follow: {label} answered with {key!r} still {cursor!r}; a followed "
                       "reader must move its cursor at each answer")
    return cursor


def saw(index: int) -> None:
    if index > reflects.get():
        reflects.set(index)


def read_options(request: Any) -> tuple[str, int]:
    """(consistency, min_index) of a read request's ReadOptions, checked."""
    opts = request.read
    consistency = _CONSISTENCY.get(opts.consistency)
    if consistency is None:
        raise _invalid(f"read.consistency must be CONSISTENCY_LINEARIZABLE (0) or "
                       f"CONSISTENCY_SEQUENTIAL (1), not {opts.consistency}")
    if opts.min_index < 0:
        raise _invalid(f"read.min_index must be >= 0, not {opts.min_index}")
    return consistency, opts.min_index


def _invalid(message: str) -> CallFailed:
    return CallFailed(Error(Code.INVALID_ARGUMENT, message))


class _Group:
    """The follows that share one run of their reader (ReaderCalls._shared): the run, and
    the future of each follower waiting for its answer, settled together when it ends."""
    __slots__ = ("task", "waiting")

    def __init__(self) -> None:
        self.task: asyncio.Task[tuple[Any, Any, int]]
        self.waiting: dict[asyncio.Future[tuple[Any, Any, int]], None] = {}   # in order

    def settle(self, task: asyncio.Task[tuple[Any, Any, int]]) -> None:
        """The run ended (its done callback): each follower gets its answer or its error. A
        run is cancelled only once its last follower left; if any were still waiting (the
        replica stops), they are told so."""
        if task.cancelled():
            error: BaseException | None = CallFailed(STOPPING)
        else:
            error = task.exception()       # retrieved here, whoever waits for it
        waiting = [fut for fut in self.waiting if not fut.done()]
        if error is not None:
            for fut in waiting:
                fut.set_exception(error)
            return
        answer = task.result()
        for fut in waiting:
            fut.set_result(answer)


def _time_out(fut: asyncio.Future[Any], label: str) -> None:
    if not fut.done():
        fut.set_exception(CallFailed(Error(Code.TIMEOUT, f"{label}: timed out waiting",
                                           "Timeout")))


class ReaderCalls:
    def __init__(self, node: Any, stopping: asyncio.Event) -> None:
        self.node = node
        self.stopping = stopping             # the replica stops: waiting readers fail
        self._last_encoded: tuple[Any, Any] | None = None    # _encoded's last answer
        self._groups: dict[Any, _Group] = {}                 # _shared's runs

    async def answer(self, request: Any, user: str, name: str, method: str, args: Any,
                     kwargs: Any, timeout: float | None) -> Any:
        """The reader's answer as a protobuf Value, or CallFailed."""
        return self._encoded(await self._run(request, user, name, method, args, kwargs,
                                             timeout))

    async def follow(self, request: Any, user: str, name: str, method: str, argument: str,
                     key: str, timeout: float | None, first: Any) -> Any:
        """The answers (protobuf InvokeResponses) of the reader `name.method` after its first
        one, the plain value `first`: each run with the keyword `argument` set to the
        previous answer's `key` (Call.follow), sequential on this replica from the index the
        previous answer reflects, so never older. Goes on until an error (CallFailed).
        Counted in `gesmas_followed_calls` while it runs."""
        args = values.from_values(request.args)
        kwargs = values.from_value_map(request.kwargs)
        label = f"{name}.{method}"
        previous = kwargs.get(argument)
        value = first
        request.read.consistency = pb.CONSISTENCY_SEQUENTIAL
        if argument in request.kwargs:
            del request.kwargs[argument]
        fixed = read_key(request, user)     # all but the cursor, which each run changes
        reads = self.node.reads
        reads.followed += 1
        try:
            while True:
                previous = kwargs[argument] = cursor_of(value, key, previous, label)
                cursor = request.kwargs[argument]
                cursor.CopyFrom(values.to_value(previous, argument, values.MAX_ARG_DEPTH))
                request.read.min_index = reflects.get()
                if fixed is None:
                    value = await self._run(request, user, name, method, args, kwargs,
                                            timeout)
                    yield pb.InvokeResponse(result=self._encoded(value),
                                            applied_index=reflects.get())
                    continue
                gkey = (fixed, argument, cursor.SerializeToString(deterministic=True),
                        request.read.min_index)       # the cursor is the follower's anyway
                response, value, index = await self._shared(
                    gkey, request, user, name, method, args, kwargs, timeout, label)
                saw(index)
                yield response
        finally:
            reads.followed -= 1

    async def _shared(self, gkey: Any, request: Any, user: str, name: str, method: str,
                      args: Any, kwargs: Any, timeout: float | None,
                      label: str) -> tuple[Any, Any, int]:
        """(answer, value, index) of a followed call's next run, shared by the follows of
        the same call (read_key, cursor included) from the same index (`gkey`): a hundred
        watch streams of one key at one revision wait as one reader, run it once per change,
        and take the one answer, encoded once. `timeout` is each follower's own; the run
        ends when its last follower is gone."""
        loop = asyncio.get_running_loop()
        group = self._groups.get(gkey)
        if group is None:
            mine = pb.InvokeRequest()
            mine.CopyFrom(request)             # the follower changes its own for the next run
            group = self._groups[gkey] = _Group()
            group.task = loop.create_task(self._group_run(
                group, gkey, mine, user, name, method, args, dict(kwargs)))
            group.task.add_done_callback(group.settle)
        fut: asyncio.Future[tuple[Any, Any, int]] = loop.create_future()
        group.waiting[fut] = None
        timer = None if timeout is None else loop.call_later(timeout, _time_out, fut, label)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            group.waiting.pop(fut, None)
            if not group.waiting and not group.task.done():
                group.task.cancel()
                if self._groups.get(gkey) is group:
                    del self._groups[gkey]

    async def _group_run(self, group: _Group, gkey: Any, request: Any, user: str, name: str,
                         method: str, args: Any, kwargs: Any) -> tuple[Any, Any, int]:
        try:
            value = await self._run(request, user, name, method, args, kwargs, None)
            index = reflects.get()
            return pb.InvokeResponse(result=self._encoded(value), applied_index=index), \
                value, index
        finally:
            if self._groups.get(gkey) is group:
                del self._groups[gkey]

    async def _run(self, request: Any, user: str, name: str, method: str, args: Any,
                   kwargs: Any, timeout: float | None) -> Any:
        """A declared reader, run by this replica without a log entry (kernel/readers.py).
        One that raises NotYet runs again each time this replica has applied an entry that
        changed its object (node_reads.ObjectChanges), until it answers or `timeout`
        (seconds; None: no limit) has passed (TIMEOUT)."""
        consistency, min_index = read_options(request)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        ctor = (values.from_values(request.ctor_args), values.from_value_map(
            request.ctor_kwargs)) if request.create else None    # once, not under the lock

        memo, key = self.node.reads.memo, read_key(request, user)
        def run(k: Any) -> Any:
            got = memo.get(k, key) if key is not None else None
            if got is None:
                try:
                    got = (True, k.read(user, name, method, args, kwargs, request.class_name,
                                        ctor))
                except NotYet as e:           # its topic, if it named one
                    got = (False, e.topic)
                if key is not None:           # not an error: it is raised afresh each time
                    memo.put(k, key, got)
            return got

        changes = self.node.reads.changes
        waiting = False
        while True:
            try:
                (done, value), index = await self.node.read(
                    run, consistency, min_index, **({"wait": 5.0} if waiting else {}))
            except CallFailed as e:     # waiting: this replica fell behind for a while
                if waiting and e.error.code == Code.UNAVAILABLE and \
                        (deadline is None or loop.time() < deadline):
                    continue
                raise
            saw(index)
            if done:
                return value
            topic = value                # what it waits for (NotYet(topic)), else None
            waiting = True
            changed = None
            while changed is None:      # until an entry changes the object, or the deadline
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    raise CallFailed(Error(Code.TIMEOUT, f"{name}.{method}: timed out "
                                           "waiting", "Timeout"))
                changed = await self._unless_stopping(
                    changes.wait(name, index, self.node.applied_index, left, topic))
            consistency, min_index = SEQUENTIAL, changed    # the entry that changed it

    def _encoded(self, value: Any) -> Any:
        """`value` (a reader's answer) as a protobuf Value; encoded once for the readers that
        share it (node_reads.ReadMemo), as long as it is the last one encoded."""
        last = self._last_encoded
        if last is not None and last[0] is value:
            return last[1]
        encoded = values.to_value(value, "result")
        self._last_encoded = (value, encoded)
        return encoded

    async def _unless_stopping(self, waiting: Any) -> Any:
        """Await `waiting` (a reader's wait, local to this replica: no call of the node's
        table), or fail it UNAVAILABLE "Stopping" when the replica stops, as Node.serve fails
        the calls (the client retries elsewhere)."""
        task = asyncio.ensure_future(waiting)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            raise CallFailed(STOPPING)
        return task.result()
