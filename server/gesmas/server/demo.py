"""`make run`: start a local 3-node cluster and show what gesmas does, then keep it up.

The demo talks to each replica through its own client so that you can see a call made on one
replica being answered because of a call made on another.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

from gesmas.client import Client as _Client
from gesmas.client import PermissionDenied

from .cluster import LocalCluster, PortInUse
from .up import port_plan_problem, stop_on_signals


def say(text: str) -> None:
    print(text, flush=True)


def demo(cluster: LocalCluster) -> None:
    a, b, c = (m.client_addr for m in cluster.members)

    def Client(address: str) -> _Client:     # as root over TLS on a --tls cluster
        return _Client(address, **cluster.client_options())

    say("\n1. A consumer blocks server-side; a producer on another replica releases it")
    got: dict[str, object] = {}
    waiting = threading.Event()
    with Client(b) as consumer_client, Client(c) as producer_client:
        jobs = consumer_client.queue("demo-jobs")
        def consume() -> None:
            waiting.set()
            got["item"] = jobs.consume(timeout=30)
        t = threading.Thread(target=consume)
        t.start()
        waiting.wait()
        say(f"   consumer on {b}: consume() sent, waiting inside the server (no polling)")
        time.sleep(1.0)   # only so that a person can see the consumer waiting
        producer_client.queue("demo-jobs").produce(b"job-42")
        say(f"   producer on {c}: produce(b'job-42')")
        t.join()
        say(f"   consumer on {b}: got {got['item']!r}")

    say("\n2. A lock hand-off with fencing tokens")
    with Client(a) as first, Client(b) as second:
        lock1, lock2 = first.lock("demo-lock"), second.lock("demo-lock")
        fence1 = lock1.acquire()
        say(f"   client on {a}: acquired, fence {fence1}")
        handed = threading.Event()
        result: dict[str, int] = {}
        def take() -> None:
            result["fence"] = lock2.acquire()
            handed.set()
        t = threading.Thread(target=take)
        t.start()
        time.sleep(0.5)
        say(f"   client on {b}: acquire() waiting ...")
        lock1.release()
        say(f"   client on {a}: released")
        handed.wait(30)
        t.join()
        say(f"   client on {b}: acquired, fence {result['fence']} (> {fence1}: a stale holder "
            "can be refused)")
        lock2.release()

    say("\n3. A barrier of 3 parties, one per replica")
    clients = [Client(addr) for addr in (a, b, c)]
    try:
        order: list[str] = []
        def party(i: int) -> None:
            clients[i].barrier("demo-phase", parties=3).wait(timeout=30)
            order.append(f"party {i + 1}")
        threads = [threading.Thread(target=party, args=(i,)) for i in range(3)]
        for i, t in enumerate(threads):
            t.start()
            say(f"   party {i + 1} on {(a, b, c)[i]} waits at the barrier")
            time.sleep(0.3)
        for t in threads:
            t.join()
        say(f"   all released together: {', '.join(sorted(order))}")
    finally:
        for cl in clients:
            cl.close()

    if cluster.secure:
        say("\n4. Users and roles: 'worker' may use objects named jobs/..., nothing else")
        with Client(a) as root:
            root.auth("user_add", name="worker", password="worker-password")
            root.auth("role_add", name="jobs")
            for action in ("create", "invoke"):
                root.auth("role_grant", name="jobs", action=action, prefix="jobs/")
            root.auth("user_grant", name="worker", role="jobs")
        with _Client(a, **cluster.client_options("worker", "worker-password")) as worker:
            worker.queue("jobs/mail").produce("hello")
            say("   worker: produce on jobs/mail: ok")
            try:
                worker.queue("demo-jobs").consume(timeout=0)
            except PermissionDenied as e:
                say(f"   worker: consume on demo-jobs: refused ({e.message})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gesmas demo on a local 3-node cluster")
    p.add_argument("--base-port", type=int, default=7100,
                   help="node i serves clients on BASE+i (default %(default)s)")
    p.add_argument("--raft-port", type=int, metavar="BASE",
                   help="node i talks Raft on BASE+i (default: --base-port + 100)")
    p.add_argument("--metrics-port", type=int, metavar="BASE",
                   help="node i serves metrics and its status page on BASE+i (default: none)")
    p.add_argument("--no-wait", action="store_true", help="stop after the demo")
    p.add_argument("--tls", action="store_true",
                   help="TLS and auth (a throw-away CA, certificates and root password)")
    args = p.parse_args(argv)
    problem = port_plan_problem(3, args.base_port, args.raft_port, args.metrics_port)
    if problem:
        p.error(problem.replace("--base-port", "--base-port (PORT)")
                .replace("--raft-port", "--raft-port (RAFT_PORT)")
                .replace("--metrics-port", "--metrics-port (METRICS_PORT)"))
    stop_on_signals()
    cluster = LocalCluster(nodes=3, base_port=args.base_port, raft_base=args.raft_port,
                           metrics_base=args.metrics_port, secure=args.tls)
    say("starting 3 gesmas replicas on 127.0.0.1 ...")
    try:
        try:
            cluster.start()
        except PortInUse as e:
            print(f"demo: {e}: stop what uses it, or choose other ports: make run PORT=... "
                  "RAFT_PORT=... METRICS_PORT=...", file=sys.stderr)
            return 1
        for m in cluster.members:
            metrics = f", metrics http://{m.metrics_addr}/metrics" if m.metrics_addr else ""
            say(f"  node {m.node_id}: clients {m.client_addr}, raft {m.raft_addr}{metrics}")
        demo(cluster)
        if args.no_wait:
            return 0
        env = "".join(f"  export {k}={v}\n" for k, v in cluster.client_env().items())
        say(f"\nThe cluster stays up. Try:\n{env}"
            "  .venv/bin/gesmas status\n"
            "  .venv/bin/gesmas call Counter hits add 5 --create '[]'\n"
            "Ctrl-C stops every node.")
        while all(m.proc is not None and m.proc.poll() is None for m in cluster.members):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        say("\nstopping ...")
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
