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
from .replication.apply_thread import share_from_env
from .replication.catchup import snapshot_rate_from_env, snapshot_stagger_from_env


def ensure_hash_seed() -> None:
    """Re-execute this process with a fixed PYTHONHASHSEED (DESIGN §3.3): string hashing
    must be the same on every replica."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        os.execve(sys.executable,
                  [sys.executable, "-m", "gesmas.client.cli", *sys.argv[1:]], env)


#: young-generation thresholds of the collector (see tune_gc)
GC_THRESHOLDS = (20_000, 2, 10)


def tune_gc() -> None:
    """Keep the garbage collector's pauses short however large the state grows. Every pass
    stops all threads, Raft's included: a pause longer than the election timeout on the
    leader starts an election.

    - CPython's default young threshold (700) let the objects of calls in flight outlive young
      passes and start a full pass every ~1.3 s under load (bench/checkpoint_bench.py): the
      first threshold is 20,000.
    - A full pass walks every live container object: ~1 s at 10^6 (a replica holds ~4 per
      object, ~10 per waiting call). And the middle generation grew to a million objects
      while 10^5 waiting calls were made: passes of 0.6-0.8 s on every replica, and two
      elections (bench/scale_bench.py). So what survives a middle pass (objects that lived
      through at least two young passes: the state, waiting calls) is frozen out of every
      later pass (`gc.freeze`, in a callback at the end of the pass), and the middle
      generation is collected every 2 young passes: no pass walks more than the objects made
      since the last middle pass (10^5 waiting calls in-process: longest pass 775 ms ->
      66 ms, no full pass).
    - The price: a cycle of frozen objects that becomes garbage is never collected (plain
      references are still freed by reference counting). The kernel breaks its cycles when a
      wait ends (tests/test_gc.py: none left by waits granted, timed out, cancelled, expired,
      interrupted or deleted). What grpc keeps per RPC is cyclic: a replica that ran 3,000
      waiting calls, 1,000 cancelled ones, 3 s of lock traffic and 40 watchers had 4,000-
      6,000 such objects at exit (~36 per RPC alive during a middle pass, a few KB; the calls
      on a client's stream are one RPC), docs/performance.md.
      GESMAS_GC_FREEZE=0 turns the freezing off; GESMAS_GC_LEAK_REPORT=1 makes the process
      count, as it exits, the unreachable objects that freezing kept (a check of the price).
    - What a checkpoint's capture makes to keep (each saved object's copy, its size entry)
      is untracked as it is made (kernel/untracked.py), which is what freezing would do to
      it after two passes had walked it: middle passes during a capture of 36-97 ms became
      3-23 ms (in-process, 3x10^5 objects). Off with the freezing, or alone with
      GESMAS_GC_UNTRACK=0 (to compare).
    What start-up made (modules, classes: never garbage) is frozen here."""
    from .kernel import untracked
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if _switch("GESMAS_GC_FREEZE", True):
        gc.callbacks.append(_freeze_survivors)
        untracked.enable(_switch("GESMAS_GC_UNTRACK", True))
    if _switch("GESMAS_GC_LEAK_REPORT", False):
        import atexit
        atexit.register(_leak_report)


#: milliseconds a thread that wants the GIL waits for the one holding it (CPython: 5)
SWITCH_INTERVAL_MS = 1.0


def tune_switching() -> None:
    """How long a thread that wants the GIL waits for the one holding it. A call crosses
    several threads of a replica (gRPC's, Raft's tick thread, the apply thread), and while
    the apply thread is busy (a checkpoint's capture) each hand-over could wait CPython's
    5 ms: 1 ms took the calls over 100 ms while creating 10^6 objects from 117 to 20, at
    the price of slower catch-up at 10^5 (docs/performance.md). GESMAS_SWITCH_INTERVAL_MS
    sets it (5 for CPython's default)."""
    raw = os.environ.get("GESMAS_SWITCH_INTERVAL_MS", "").strip()
    try:
        ms = float(raw) if raw else SWITCH_INTERVAL_MS
    except ValueError:
        ms = float("nan")
    if not 0.01 <= ms <= 1000:               # NaN and infinities fail this too
        raise ValueError(f"GESMAS_SWITCH_INTERVAL_MS={raw!r} is not a number of milliseconds "
                         "from 0.01 to 1000")
    sys.setswitchinterval(ms / 1000)


def _switch(name: str, default: bool) -> bool:
    """An on/off environment setting: a switch on by default is off only for 0, no or
    false; one off by default is on only for 1, yes or true."""
    raw = os.environ.get(name, "").strip().lower()
    return raw not in ("0", "no", "false") if default else raw in ("1", "yes", "true")


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation", 0) >= 1:
        gc.freeze()


def _leak_report() -> None:
    """What freezing kept: unreachable objects a full pass over everything finds now."""
    import collections
    if _freeze_survivors in gc.callbacks:
        gc.callbacks.remove(_freeze_survivors)
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found = gc.collect()
    kinds = collections.Counter(type(o).__name__ for o in gc.garbage).most_common(8)
    print(f"gesmas gc leak report: {found} unreachable objects among {frozen} frozen; "
          f"{kinds}", file=sys.stderr, flush=True)
    gc.garbage.clear()
    gc.set_debug(0)


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
        tune_switching()
        share_from_env()                     # read again by the replica: refused here first
        snapshot_rate_from_env()             # likewise, by the Raft transport
        snapshot_stagger_from_env()          # and by the Raft node
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
