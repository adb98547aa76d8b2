"""The bounds of grpclimits against peers that stop reading, on a grpc.aio server of its own.

The server runs in a subprocess configured as a replica's (grpclimits.server_options,
maximum_concurrent_rpcs, AnswerBudget) with a tiny servicer: Big answers N bytes, Block waits
an hour, Stats reports counters. The attackers are raw HTTP/2 connections on plain sockets
(stdlib only): they take the server's SETTINGS, then start calls and never send a
WINDOW_UPDATE, so the server can send each of them no more than the initial 64 KB windows;
a thread reads and drops what arrives and answers PINGs, so keepalive does not close them
(a peer that stops reading altogether is closed by keepalive after 30 s: too slow here).

Without these bounds, 2 such connections asking 1000 answers of 1 MB each grow the server
by ~4 GB (the whole serialized answer of each call is kept until sent), and 20,000 blocked
calls on one connection by ~400 MB.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import pytest

from gesmas.server import grpclimits
from gesmas.server.config import MAX_MESSAGE

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                                reason="reads the server's RSS from /proc")

SERVER = r'''
import asyncio, json, signal, sys
import grpc
from gesmas.server import grpclimits
from gesmas.server.config import MAX_MESSAGE

counts = {"big": 0, "block": 0, "refused": 0}


class Budget(grpclimits.AnswerBudget):
    def _refusal(self, peer, size):
        why = super()._refusal(peer, size)
        counts["refused"] += why is not None
        return why


budget = Budget.for_messages(MAX_MESSAGE)


async def big(request, context):
    counts["big"] += 1
    return b"x" * int(request)


async def block(request, context):
    counts["block"] += 1
    try:
        await asyncio.sleep(3600)
    finally:
        counts["block"] -= 1
    return b""


async def stats(request, context):
    return json.dumps(dict(counts, held=budget.held)).encode()


async def main():
    server = grpc.aio.server(options=grpclimits.server_options(MAX_MESSAGE),
                             maximum_concurrent_rpcs=grpclimits.maximum_concurrent_rpcs(),
                             interceptors=[budget])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {
        "Big": grpc.unary_unary_rpc_method_handler(big),
        "Block": grpc.unary_unary_rpc_method_handler(block),
        "Stats": grpc.unary_unary_rpc_method_handler(stats)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print("PORT", port, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)

asyncio.run(main())
'''

MB = 1 << 20


@pytest.fixture
def server(tmp_path):
    script = tmp_path / "limits_server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), f"the server did not start: {line!r}"
        yield proc, int(line.split()[1])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def memory_mb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) // 1024
    return out


class Caller:
    """An ordinary grpc client on its own connection."""

    def __init__(self, port: int) -> None:
        # a channel argument of its own: no shared subchannel with another Caller
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("test.caller", id(self) % 2**31)])

    def call(self, method: str, request: bytes = b"", timeout: float = 5) -> bytes:
        return self.channel.unary_unary(f"/t.T/{method}")(request, timeout=timeout)

    def stats(self) -> dict[str, int]:
        return json.loads(self.call("Stats"))

    def close(self) -> None:
        self.channel.close()


# -- a raw HTTP/2 peer that never takes its answers ------------------------------------------

DATA, HEADERS, RST_STREAM, SETTINGS, PING = 0, 1, 3, 4, 6
REFUSED_STREAM = 7


def h2_frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", stream) + payload


def hpack_literal(name: bytes, value: bytes) -> bytes:
    """A header field 'literal without indexing, new name', no Huffman (lengths < 127)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


