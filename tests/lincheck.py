"""Linearizability checker for histories recorded by gesmas fault-injection tests.

A history is a list of `Op`s, one per client call: who called (`client` = session), on which
object (`key`), when the call started and returned (`call`, `ret`, one monotonic clock), what
it was (`kind`, `input`), what came back (`output`) and `status`:
  'ok'      returned `output`; took effect at one instant within [call, ret];
  'fail'    definitely took no effect (wait timeout, rejected request): dropped;
  'unknown' may or may not have taken effect (lost reply, crash, still pending at the end);
            `ret` is +inf and `output` is ignored: it takes effect after its call, or never.

Algorithm (Wing & Gong 1993, with the memoization of Lowe 2017 and Porcupine):
1. P-compositionality: linearizability is local, so the history is split by `key` and each
   object is checked alone against a sequential `Model` (init state + step function). Search
   cost is then exponential only in the concurrency seen by one object.
2. Per key, ops are sorted by call. A search node is (bitset of ops linearized so far, model
   state). An op may come next iff it is not linearized yet, its call is <= the *horizon* (the
   earliest return among the 'ok' ops not yet linearized: otherwise an op that finished before
   it began would come after it) and the model accepts it: `step(state, kind, input, output,
   client)` returns (True, new_state). An 'unknown' op reaches `step` with output `UNKNOWN`
   (accept whatever effect it would have had); it never bounds the horizon, and it is never
   required: the history is linearizable iff some path linearizes every 'ok' op, so an
   'unknown' op left out of the path is one that never took effect.
3. Iterative depth-first search (no recursion limit). Every (bitset, state) reached is
   memoized and never expanded twice: what can follow depends only on that pair. Model states
   must therefore be hashable (inputs/outputs are frozen: lists -> tuples, dicts -> items).
   Legal moves are tried by a rank the model may supply (`Model.prepare`), by default call
   order with 'unknown' ops last. Two sound reductions: an 'ok' op that is legal and can never
   change the state (a read: see `Model.blind_writes`) is taken at once without branching (if
   any linearization exists, one with the read moved here does); an 'unknown' op that would
   change nothing now is not applied now (it may still be later).
4. Model steps per key are budgeted; past the budget the verdict is 'unknown', not a hang.
   A violation's explanation shows the longest legal prefix found, the model state after it
   and the pending 'ok' ops, none of which the model accepts there.

Before searching, `Model.refute` may find a violation directly (sound, near-linear checks):
search is exponential in concurrency and in 'unknown' ops, while most real bugs (lost,
duplicated or reordered queue items, stale or lost counter updates) show up in such checks.
Queues (state: an order of items) are the hard case; `QueueModel.prepare` ranks produces in
the order consumers observed their items. Queue items should be unique per key.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import math
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping

INF = math.inf


UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()  # output of 'unknown' ops


@dataclass(frozen=True)
class Op:
    client: int
    key: str
    call: float
    ret: float | None
    kind: str
    input: tuple
    output: object
    status: str  # 'ok' | 'fail' | 'unknown'

    def __str__(self) -> str:
        res = repr(self.output) if self.status == "ok" else self.status
        ret = "inf" if self.ret is None or self.ret == INF else round(self.ret, 6)
        return (f"c{self.client} {self.kind}({', '.join(map(repr, self.input))}) -> {res} "
                f"[{round(self.call, 6)}, {ret}]")


@dataclass(frozen=True)
class Result:
    verdict: str  # 'ok' | 'violation' | 'unknown'
    key: str | None
    explanation: str


def _freeze(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((_freeze(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, set):
        return frozenset(_freeze(x) for x in v)
    return v


class Model:
    """Sequential specification: `init` state; `step` returns (legal, new_state).

    `blind_writes`: the kinds that may leave the state unchanged in one state yet change it
    in another (e.g. set(v) when the value is v). Any other 'ok' op that is legal and leaves
    the state unchanged never changes it, so it is linearized at once, without branching.
    None (the default) turns this off."""
    init: Hashable = None
    blind_writes: frozenset | None = None

    def step(self, state: Any, kind: str, input: tuple, output: Any, client: int):
        raise NotImplementedError

    def prepare(self, ops: list[Op]) -> tuple[Model, list | None]:
        """Per key, before searching (ops sorted by call): a model specialised with facts of
        this history (for sound pruning) and a rank per op (lower is tried first), or None."""
        return self, None

    def refute(self, ops: list[Op]) -> str | None:
        """A fast, sound reason why these ops cannot be linearizable, or None."""
        return None


def _is_error(output: Any) -> bool:
    """An application error recorded as output ('error', type, ...): rejected, no effect."""
    return isinstance(output, tuple) and output[:1] == ("error",)


def _no_item(output: Any) -> bool:
    return output is None or _is_error(output)


def _bad_kind(model: Model, kind: str) -> ValueError:
    return ValueError(f"{type(model).__name__}: unknown operation kind {kind!r}")


class QueueModel(Model):
    """FIFO queue; state = tuple of items. produce(item) -> None (blocks while full if a
    capacity is given); consume() -> item (blocking: linearizes only when non-empty);
    try_consume() -> item, or None when empty.

    An item is *claimed* if produced once and returned by exactly one 'ok' consume. Sound
    pruning: an 'unknown' consume cannot take a claimed item (its 'ok' consume would fail).
    Ranks: claimed items' produces go in a greedy linear extension of the
    real-time orders of their produces and of their consumes (what consumers saw, not every
    permutation); an unconsumed acknowledged item just before the first claimed item that
    was produced after it returned; an unconsumed 'unknown' produce last."""

    blind_writes = frozenset()

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.claimed: dict[Any, tuple[float, float]] = {}  # item -> its consume's interval
        self.init = ()

    def step(self, state, kind, input, output, client):
        unk, claimed = output is UNKNOWN, self.claimed
        if kind == "produce":
            if self.capacity is not None and len(state) >= self.capacity:
                return False, state
            return (unk or output is None), state + (input[0],)
        if kind not in ("consume", "try_consume"):
            raise _bad_kind(self, kind)
        if not state:
            return kind == "try_consume" and (unk or output is None), state
        if unk:
            return state[0] not in claimed, state[1:]
        return state[0] == output, state[1:]

    @staticmethod
    def _facts(ops):
        puts = {o.input[0]: (o.call, o.ret) for o in ops if o.kind == "produce"}
        made = Counter(o.input[0] for o in ops if o.kind == "produce")
        takes = defaultdict(list)
        for o in ops:
            if o.kind != "produce" and o.status == "ok" and not _no_item(o.output):
                takes[o.output].append((o.call, o.ret))
        claimed = {x: t[0] for x, t in takes.items() if len(t) == 1 and made[x] == 1}
        return puts, claimed

    def prepare(self, ops):
        puts, claimed = self._facts(ops)
        model = QueueModel(self.capacity)
        model.claimed = claimed
        order = _linear_extension({x: (puts[x], c) for x, c in claimed.items()})
        by_call = sorted(order, key=lambda x: puts[x][0])
        starts = [puts[x][0] for x in by_call]
        first_after = [(INF, 0)] * (len(by_call) + 1)  # suffix minima of ranks
        for i in range(len(by_call) - 1, -1, -1):
            first_after[i] = min(first_after[i + 1], order[by_call[i]])
        ranks = []
        for o in ops:
            if o.kind != "produce":
                ranks.append((o.call, -1))
            elif o.input[0] in order:
                ranks.append(order[o.input[0]])
            elif o.status == "ok":
                t, pos = first_after[bisect.bisect_right(starts, o.ret)]
                ranks.append((t, pos - 0.5))
            else:
                ranks.append((INF, 0))
        return model, ranks

    def refute(self, ops):
        """Duplicates, phantoms and consumes before produces (`_queue_problems`), then a sweep
        for an item `a` surely in the queue throughout some interval that needs it gone:
        produced before `b` yet `b` consumed before `a`'s consume began (or `a` is never
        consumed and no 'unknown' consume could have taken it), or a try_consume found the
        queue empty meanwhile."""
        problems = _queue_problems(ops)
        if problems:
            return problems[0]
        puts, held = self._facts(ops)
        if not any(o.kind != "produce" and o.status == "unknown" for o in ops):
            taken = {o.output for o in ops if o.kind != "produce" and o.status == "ok"}  # all
            made = Counter(o.input[0] for o in ops if o.kind == "produce")
            held.update({o.input[0]: (INF, INF) for o in ops if o.kind == "produce" and
                         o.status == "ok" and made[o.input[0]] == 1 and o.input[0] not in taken})
        probes = [(puts[x][0], c[1], False, x) for x, c in held.items() if c[0] < INF]
        probes += [(o.call, o.ret, True, o) for o in ops if o.kind == "try_consume"
                   and o.status == "ok" and o.output is None]
        by_ret = sorted(held, key=lambda x: puts[x][1])
        j, late = 0, None  # late: of the items put before the probe, the one taken last
        for start, end, empty, what in sorted(probes, key=lambda p: p[0]):
            while j < len(by_ret) and puts[by_ret[j]][1] < start:
                if late is None or held[by_ret[j]][0] > held[late][0]:
                    late = by_ret[j]
                j += 1
            if late is None or held[late][0] <= end:
                continue
            gone = ("was never consumed" if held[late][0] == INF else
                    f"was consumed only from {held[late][0]}")
            if empty:
                return f"{what} found the queue empty, but {late!r} {gone}, produced before"
            return (f"FIFO order: {late!r} was produced before {what!r}, which was consumed "
                    f"{held[what]}, but {late!r} {gone}")
        return None


def _linear_extension(items: dict) -> dict:
    """items: x -> ((call1, ret1), (call2, ret2)). A greedy linear extension of 'a before b
    if a's interval k ends before b's interval k starts' (k = 1, 2), earliest call2 first
    (on a cycle, which FIFO refutes anyway, the earliest call2 left). Returns x -> (running
    max of call2, position): ranks comparable with times."""
    by_call = [sorted(items, key=lambda x: items[x][k][0]) for k in (0, 1)]
    by_end = [sorted(items, key=lambda x: items[x][k][1]) for k in (0, 1)]
    ptr, end, tie = [0, 0], [0, 0], itertools.count()
    half: Counter[Any] = Counter()
    ready: list[tuple[float, int, Any]] = []
    out: dict = {}
    high = -INF
    while len(out) < len(items):
        for k in (0, 1):
            while end[k] < len(items) and by_end[k][end[k]] in out:
                end[k] += 1
            horizon = items[by_end[k][end[k]]][k][1] if end[k] < len(items) else INF
            while ptr[k] < len(items) and items[by_call[k][ptr[k]]][k][0] <= horizon:
                x = by_call[k][ptr[k]]
                ptr[k] += 1
                half[x] += 1
                if half[x] == 2:
                    heapq.heappush(ready, (items[x][1][0], next(tie), x))
        if ready:
            x = heapq.heappop(ready)[2]
        else:
            x = min((y for y in items if y not in out), key=lambda y: items[y][1][0])
            half[x] = 3
        high = max(high, items[x][1][0])
        out[x] = (high, len(out))
    return out


class LockModel(Model):
    """Mutex with fencing tokens, owned by sessions; state = (holder client | None, last
    fence). acquire() -> fence: legal when free, fence (int) > every earlier fence;
    try_acquire() -> fence, or None/False (legal only while held); release() -> None, by the
    holder only, or an ('error', ...) output, legal only from a non-holder; expire() -> None:
    the client's session ended, its lock (if held) is freed.
    An 'unknown' acquire is given the least possible fence, last + 1 (most permissive)."""
    init, blind_writes = (None, 0), frozenset({"expire"})

    def step(self, state, kind, input, output, client):
        holder, last = state
        unk = output is UNKNOWN
        if kind in ("acquire", "try_acquire"):
            if kind == "try_acquire" and (output is None or output is False):
                return holder is not None, state
            if holder is not None:
                return False, state
            if unk:
                return True, (client, last + 1)
            ok = isinstance(output, int) and not isinstance(output, bool) and output > last
            return ok, (client, output if ok else last)
        if kind == "release":
            if _is_error(output):
                return holder != client, state
            return holder == client and (unk or output is None), (None, last)
        if kind == "expire":
            return (unk or output is None), ((None if holder == client else holder), last)
        raise _bad_kind(self, kind)


class SemaphoreModel(Model):
    """Counting semaphore of `permits` permits owned by sessions; state = sorted tuple of
    holders, one entry per permit. acquire(n=1) -> None (blocking); try_acquire(n=1) -> bool;
    release(n=1) -> None, of permits the client holds (an ('error', ...) output: legal only if
    it holds fewer than n); expire() -> None frees all the client's permits."""

    blind_writes = frozenset({"expire"})

    def __init__(self, permits: int):
        self.permits = permits
        self.init = ()

    def step(self, state, kind, input, output, client):
        unk = output is UNKNOWN
        n = input[0] if input else 1
        if kind in ("acquire", "try_acquire"):
            fits = len(state) + n <= self.permits
            if kind == "try_acquire" and output is False:
                return not fits, state
            if not unk and output is not (True if kind == "try_acquire" else None):
                return False, state
            return fits, tuple(sorted(state + (client,) * n))
        if kind == "release":
            if _is_error(output):
                return state.count(client) < n, state
            if state.count(client) < n or not (unk or output is None):
                return False, state
            rest = list(state)
            for _ in range(n):
                rest.remove(client)
            return True, tuple(rest)
        if kind == "expire":
            return (unk or output is None), tuple(c for c in state if c != client)
        raise _bad_kind(self, kind)


