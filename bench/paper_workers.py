"""bench/paper.py's clients: threads in spawned worker processes, one connection each,
started together and bounded in time."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
import random
import signal
import threading
import time
from typing import Any, Callable


from paper_common import OP_TIMEOUT
from paper_conns import connect

def _client_body(kind: str, conn: Any, slot: dict[str, Any], p: dict[str, Any],
                 start: float) -> None:
    time.sleep(max(0.0, start - time.monotonic()))
    deadline = start + p.get("seconds", 0.0)
    lat: list[float] = []
    if kind == "produce" or (kind == "mixed" and slot["role"] == "producer"):
        cap = p.get("cap", 10 ** 9)
        while slot["ops"] < cap and time.monotonic() < deadline:
            t0 = time.perf_counter()
            conn.produce(p["q"])
            lat.append((time.perf_counter() - t0) * 1e3)
            slot["ops"] += 1
    elif kind == "mixed":
        while True:
            left = deadline - time.monotonic()
            if left <= 0.02:
                break
            t0 = time.perf_counter()
            v = conn.consume(p["q"], min(1.0, left))
            if v is not None:
                lat.append((time.perf_counter() - t0) * 1e3)
                slot["ops"] += 1
    elif kind in ("read", "readmix"):
        # reads of one key (readmix: a fraction `write_frac` of the operations are writes to
        # it, chosen at random, the same sequence for a slot in every system)
        rng = random.Random(slot["idx"])
        frac = p.get("write_frac", 0.0) if kind == "readmix" else 0.0
        wlat: list[float] = []
        while time.monotonic() < deadline:
            write = frac > 0 and rng.random() < frac
            t0 = time.perf_counter()
            if write:
                conn.write(p["key"])
                wlat.append((time.perf_counter() - t0) * 1e3)
                slot["writes"] = slot.get("writes", 0) + 1
            else:
                conn.read(p["key"])
                lat.append((time.perf_counter() - t0) * 1e3)
            slot["ops"] += 1
        slot["wlat"] = wlat
    elif kind == "write":               # writes of one key (bench/paper_map.py: put)
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            conn.write(p["key"])
            lat.append((time.perf_counter() - t0) * 1e3)
            slot["ops"] += 1
    elif kind == "watch":               # bench/paper_map.py: a watcher of the fan-out
        from paper_map import watch_body
        watch_body(conn, slot, p)
    elif kind == "herd":
        slot["t_call"] = time.monotonic()
        v = conn.consume(p["q"], p["timeout"])
        if v is not None:
            slot["t_release"] = time.monotonic()
            slot["ops"] = 1
    elif kind == "barrier":
        for r in range(p["rounds"]):
            conn.barrier(p["name"], p["parties"], r, p["timeout"])
            slot["ops"] += 1
        slot["t_end"] = time.monotonic()
    elif kind == "lock":
        ivs = []
        while time.monotonic() < deadline:
            fence = conn.acquire(p["name"], OP_TIMEOUT)
            if fence is None:
                slot["errors"].append("acquire timed out")
                continue
            t_acq = time.monotonic()
            t_rel = time.monotonic()
            conn.release(p["name"])
            ivs.append((t_acq, t_rel, fence if isinstance(fence, int)
                        and not isinstance(fence, bool) else None))
            slot["ops"] += 1
        slot["intervals"] = ivs
    slot["lat"] = lat
    slot["end"] = time.monotonic()


def worker_main(wid: int, system: str, endpoints: list[str], kind: str,
                clients: list[tuple[int, str]], params: dict[str, Any], results: Any,
                go: Any, start_val: Any) -> None:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("gesmas").setLevel(logging.CRITICAL)
    try:
        slots = [{"idx": i, "role": r, "ops": 0, "errors": [], "lat": []} for i, r in clients]
        conns: list[Any] = [None] * len(slots)

        def mk(k: int) -> None:
            try:
                conns[k] = connect(system, endpoints, slots[k]["idx"], **params.get("conn", {}))
                for _ in range(params.get("warmup", 0)):    # channels, proxies, code paths
                    conns[k].read(params["key"])
            except BaseException as e:  # noqa: BLE001
                slots[k]["errors"].append(f"connect: {type(e).__name__}: {e}")
        ts = [threading.Thread(target=mk, args=(k,), daemon=True) for k in range(len(slots))]
        for t in ts:
            t.start()
        limit = time.monotonic() + 180
        for t in ts:
            t.join(timeout=max(0.1, limit - time.monotonic()))
        results.put(("ready", wid, [e for s in slots for e in s["errors"]]))
        if not go.wait(timeout=600):
            return
        start = start_val.value

        def body(k: int) -> None:
            try:
                if conns[k] is not None:
                    _client_body(kind, conns[k], slots[k], params, start)
            except BaseException as e:  # noqa: BLE001
                slots[k]["errors"].append(f"{type(e).__name__}: {str(e)[:160]}")
        ts = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(len(slots))]
        for t in ts:
            t.start()
        limit = start + params["limit"]
        for t in ts:
            t.join(timeout=max(0.1, limit - time.monotonic()))
        stuck = sum(t.is_alive() for t in ts)
        # "hold": keep the connections (sessions) open that long after the load's end, so
        # that the parent can read the servers' state before the sessions close. A load
        # with a "cap" (a pre-fill) ends when its items are in: not held to its time bound
        # (a fill of 10 items held its sessions for the whole 30 s budget).
        if "cap" not in params:
            time.sleep(max(0.0, start + params.get("seconds", 0.0) + params.get("hold", 0.0)
                           - time.monotonic()))
        results.put(("done", wid, {"slots": [dict(s) for s in slots], "stuck": stuck}))
        closers = [threading.Thread(target=c.close, daemon=True) for c in conns if c is not None]
        for t in closers:
            t.start()
        limit = time.monotonic() + 20
        for t in closers:
            t.join(timeout=max(0.1, limit - time.monotonic()))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", wid, f"{type(e).__name__}: {e}"))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)


def run_clients(system: str, endpoints: list[str], kind: str, roles: list[str],
                params: dict[str, Any], procs: int,
                on_start: Callable[[float], Any] | None = None) -> dict[str, Any]:
    """len(roles) clients as threads in up to `procs` spawned processes; common start."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    start_val = ctx.Value("d", 0.0)
    p = max(1, min(procs, len(roles)))
    per: dict[int, list[tuple[int, str]]] = {w: [] for w in range(p)}
    for i, r in enumerate(roles):
        per[i % p].append((i, r))
    ps = [ctx.Process(target=worker_main, daemon=True, name=f"paper-worker-{w}",
                      args=(w, system, endpoints, kind, per[w], params, results, go,
                            start_val)) for w in range(p)]
    for pr in ps:
        pr.start()
    errors: list[str] = []
    got: dict[str, dict[int, Any]] = {"ready": {}, "done": {}}

    def collect(kind_: str, deadline: float) -> None:
        while len(got[kind_]) < p:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers did not report {kind_!r} in time")
            try:
                m = results.get(timeout=min(1.0, left))
            except queue_mod.Empty:
                continue
            if m[0] == "error":
                errors.append(m[2])
                got["ready"].setdefault(m[1], [])
                got["done"].setdefault(m[1], {"slots": [], "stuck": 0})
            else:
                got[m[0]][m[1]] = m[2]
    extra = None
    try:
        collect("ready", time.monotonic() + 200 + len(roles))
        errors += [e for es in got["ready"].values() for e in es]
        start = time.monotonic() + 0.3
        start_val.value = start
        go.set()
        if on_start is not None:
            extra = on_start(start)
        collect("done", start + params["limit"] + 30)
    finally:
        limit = time.monotonic() + 30
        for pr in ps:
            pr.join(timeout=max(0.1, limit - time.monotonic()))
        for pr in ps:
            if pr.is_alive() and pr.pid is not None:
                os.kill(pr.pid, signal.SIGKILL)
                pr.join(timeout=5)
    slots = sorted((s for d in got["done"].values() for s in d["slots"]), key=lambda s: s["idx"])
    errors += [e for s in slots for e in s["errors"]]
    return {"start": start, "slots": slots, "errors": errors, "extra": extra,
            "stuck": sum(d["stuck"] for d in got["done"].values())}