class Unread:
    """One HTTP/2 connection whose calls' answers are never consumed: no WINDOW_UPDATE ever,
    so the server may send each stream and the connection 64 KB at most. A thread reads and
    drops everything, counting RST_STREAM(REFUSED_STREAM), and acknowledges PINGs; a `deaf`
    one stops reading once it has acknowledged the server's SETTINGS."""

    def __init__(self, port: int, deaf: bool = False) -> None:
        self.deaf = deaf
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()
        self.refused = 0
        self.next_stream = 1
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(SETTINGS, 0, 0))
        self.settings = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.settings.wait(5), "no SETTINGS from the server"

    def _send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        buf = b""
        try:
            while chunk := self.sock.recv(1 << 20):
                buf += chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    end = 9 + int.from_bytes(buf[:3], "big")
                    ftype, flags, payload, buf = buf[3], buf[4], buf[9:end], buf[end:]
                    if ftype == SETTINGS and not flags & 1:
                        self._send(h2_frame(SETTINGS, 1, 0))          # ack
                        self.settings.set()
                        if self.deaf:
                            return
                    elif ftype == PING and not flags & 1:
                        self._send(h2_frame(PING, 1, 0, payload))
                    elif ftype == RST_STREAM and payload == struct.pack(">I", REFUSED_STREAM):
                        self.refused += 1
        except OSError:
            pass

    def start_calls(self, method: str, request: bytes, n: int) -> None:
        """n unary calls, 100 at a time: the server accepts calls (up to its bounds) as fast
        as its event loop takes them, and refuses those that wait too long in the core."""
        head = b"".join(hpack_literal(k, v) for k, v in [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", f"/t.T/{method}".encode()),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers")])
        body = b"\x00" + struct.pack(">I", len(request)) + request
        for start in range(0, n, 100):
            frames = []
            for _ in range(min(100, n - start)):
                s, self.next_stream = self.next_stream, self.next_stream + 2
                frames.append(h2_frame(HEADERS, 4, s, head) + h2_frame(DATA, 1, s, body))
            self._send(b"".join(frames))
            time.sleep(0.01)

    def closed_by_server(self, timeout: float) -> bool:
        """Whether the server closes the connection within `timeout` (reads what it sent)."""
        self.sock.settimeout(timeout)
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                if not self.sock.recv(1 << 20):
                    return True
        except socket.timeout:
            return False
        except OSError:               # reset
            return True
        return False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def settled(caller: Caller, key: str, timeout: float = 15) -> dict[str, int]:
    """The server's counters once `key` has not moved for a second."""
    end = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        stats = served(caller.stats)
        if stats[key] != last:
            last, since = stats[key], time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return stats
        time.sleep(0.1)
    raise AssertionError(f"{key} still moves after {timeout} s")


def served(call, attempts: int = 3):
    """An ordinary client's call, which must be answered. On a machine short of CPU, grpc
    sometimes ends a call CANCELLED under such floods, without any of these limits too: the
    call is made again then (at most `attempts` times)."""
    for attempt in range(attempts):
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED) \
                    or attempt == attempts - 1:
                raise


# -- the tests ----------------------------------------------------------------------------------

def test_unread_answers_are_bounded(server):
    """2 connections ask 1000 answers of 1 MB each and read none (~4 GB without bounds): the
    server keeps what its answer budget allows, refuses the rest (UNAVAILABLE: retry), and an
    ordinary client is served during and after. The connection that stopped reading
    altogether is closed by the server (its ping is never acknowledged)."""
    proc, port = server
    conns, calls, size = 2, 1000, MB
    caller = Caller(port)
    attackers: list[Unread] = []
    try:
        assert served(caller.stats)["big"] == 0
        base = memory_mb(proc.pid)["VmRSS"]
        t0 = time.monotonic()
        for i in range(conns):
            attackers.append(Unread(port, deaf=i == 0))
            attackers[-1].start_calls("Big", str(size).encode(), calls)
        stats = settled(caller, "big")
        peak = memory_mb(proc.pid)["VmHWM"]
        # the core refuses part of such a burst ("Too many pending requests"): most run
        assert stats["big"] >= conns * calls // 2, stats

        budget = grpclimits.AnswerBudget.for_messages(MAX_MESSAGE)
        held = min(conns * budget.per_connection, budget.total)     # answers it may keep
        assert stats["held"] <= held
        assert stats["refused"] >= stats["big"] - held // size
        # each kept answer costs ~2-3 times its size; each call ~20 KB; 64 MB for the rest
        bound = (3 * held + conns * calls * 32 * 1024) // MB + 64
        print(f"\nRSS {base} MB -> peak {peak} MB (bound +{bound} MB; unbounded it would "
              f"take > {stats['big'] * size * 2 // MB} MB), {stats}")
        assert peak - base < bound, f"the server grew by {peak - base} MB"
        assert proc.poll() is None
        assert served(lambda: caller.call("Big", b"1000")) == b"x" * 1000
        # the server pings each connection that sends requests (BDP) and every 20 s
        deadline = grpclimits.KEEPALIVE_TIMEOUT_MS / 1000 + 5
        assert attackers[0].closed_by_server(deadline - (time.monotonic() - t0)), \
            "the server kept the deaf connection"
    finally:
        for a in attackers:
            a.close()
    # the connections are gone: their calls end and the budget is free again
    wait_for(lambda: served(caller.stats)["held"] == 0, 10, "the unsent answers to go")
    assert len(served(lambda: caller.call("Big", str(size).encode()))) == size
    caller.close()