class CounterModel(Model):
    """Integer register; state = value. add(d) -> new value; get() -> value; set(v) -> None;
    cas(expect, new) -> bool (True iff value == expect, and then value := new)."""

    blind_writes = frozenset({"set"})

    def __init__(self, initial: int = 0):
        self.init = initial

    def step(self, state, kind, input, output, client):
        unk = output is UNKNOWN
        if kind == "add":
            return (unk or output == state + input[0]), state + input[0]
        if kind == "get":
            return (unk or output == state), state
        if kind == "set":
            return (unk or output is None), input[0]
        if kind == "cas":
            hit = state == input[0]
            return (unk or output is hit), (input[1] if hit else state)
        raise _bad_kind(self, kind)

    def refute(self, ops):
        """For add/get-only histories with deltas >= 0 (searching them is exponential in the
        'unknown' adds): every value read must lie between the initial value plus the adds
        that surely came before and plus those that may have; with deltas > 0 no two adds
        can return the same value."""
        if any(o.kind not in ("add", "get") or o.kind == "add" and o.input[0] < 0 for o in ops):
            return None
        adds = [o for o in ops if o.kind == "add"]
        done = sorted((o.ret, o.input[0]) for o in adds if o.status == "ok")
        begun = sorted((o.call, o.input[0]) for o in adds)
        done_sum = list(itertools.accumulate((d for _, d in done), initial=0))
        begun_sum = list(itertools.accumulate((d for _, d in begun), initial=0))
        by_value: dict = {}
        for o in ops:
            v = o.output
            if o.status != "ok" or not isinstance(v, int) or isinstance(v, bool):
                continue
            own = o.input[0] if o.kind == "add" else 0
            low = self.init + done_sum[bisect.bisect_left(done, (o.call, -INF))] + own
            high = self.init + begun_sum[bisect.bisect_right(begun, (o.ret, INF))]
            if not low <= v <= high:
                return f"{o} read {v}, outside [{low}, {high}] given the adds around it"
            if o.kind == "add" and all(a.input[0] > 0 for a in adds):
                if v in by_value:
                    return f"{by_value[v]} and {o} both returned {v}"
                by_value[v] = o
        return None


