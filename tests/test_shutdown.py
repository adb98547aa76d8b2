"""A normal stop of `gesmas server` (issue 26, point 16): SIGINT to a replica that holds
blocked calls, on Calls streams and as unary Invokes, and to its runaway watchdog (a Ctrl-C
reaches the whole process group). The replica exits 0 with nothing at ERROR and no traceback
in its log (before, grpc logged each call it cancelled after its grace as an unhandled
CancelledError, and the watchdog died of KeyboardInterrupt); its callers are answered
UNAVAILABLE "Stopping", retry on the other replicas and get their items there, once each;
so do its readers waiting for a change (no log entry: local waits of the replica)."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from gesmas.client import Client
from gesmas.server.cluster import LocalCluster, Member

from test_up_signals import processes

pytestmark = pytest.mark.cluster

CONSUMERS = 3          # per kind of client (Calls stream, unary Invoke)

# What grpc.aio prints itself (traceback.print_exc, beside its log record, which
# gesmas.server.logs makes DEBUG) for a call cancelled by its client before its servicer ran:
# a client failing over may end a Calls stream it has just opened here. No code of ours ran.
CANCELLED_BEFORE_START = re.compile(
    r'Traceback \(most recent call last\):\n  File "[^"\n]*aio/server\.pyx\.pxi", line \d+, '
    r'in grpc\._cython\.cygrpc\._schedule_rpc_coro\nasyncio\.exceptions\.CancelledError\n')


def waiting(m: Member, n: int) -> None:
    """Wait until replica `m` counts `n` blocked calls (what its Status reports)."""
    deadline = time.monotonic() + 60
    with Client(m.client_addr, connect=False) as probe:
        while probe.status(consistency="sequential")["waiter_count"] != n:
            assert time.monotonic() < deadline, "the consumers did not all block"
            time.sleep(0.05)


def test_sigint_stops_a_replica_cleanly_and_its_waiting_callers_go_on_elsewhere():
    with LocalCluster(nodes=3, env={"GESMAS_LOG": "INFO"}) as cl:     # failed calls logged
        leader = cl.find_leader()
        # the waiting calls go to the leader first: the replica that will be stopped
        first = ",".join([leader.client_addr] + [m.client_addr for m in cl.members
                                                 if m is not leader])
        stream = Client(first)
        unary = Client(first, call_stream=False)
        got: list[object] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def consume(c: Client) -> None:
            try:
                item = c.queue("shutdown/jobs").consume(timeout=120)
                with lock:
                    got.append(item)
            except BaseException as e:
                with lock:
                    errors.append(e)
        def observe(c: Client) -> None:    # a reader waiting for a change, no log entry
            try:
                seen = c.election("shutdown/vote").observe(0, timeout=120)
                with lock:
                    observed.append(seen)
            except BaseException as e:
                with lock:
                    errors.append(e)
        observed: list[object] = []
        threads = [threading.Thread(target=consume, args=(c,), daemon=True)
                   for c in (stream, unary) for _ in range(CONSUMERS)]
        watchers = [threading.Thread(target=observe, args=(c,), daemon=True)
                    for c in (stream, unary)]
        try:
            stream.election("shutdown/vote").leader()             # made, nobody leads
            for t in watchers + threads:
                t.start()
            waiting(leader, 2 * CONSUMERS)
            watchdogs = processes(lambda st: st[1] == leader.proc.pid)
            for pid in [leader.proc.pid, *watchdogs]:
                os.kill(pid, signal.SIGINT)
            assert leader.proc.wait(60) == 0
            log = open(leader.log_path, encoding="utf-8", errors="replace").read()
            log = CANCELLED_BEFORE_START.sub("", log)
            assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
            assert " ERROR " not in log and " CRITICAL " not in log, log[-3000:]
            # every waiting caller, readers included, was answered before the server stopped
            answered = log.count("UNAVAILABLE (Stopping)")
            assert answered >= 2 * CONSUMERS + len(watchers), log[-3000:]
            with Client(",".join(m.client_addr for m in cl.members if m is not leader)) as p:
                for i in range(2 * CONSUMERS):
                    p.queue("shutdown/jobs").produce(i)
                p.election("shutdown/vote").campaign("p")
                for t in threads + watchers:
                    t.join(120)
                assert not errors, errors
                assert sorted(got) == list(range(2 * CONSUMERS))     # each item once
                assert [o["session"] for o in observed] == [p.session] * len(watchers)
        finally:
            stream.close()
            unary.close()