def test_concurrent_calls_are_bounded(server):
    """Blocked calls: one connection gets at most MAX_CONCURRENT_STREAMS (a raw peer going over
    has the extra streams refused), the replica at most maximum_concurrent_rpcs(); one call
    more is answered RESOURCE_EXHAUSTED; once the peers are gone, calls are served again."""
    proc, port = server
    per_conn, limit = grpclimits.MAX_CONCURRENT_STREAMS, grpclimits.maximum_concurrent_rpcs()
    caller = Caller(port)
    attackers: list[Unread] = []
    refusal, most = None, 0
    try:
        base = memory_mb(proc.pid)["VmRSS"]
        # one connection asks 50 streams more than it may have at once
        attackers.append(Unread(port))
        attackers[-1].start_calls("Block", b"", per_conn + 50)
        wait_for(lambda: attackers[0].refused, 10, "a refused stream (REFUSED_STREAM)")
        blocked = settled(caller, "block")["block"]
        assert per_conn // 2 <= blocked <= per_conn
        # more connections until the replica refuses calls
        while refusal is None and len(attackers) < 2 * limit // per_conn:
            attackers.append(Unread(port))
            attackers[-1].start_calls("Block", b"", per_conn)
            last, stable = -1, 0
            while refusal is None and stable < 3:          # until the count stops growing
                try:
                    n = served(caller.stats)["block"]
                    assert n <= limit
                    stable, last, most = (stable + 1 if n == last else 0), n, max(most, n)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    if "Concurrent RPC limit" in (e.details() or ""):
                        refusal = e
                    # else the core shed part of a burst ("Too many pending requests")
                time.sleep(0.1)
        assert refusal is not None, f"no refusal with {len(attackers)} connections"
        assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal
        assert most >= limit - 2 * per_conn, f"refused with only {most} calls waiting"
        grown = memory_mb(proc.pid)["VmHWM"] - base
        print(f"\n{len(attackers)} connections, {most} blocked calls before the refusal, "
              f"RSS +{grown} MB")
        assert grown < limit * 32 * 1024 // MB + 64       # ~20 KB per call
        assert proc.poll() is None
    finally:
        for a in attackers:
            a.close()
    wait_for(lambda: _no_blocked_calls(caller), 15, "the replica to serve calls again")
    caller.close()


def _no_blocked_calls(caller: Caller) -> bool:
    try:
        return caller.stats()["block"] == 0
    except grpc.RpcError:          # still over the limit while the calls end
        return False


def test_a_tiny_answer_is_not_held_and_leaves_no_done_callback():
    """An answer of at most UNCOUNTED_ANSWER bytes passes without a done callback (which
    grpc.aio keeps in a reference cycle with the call); a larger one is held until its call
    ends, and released then."""
    import asyncio

    class Context:
        def __init__(self) -> None:
            self.callbacks: list[Any] = []

        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

        def add_done_callback(self, fn: Any) -> None:
            self.callbacks.append(fn)

    budget = grpclimits.AnswerBudget(per_connection=1 << 20, total=4 << 20)
    for size in (0, 1, grpclimits.UNCOUNTED_ANSWER, grpclimits.UNCOUNTED_ANSWER + 1, 5000):
        async def behavior(request: Any, context: Any, size: int = size) -> bytes:
            return b"x" * size
        ctx = Context()
        got = asyncio.run(budget._counted(behavior)(None, ctx))
        assert len(got) == size
        counted = size > grpclimits.UNCOUNTED_ANSWER
        assert budget.held == (size if counted else 0) and len(ctx.callbacks) == counted
        for fn in ctx.callbacks:
            fn(ctx)
        assert budget.held == 0 and budget.by_peer == {}