def _normalize(op: Op) -> Op:
    if op.status not in ("ok", "unknown"):
        raise ValueError(f"bad status {op.status!r} in {op}")
    ret = INF if op.status == "unknown" or op.ret is None else op.ret
    if ret < op.call:
        raise ValueError(f"op returns before its call: {op}")
    return Op(op.client, op.key, op.call, ret, op.kind, _freeze(tuple(op.input)),
              _freeze(op.output) if op.status == "ok" else UNKNOWN, op.status)


def _check_key(ops: list[Op], model: Model, max_steps: int) -> tuple[str, str]:
    ops = sorted(ops, key=lambda o: (o.call, o.ret))
    n = len(ops)
    calls = [o.call for o in ops]
    rets = [INF if o.ret is None else o.ret for o in ops]
    unknown = [o.status == "unknown" for o in ops]
    unk_idx = [i for i in range(n) if unknown[i]]
    by_ret = sorted((i for i in range(n) if not unknown[i]), key=lambda i: rets[i])
    n_ok = len(by_ret)
    if n_ok == 0:
        return "ok", "no completed operations"
    why = model.refute(ops)
    if why:
        return "violation", why
    model, rank = (base := model).prepare(ops)
    rank = rank or [(INF, o.call) if o.status == "unknown" else (o.call,) for o in ops]
    step, budget, blind = model.step, [max_steps], model.blind_writes

    def moves(mask: int, state: Any, lo: int, lr: int):
        """Legal next moves (rank, op, new state), best first: pending 'unknown' ops called
        before `lo`, then pending ops from `lo` on with call <= horizon."""
        horizon = rets[by_ret[lr]]
        found = []
        for i in itertools.chain(itertools.takewhile(lo.__gt__, unk_idx), range(lo, n)):
            if calls[i] > horizon:
                break
            if not (mask >> i) & 1:
                budget[0] -= 1
                o = ops[i]
                legal, new = step(state, o.kind, o.input, o.output, o.client)
                if legal and new == state:
                    if unknown[i]:  # no effect now: it may still be applied later
                        continue
                    if blind is not None and o.kind not in blind:  # a read: take it now
                        return iter([(rank[i], i, new)])
                if legal:
                    found.append((rank[i], i, new))
        found.sort(key=lambda m: m[:2])
        return iter(found)

    # A frame: (bitset, state, lo = first pending 'ok' op by call, lr = the same by return,
    # #ok done, bitset of the 'unknown' ops applied, moves). Memo keys avoid the whole bitset
    # (n bits): below lo every 'ok' op is done, so (lo, bitset >> lo, unknown bits) suffice.
    upos = {i: p for p, i in enumerate(unk_idx)}
    lo = unknown.index(False)
    seen = {(lo, 0, 0, model.init)}
    stack = [(0, model.init, lo, 0, 0, 0, moves(0, model.init, lo, 0))]
    path: list[int] = []
    best: tuple[int, list[int], Any, int, int, int] | None = None
    while stack:
        mask, state, lo, lr, nok, ub, it = stack[-1]
        nxt = next(it, None)
        if budget[0] < 0:
            return "unknown", (f"search budget of {max_steps} model steps exhausted "
                               f"({n} ops, {len(seen)} states seen)")
        if nxt is None:
            if best is None or nok > best[0]:
                best = (nok, list(path), state, mask, lo, lr)
            stack.pop()
            if path:
                path.pop()
            continue
        _, i, new = nxt
        mask2, nok2 = mask | (1 << i), nok + (not unknown[i])
        if nok2 == n_ok:
            return "ok", f"linearizable ({n} ops, {len(seen)} states seen)"
        lo2, lr2, ub2 = lo, lr, (ub | (1 << upos[i]) if unknown[i] else ub)
        while unknown[lo2] or (mask2 >> lo2) & 1:
            lo2 += 1
        while (mask2 >> by_ret[lr2]) & 1:
            lr2 += 1
        key = (lo2, mask2 >> lo2, ub2, new)
        if key in seen:
            continue
        seen.add(key)
        path.append(i)
        stack.append((mask2, new, lo2, lr2, nok2, ub2, moves(mask2, new, lo2, lr2)))
    assert best is not None
    nok, path, state, mask, lo, lr = best
    lines = [f"not linearizable: the longest legal prefix found linearizes {nok} of {n_ok} "
             f"completed ops ({n} ops in all); its last steps:"]
    lines += [f"    {ops[i]}" for i in path[-8:]]
    lines.append(f"  model state then: {state!r}")
    lines.append("  none of the pending completed ops that may come next is legal there:")
    lines += [f"    {ops[i]}" for i in range(lo, n) if calls[i] <= rets[by_ret[lr]]
              and not unknown[i] and not (mask >> i) & 1]
    if model is not base:
        lines.append("  (legal per the model specialised by its prepare() for this history)")
    return "violation", "\n".join(lines)


