"""`gesmas up`: a local cluster in the foreground, supervised (a node that exits is reported
and restarted on its data dir while the others serve), until Ctrl-C."""
from __future__ import annotations

import signal
import sys
import time
from typing import Any

from .cluster import LocalCluster


def stop_on_signals() -> None:
    """SIGTERM (and SIGINT, even where a shell started us with it ignored) end the foreground
    wait with KeyboardInterrupt, so that the nodes are stopped on every way out."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


RESTART_PAUSE = 1.0          # seconds before `gesmas up` restarts a node that exited
GIVE_UP_AFTER = 5            # restarts within GIVE_UP_WINDOW after which a node stays down
GIVE_UP_WINDOW = 60.0


def supervise(cluster: LocalCluster, poll: float = 0.5,
              stop: Any = None) -> None:
    """Keep `cluster` running: a node that exits (kill -9, a crash, a replica that stopped
    applying) is reported and restarted on its data dir while the others go on serving; a
    node that keeps dying (GIVE_UP_AFTER times in GIVE_UP_WINDOW) stays down. Returns when
    every node is down for good, or when `stop()` is true."""
    restarts: dict[int, list[float]] = {m.node_id: [] for m in cluster.members}
    down: set[int] = set()
    while stop is None or not stop():
        for m in cluster.members:
            if m.node_id in down or m.proc is None or m.proc.poll() is None:
                continue
            code = m.proc.returncode
            now = time.monotonic()
            recent = [t for t in restarts[m.node_id] if now - t < GIVE_UP_WINDOW]
            if len(recent) >= GIVE_UP_AFTER:
                down.add(m.node_id)
                print(f"node {m.node_id} exited with {code} {len(recent)} times in "
                      f"{GIVE_UP_WINDOW:g} s; leaving it down (log: {m.log_path})",
                      file=sys.stderr, flush=True)
                continue
            print(f"node {m.node_id} exited with {code}; the others keep serving; restarting "
                  f"it on {m.data_dir} (log: {m.log_path})", file=sys.stderr, flush=True)
            time.sleep(RESTART_PAUSE)
            restarts[m.node_id] = recent + [time.monotonic()]
            cluster.start_member(m)
        if len(down) == len(cluster.members):
            return
        time.sleep(poll)


def run_up(args: Any) -> int:
    """`gesmas up`: a local cluster in the foreground until Ctrl-C."""
    stop_on_signals()
    cluster = LocalCluster(nodes=args.nodes, base_port=args.base_port, data_dir=args.data_dir,
                           fsync=not getattr(args, "unsafe_no_fsync", False),
                           secure=bool(getattr(args, "tls", False)))
    print(f"starting {cluster.nodes} gesmas nodes (data in {cluster.data_dir}) ...", flush=True)
    try:
        cluster.start()
        print("cluster ready. Client addresses:", flush=True)
        for m in cluster.members:
            print(f"  node {m.node_id}: {m.client_addr}   (raft {m.raft_addr}, log {m.log_path})")
        print("\n" + "".join(f"  export {k}={v}\n" for k, v in cluster.client_env().items())
              + "\nCtrl-C stops every node.", flush=True)
        supervise(cluster)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"gesmas up: the cluster did not start: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
