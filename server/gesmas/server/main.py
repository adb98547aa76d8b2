"""The process entry points of the server, run by the CLI (`gesmas server`, `gesmas up`)."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from typing import Any

from .config import HASH_SEED, ConfigError
from .config import load as load_config


def ensure_hash_seed() -> None:
    """Re-execute this process with a fixed PYTHONHASHSEED (DESIGN §3.3): string hashing
    must be the same on every replica."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        os.execve(sys.executable,
                  [sys.executable, "-m", "gesmas.client.cli", *sys.argv[1:]], env)


def tune_gc() -> None:
    """Keep the garbage collector's full passes rare. A full pass walks every live container
    object and stops every thread meanwhile: with 10^4 waiting calls a leader holds ~5 x 10^5
    of them and a pass took ~0.2 s. With CPython's default young threshold (700) the objects
    of calls in flight outlive young passes often enough to start a full pass every ~1.3 s
    under load (bench/checkpoint_bench.py); with 50,000 they are freed before a young pass
    sees them, and what start-up made (modules, classes: never garbage) is frozen out of
    every pass. Cyclic garbage is still collected, by young passes of up to 50,000 objects."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


def _setup_logging(node_id: int = 0, fmt: str | None = None) -> None:
    from . import logs
    logs.setup(node_id, os.environ.get("GESMAS_LOG", "WARNING"),
               fmt or os.environ.get("GESMAS_LOG_FORMAT") or "text")


def run_server(args: Any) -> int:
    """`gesmas server`: one replica in the foreground. Exit status: 0 when stopped by SIGINT
    or SIGTERM (at any moment, also while starting); 2 (with a message) for a bad
    configuration or a backup that --restore refuses; 3 when the replica stopped on purpose
    because it cannot go on with its data (the journal cannot be opened, or it can no longer
    apply the log): restarting it as it is would fail the same way; 1 for any other error
    (a port in use, ...)."""
    ensure_hash_seed()
    # SIGINT or SIGTERM before the event loop takes them over (while the imports below run)
    # is a stop request like any other, not a KeyboardInterrupt: one raised inside an import
    # guarded by a bare `except:` (pysyncobj's optional cryptography) was swallowed, and the
    # replica went on to fail with a misleading error and exit 1.
    early: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: early.append(signum))
    try:
        config = load_config(vars(args))
        _setup_logging(config.node_id, config.log_format)
    except (ConfigError, ValueError) as e:
        print(f"gesmas: {e}", file=sys.stderr)
        return 2
    restore_only = bool(getattr(args, "restore_only", False))
    if restore_only and not config.restore:
        print("gesmas: --restore-only needs --restore BACKUP", file=sys.stderr)
        return 2
    if config.restore and not early:
        from .backup import BadBackup, restore
        try:
            head = restore(config.restore, config.data_dir,
                           [config.raft_addr] + [p[0] for p in config.peers], config.fsync)
        except BadBackup as e:
            print(f"gesmas: --restore {config.restore}: {e}", file=sys.stderr)
            return 2
        if restore_only:
            print(f"restored log index {head.index} into {config.data_dir}; start the "
                  "replica without --restore")
            return 0
    os.makedirs(config.data_dir, exist_ok=True)
    from .node import Node, ReplicaFailed
    tune_gc()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if early:               # asked to stop while starting: nothing to serve
            return
        await Node(config).serve(stop)

    from .replication.journal import JournalError
    try:
        asyncio.run(main())
    except JournalError as e:
        print(f"gesmas: cannot open the journal: {e}", file=sys.stderr)
        return 3
    except ReplicaFailed as e:
        print(f"gesmas: this replica can no longer apply the log ({e}); exiting",
              file=sys.stderr)
        return 3
    return 0


def run_up(args: Any) -> int:
    """`gesmas up`: a local cluster in the foreground until Ctrl-C."""
    from .up import run_up as up
    return up(args)