def check(history: Iterable[Op], model: Model | Mapping[str, Model],
          max_steps: int = 1_000_000) -> Result:
    """Check every key of `history` against `model` (or a mapping key -> model); `max_steps`
    is the budget of model steps per key. Returns the first violation found, else 'unknown'
    if some key ran out of budget, else 'ok'."""
    parts: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        if op.status != "fail":
            parts[op.key].append(_normalize(op))
    undecided = None
    for key in sorted(parts, key=str):
        verdict, why = _check_key(parts[key], model[key] if isinstance(model, Mapping)
                                  else model, max_steps)
        if verdict == "violation":
            return Result("violation", key, f"key {key!r}: {why}")
        if verdict == "unknown" and undecided is None:
            undecided = Result("unknown", key, f"key {key!r}: {why}")
    return undecided or Result("ok", None, f"{len(parts)} keys linearizable")


def _queue_problems(ops: Iterable[Op], require_drained: bool = False) -> list[str]:
    acked: Counter[Any] = Counter()
    maybe: Counter[Any] = Counter()
    failed: Counter[Any] = Counter()
    consumed: Counter[Any] = Counter()
    first_call: dict[Any, float] = {}
    takes = []
    for op in ops:
        if op.kind == "produce":
            item = _freeze(op.input[0])
            {"ok": acked, "unknown": maybe, "fail": failed}[op.status][item] += 1
            if op.status != "fail":
                first_call[item] = min(first_call.get(item, INF), op.call)
        elif op.status == "ok" and not _no_item(_freeze(op.output)):
            consumed[_freeze(op.output)] += 1
            takes.append(op)
    problems = []
    for item, k in consumed.items():
        made = acked[item] + maybe[item]
        if made == 0:
            why = "its produce definitely failed" if failed[item] else "it was never produced"
            problems.append(f"item {item!r} consumed {k}x but {why}")
        elif k > made:
            problems.append(f"item {item!r} consumed {k}x but produced {made}x (duplicate)")
    for op in takes:
        if (INF if op.ret is None else op.ret) < first_call.get(_freeze(op.output), -INF):
            problems.append(f"{op} returned before any produce of its item was called")
    if require_drained:
        problems += [f"item {item!r} acknowledged {k}x but consumed {consumed[item]}x (lost)"
                     for item, k in acked.items() if consumed[item] < k]
    return problems


