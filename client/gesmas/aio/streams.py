"""Invocations over the ``Calls`` stream (asyncio client): the counterpart of
``gesmas.client.streams`` with a reader task instead of a thread, and the same rules.

Cancelling the task that awaits a call sends a cancel for it on the stream, which withdraws
its wait on the replica (as cancelling a unary RPC does). Writes are serialized by a lock:
grpc.aio allows one write at a time on a stream, and a replica that holds back a busy
stream (flow control) makes the writers wait here.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc

from gesmas.client import core
from gesmas.client.errors import Unavailable
from gesmas.client.security import Login
from gesmas.client.streams import (FollowedAnswers, Unsupported, call_message, ended,
                                   no_answer, response, settled, stream_failure)
from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["CallStream", "Following"]


class CallStream:
    def __init__(self, stub: Any, address: str, metadata: tuple[tuple[str, str], ...],
                 login: Login, max_message: int) -> None:
        self.address = address
        self.metadata = metadata
        self.max_message = max_message
        self._login = login
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._closing = False
        self.broken: BaseException | None = None
        self._rpc = stub.Calls(metadata=metadata)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def usable(self) -> bool:
        return self.broken is None and not self._closing

    async def _read(self) -> None:
        failure: BaseException
        try:
            while True:
                answer = await self._rpc.read()
                if answer is grpc.aio.EOF:
                    break
                for fut in settled(answer, self._pending):
                    if not fut.done():
                        fut.set_result(answer)
            failure = core.Failure(Unavailable(f"{self.address}: the call stream ended"))
        except grpc.RpcError as e:
            failure = stream_failure(e, self.address, self._login, self.metadata)
        except asyncio.CancelledError:
            failure = core.Failure(Unavailable(f"{self.address}: the call stream was closed"))
        self.broken = failure
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(failure)

    async def call(self, request: Any, deadline: float | None) -> Any:
        msg = call_message(request, deadline, self.max_message)
        if not self.usable:
            raise ended(self.address, self.broken)
        call_id = msg.id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        try:
            try:
                async with self._write_lock:
                    await self._rpc.write(msg)
            except (grpc.RpcError, asyncio.InvalidStateError) as e:
                # the stream broke under the write: the reader fails the pending calls
                if not fut.done():
                    self._pending.pop(call_id, None)
                    raise core.Failure(Unavailable(f"{self.address}: {e}")) from None
            answer = await asyncio.wait_for(asyncio.shield(fut), deadline)
        except asyncio.TimeoutError:
            self._withdraw(call_id)
            raise no_answer(self.address, deadline) from None
        except (core.Failure, Unsupported):
            raise
        except BaseException:          # the awaiting task was cancelled: withdraw the wait
            self._withdraw(call_id)
            raise
        return response(answer, self.address, self._login, self.metadata)

    async def follow(self, request: Any, argument: str, key: str,
                     deadline: float | None) -> tuple[Following, Any]:
        """As the sync stream's: (the Following of a followed reader, its first answer)."""
        msg = call_message(request, deadline, self.max_message)
        msg.follow.argument, msg.follow.key, msg.follow.merge = argument, key, True
        if not self.usable:
            raise ended(self.address, self.broken)
        following = Following(self, deadline)
        call_id = msg.id = following.id = next(self._ids)
        self._pending[call_id] = following      # type: ignore[assignment]
        try:
            try:
                async with self._write_lock:
                    await self._rpc.write(msg)
            except (grpc.RpcError, asyncio.InvalidStateError) as e:
                if self._pending.pop(call_id, None) is not None:
                    following.finished = True
                    raise core.Failure(Unavailable(f"{self.address}: {e}")) from None
            return following, await following.next()
        except BaseException:
            following.close()
            raise

    def _withdraw(self, call_id: int) -> None:
        if self._pending.pop(call_id, None) is not None and self.usable:
            asyncio.get_running_loop().create_task(self._send_cancel(call_id))

    async def _send_cancel(self, call_id: int) -> None:
        try:
            async with self._write_lock:
                await self._rpc.write(pb.Call(id=call_id, cancel=True))
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass                        # the stream broke: its waits are withdrawn anyway

    def finish(self) -> None:
        """Half-close once the writes under way are done; the calls in flight finish."""
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().create_task(self._done_writing())

    async def _done_writing(self) -> None:
        try:
            async with self._write_lock:
                await self._rpc.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass

    def cancel(self) -> None:
        self._rpc.cancel()
        self._reader.cancel()


class Following(FollowedAnswers):
    """As ``gesmas.client.streams.Following``: the answers of a followed call, put by the
    stream's reader task (``set_result``), taken with ``await next()``."""

    def __init__(self, stream: CallStream, deadline: float | None) -> None:
        super().__init__(stream, deadline)
        self._answers: asyncio.Queue[Any] = asyncio.Queue()

    def done(self) -> bool:           # as a Future's: it takes every answer that comes
        return False

    def set_result(self, answer: Any) -> None:
        self._answers.put_nowait(answer)

    def set_exception(self, failure: BaseException) -> None:
        self._answers.put_nowait(failure)

    async def next(self) -> Any:
        try:
            answer = await asyncio.wait_for(self._answers.get(), self.deadline)
        except asyncio.TimeoutError:
            self.close()
            raise no_answer(self.stream.address, self.deadline) from None
        return self.taken(answer)