def check_queue_exactly_once(history: Iterable[Op], require_drained: bool = False) -> list[str]:
    """Direct queue checks per key, no search: no item consumed more often than it was
    (possibly) produced, none consumed that was never produced or whose produce definitely
    failed, none consumed before its produce was called; with `require_drained`, every
    acknowledged produce consumed. Consumes count when 'ok' and not None (try_consume empty)."""
    parts: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        if op.kind in ("produce", "consume", "try_consume"):
            parts[op.key].append(op)
    return [f"key {key!r}: {p}" for key in sorted(parts, key=str)
            for p in _queue_problems(parts[key], require_drained)]


class HistoryRecorder:
    """Thread-safe recorder. `invoke` stamps the call with time.monotonic() and returns a
    handle; complete it with `ok(handle, output)`, `fail(handle)` or `unknown(handle)`.
    Ops still pending when `history()` is taken are reported as 'unknown'."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: list[list] = []

    def invoke(self, client: int, key: str, kind: str, input: tuple = ()) -> int:
        with self._lock:
            self._ops.append([client, key, time.monotonic(), INF, kind, tuple(input), None, None])
            return len(self._ops) - 1

    def _complete(self, handle: int, status: str, output: object) -> None:
        now = time.monotonic()
        with self._lock:
            rec = self._ops[handle]
            if rec[7] is not None:
                raise ValueError(f"op {handle} already completed as {rec[7]}")
            rec[3], rec[6], rec[7] = (INF if status == "unknown" else now), output, status

    def ok(self, handle: int, output: object = None) -> None:
        self._complete(handle, "ok", output)

    def fail(self, handle: int) -> None:
        self._complete(handle, "fail", None)

    def unknown(self, handle: int) -> None:
        self._complete(handle, "unknown", None)

    def history(self) -> list[Op]:
        with self._lock:
            return [Op(c, k, t0, t1, kind, inp, out, st or "unknown")
                    for c, k, t0, t1, kind, inp, out, st in self._ops]
