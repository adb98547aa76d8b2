"""A golden log: a fixed sequence of committed commands replays to pinned state digests.

`tests/data/golden_log.bin` holds the log (each command as its encoded bytes, the class sources
included, so the log does not change when objects/ does). `tests/data/golden.json` pins, for
that log: the state digest after every entry (as one hash over them all, and the digests at
the checkpoints and at the end), a hash of every completion, and a hash of each checkpoint blob.
`tests/data/golden_checkpoint.bin` is the first checkpoint as gesmas wrote it when the log was
made (commit named in golden.json; its hash is pinned apart, as `checkpoint_file`, since the
blobs gesmas writes now carry the kept objects' names): a replica must still restore it, to
the same state.

The log covers sessions (opened, closed and expired while calls wait, with session hooks),
auth administration and quotas, classes and objects (made, got-or-made by an invoke, deleted
while waited on, dropped by a checkpoint), waits of the standard classes (kept in place by a
checkpoint) and of an uploaded class (unwound and re-run), timeouts, a cancel, retries, queries,
the context's time and random numbers, and two checkpoints.

A change that means to change the kernel's state or answers regenerates the fixtures, and
says so in its commit: `python tests/test_golden.py --regenerate`.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from gesmas.server.kernel import Config, Kernel, codec

DATA = Path(__file__).resolve().parent / "data"
LOG = DATA / "golden_log.bin"
PINS = DATA / "golden.json"
BLOB = DATA / "golden_checkpoint.bin"
# The same checkpoint as gesmas wrote it up to 0141fe9 (format 3: the objects in one list),
# before checkpoints saved only the objects changed since the last one.
BLOB_V3 = DATA / "golden_checkpoint_v3.bin"


def _config(pins: dict) -> Config:
    return Config(reserved_classes=frozenset(pins["reserved_classes"]))


def _load() -> tuple[list[tuple[int, bytes]], dict]:
    return pickle.loads(LOG.read_bytes()), json.loads(PINS.read_text())


def _trace_hash(trace: list[tuple[int, list]]) -> str:
    h = hashlib.sha256()
    for index, out in trace:
        h.update(pickle.dumps((index, [(c.tag, c.value, c.error) for c in out]), protocol=5))
    return h.hexdigest()


def replay(log: list[tuple[int, bytes]], config: Config, kernel: Kernel | None = None
           ) -> tuple[Kernel, list, list[str], dict[int, bytes]]:
    """(kernel, trace, digest after each entry, checkpoint blob by index)."""
    k = kernel if kernel is not None else Kernel(config)
    trace, digests, blobs = [], [], {}
    for index, raw in log:
        out = k.apply(index, raw)
        trace.append((index, out))
        digests.append(k.state_digest())     # also while an object holds a lambda
        if k.checkpoint_index == index and k.checkpoint_blob is not None:
            blobs[index] = k.checkpoint_blob
    return k, trace, digests, blobs


def test_the_golden_log_replays_to_the_pinned_digests():
    log, pins = _load()
    k, trace, digests, blobs = replay(log, _config(pins))
    assert _trace_hash(trace) == pins["trace"]
    at = {index: d for (index, _), d in zip(log, digests)}
    for index, digest in pins["digests"].items():
        assert at[int(index)] == digest, f"state digest after entry {index}"
    assert hashlib.sha256("".join(digests).encode()).hexdigest() == pins["all_digests"]
    assert k.state_digest(volatile=False) == pins["digest_not_volatile"]
    assert sorted(blobs) == pins["checkpoints"]
    for index, blob in blobs.items():        # the checkpoints are written byte for byte alike
        assert hashlib.sha256(blob).hexdigest() == pins["blobs"][str(index)]


def test_a_checkpoint_written_when_the_log_was_made_still_restores():
    log, pins = _load()
    first = pins["checkpoints"][0]
    blob = BLOB.read_bytes()
    assert hashlib.sha256(blob).hexdigest() == pins["checkpoint_file"]
    k = Kernel.restore(blob, _config(pins))
    assert k.index == first
    assert k.state_digest() == pins["digests"][str(first)]
    _, trace, digests, _ = replay([(i, raw) for i, raw in log if i > first], _config(pins),
                                  kernel=k)
    assert digests[-1] == pins["digests"][str(log[-1][0])]
    _, live, _, _ = replay(log, _config(pins))      # the restored replica answers the same
    assert _trace_hash(trace) == _trace_hash([(i, out) for i, out in live if i > first])


def test_a_format_3_checkpoint_restores_to_the_state_and_bytes_of_format_4():
    """A replica that loads the checkpoint an earlier gesmas wrote is the replica that loads
    today's: the same state, and from then on the same answers and checkpoint bytes (its
    objects' frames are made as format 4 writes them, not pickled again)."""
    log, pins = _load()
    first, second = pins["checkpoints"][:2]
    old = BLOB_V3.read_bytes()
    k3, k4 = Kernel.restore(old, _config(pins)), Kernel.restore(BLOB.read_bytes(), _config(pins))
    assert k3.state_digest() == k4.state_digest() == pins["digests"][str(first)]
    rest = [(i, raw) for i, raw in log if i > first]
    _, trace3, digests3, blobs3 = replay(rest, _config(pins), kernel=k3)
    _, trace4, digests4, blobs4 = replay(rest, _config(pins), kernel=k4)
    assert _trace_hash(trace3) == _trace_hash(trace4) and digests3 == digests4
    assert blobs3[second] == blobs4[second]
    # and the objects' frames are those of the replica that never restarted (the sessions'
    # pickle is not: a string loaded from a checkpoint is not the interned one the live
    # replica shares, so the pickle memo differs; the state digest, memo-less, is equal)
    _, _, live_digests, live_blobs = replay(log, _config(pins))
    assert digests4[-1] == live_digests[-1]
    assert _frames(blobs4[second]) == _frames(live_blobs[second])
    assert len(_frames(blobs4[second])) >= 5


def _frames(blob: bytes) -> list[bytes]:
    """The objects' frames of a format 4 checkpoint."""
    import io
    buf = io.BytesIO(blob)
    pickle.load(buf)
    count = pickle.load(buf)[2]
    out = []
    for _ in range(count):
        start = buf.tell()
        pickle.load(buf)
        out.append(blob[start:buf.tell()])
    return out


#: The golden checkpoint's state digest (volatile=False) as gesmas computed it before
#: checkpoint command version 9 (157c1cc), hashing every object a session remembered: what a
#: backup of that state taken then carries.
DIGEST_BEFORE_V9 = "4e7cf6fd068d48cdde0fb9de2653e96a354eb9702cad518d6bff426ff792aa1f"


def test_a_backup_taken_before_command_version_9_still_restores(tmp_path):
    """The digest now hashes what a session remembers as the objects its end acts on; a
    backup taken by an earlier gesmas carries the digest of every remembered object, and
    `gesmas restore` still takes it (and still refuses a digest that is neither)."""
    from gesmas.protocol import backups
    from gesmas.server import backup
    blob = BLOB.read_bytes()
    k = Kernel.restore(blob, _config(_load()[1]))
    now = k.checkpoints.digest(volatile=False)
    assert now != DIGEST_BEFORE_V9              # its sessions remember hook-less objects
    assert k.checkpoints.digest(volatile=False, every_remembered=True) == DIGEST_BEFORE_V9
    for digest, ok in ((DIGEST_BEFORE_V9, True), (now, True), ("ab" * 32, False)):
        path = str(tmp_path / "golden.bak")
        backups.write(path, backups.header_for(
            blob, index=k.index, state_digest=digest, checkpoint_format=k.checkpoint_format,
            members=["127.0.0.1:1"], node_id="127.0.0.1:1", created=1.0), blob)
        if ok:
            assert backup.load_checked(path)[0].state_digest == digest
        else:
            with pytest.raises(backups.BadBackup, match="digest"):
                backup.load_checked(path)


def test_the_pins_do_not_depend_on_the_hash_seed():
    """Replicas run with PYTHONHASHSEED=0 (DESIGN §3.3), tests with a random one: nothing in
    the golden log's state is hashed or pickled in an order that depends on it."""
    code = ("import sys, hashlib; sys.path.insert(0, %r); import test_golden as g; "
            "log, pins = g._load(); k, trace, _, blobs = g.replay(log, g._config(pins)); "
            "print(k.state_digest(), g._trace_hash(trace), "
            "*(hashlib.sha256(blobs[i]).hexdigest() for i in sorted(blobs)))"
            % str(Path(__file__).resolve().parent))
    _, pins = _load()
    want = " ".join([pins["digests"][str(max(map(int, pins["digests"])))], pins["trace"],
                     *(pins["blobs"][str(i)] for i in pins["checkpoints"])])
    for seed in ("0", "12345"):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=seed), timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == want


# -- making the log (run once; see the module docstring) ---------------------------------------

TALLY = """
class Tally:
    _restartable = ("take",)          # claimed, but only the standard classes are trusted

    def __init__(self):
        self.gate = Semaphore(0)
        self.asked = 0

    def take(self):
        self.asked += 1               # a change before the wait: undone when interrupted
        try:
            self.gate.acquire()
        except Interrupted:
            self.asked -= 1
            raise
        return self.asked

    def give(self, n=1):
        self.gate.release(n)
"""

BOX = """
class Box:
    def __init__(self, label, size=3):
        self.label = label
        self.items = []
        self.seen = {}
        self.rolls = []
        self.ended = []
        self.slots = Semaphore(size)

    def put(self, item):
        self.slots.acquire(timeout=4)
        ctx = context()
        self.items.append((ctx.session, ctx.request, ctx.index, ctx.now(), item))
        self.seen[str(ctx.session)] = self.seen.get(str(ctx.session), 0) + 1
        return len(self.items)

    def roll(self):
        r = context().random()
        self.rolls.append(r)
        return r

    def take(self):
        if not self.items:
            raise LookupError("empty box")
        self.slots.release()
        return self.items.pop(0)[-1]

    def spoil(self):
        self.spoiled = lambda: 1      # a function: this object cannot be checkpointed

    def _on_session_end(self, session):
        self.ended.append(session)
"""


def make_log() -> tuple[list[tuple[int, bytes]], Config]:
    """The golden log, made with the test harness (whatever the kernel answers)."""
    from gesmas.objects import RESERVED_CLASSES, standard_sources
    from gesmas.server.kernel import (Cancel, Checkpoint, CloseSession, CreateObject,
                                      DeleteObject, ExpireSession, Invoke, OpenSession, Query,
                                      RegisterClass)
    from gesmas.server.kernel.auth import SYSTEM
    from gesmas.server.kernel.codec import Auth

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_harness import H

    config = Config(reserved_classes=RESERVED_CLASSES)
    h = H(config)
    h.ts = 1000.0
    for _, src in standard_sources():
        h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM))
    h.register(TALLY)
    h.register(BOX)
    h.register("class Broken:\n    def __init__(self):\n        raise ValueError('no')\n")
    for op, args in [("user_add", {"name": "alice", "hash": "h-a"}),
                     ("role_add", {"name": "q-user"}),
                     ("role_grant", {"name": "q-user", "action": "invoke", "prefix": "q"}),
                     ("user_grant", {"name": "alice", "role": "q-user"}),
                     ("user_quota", {"name": "alice", "quota": {"waiters": 5}})]:
        h.run(Auth(ts=h.ts, op=op, args=args, user=""))
    a, b, c, d = (h.open_session(ttl) for ttl in (10.0, 10.0, 20.0, 5.0))
    e = h.run(OpenSession(ts=h.ts, ttl=30.0, user="alice", secret="s-alice")).value
    for cls, name, args in [("Queue", "q", []), ("Lock", "l", []), ("Semaphore", "sem", [2]),
                            ("Counter", "cnt", [5]), ("LeaderElection", "el", []),
                            ("Tally", "t", []), ("Box", "box", ["first"]),
                            ("Box", "bad", ["spoilt"]), ("Broken", "broken", []),
                            ("Nothing", "nothing", [])]:
        h.create(cls, name, *args)
    h.run(CreateObject(ts=h.ts, class_name="Queue", name="q"))     # exists: not created
    h.run(CreateObject(ts=h.ts, class_name="Lock", name="q"))      # exists with another class

    h.ts += 1
    wait_a = h.call(a, "q", "consume")
    h.call(b, "q", "consume", timeout=5)
    h.call(c, "q", "produce", "x")
    h.call(a, "l", "acquire")
    h.call(b, "l", "acquire")
    h.call(c, "l", "acquire", timeout=3)
    h.call(d, "sem", "acquire")
    h.call(a, "t", "take")
    h.call(b, "t", "take", timeout=50)
    h.call(c, "el", "campaign", "c")
    h.call(d, "el", "campaign", "d")
    for s in (a, b, c):
        h.call(s, "box", "put", f"from {s}")
        h.call(s, "box", "roll")
    h.call(d, "box", "put", "waits")                      # the box is full: waits (timeout 4)
    h.call(a, "cnt", "add", 7)
    h.call(a, "cnt", "add", 7, seq=h.seqs[a])             # a retry: the stored result
    h.call(a, "box", "take", ack=h.seqs[a] - 1)
    h.call(b, "nope", "m")
    h.call(b, "box", "nope")
    h.call(b, "box", "put")                               # a bad call: missing argument
    h.apply(Invoke(ts=h.ts, tag=h.tag(), session=e, seq=1, name="q", method="size",
                   user="alice", secret="s-alice"))
    h.apply(Invoke(ts=h.ts, tag=h.tag(), session=e, seq=2, name="q", method="size",
                   user="alice", secret="wrong"))
    h.apply(Invoke(ts=h.ts, tag=h.tag(), session=c, seq=h.seqs[c] + 1, create=True,
                   class_name="Counter", name="made", method="increment"))
    h.seqs[c] += 1
    h.call(c, "sem", "acquire")                           # the last permit
    h.call(a, "sem", "acquire")                           # waits
    cancelled = h.call(c, "sem", "acquire")               # waits, then is withdrawn
    h.apply(Cancel(ts=h.ts, tag=h.tag(), session=c, seq=h.seqs[c], call_tag=cancelled))
    for what, arg in [("classes", None), ("class", "Tally"), ("objects", None),
                      ("sessions", None), ("digest", None), ("stats", None)]:
        h.apply(Query(ts=h.ts, tag=h.tag(), what=what, arg=arg))
    h.tick(h.ts + 3.5)                                    # c's lock wait and d's put time out
    h.call(a, "bad", "spoil")

    h.checkpoint()                                        # drops "bad"; Tally's waits re-run
    h.call(b, "bad", "take")
    h.call(c, "t", "give", 1)
    h.call(c, "q", "produce", "y")
    h.call(a, "l", "release")
    h.call(b, "box", "take")
    h.apply(CloseSession(ts=h.ts, tag=h.tag(), session=b, secret=""))   # waits on t and l end
    h.tick(h.ts + 1)
    h.apply(ExpireSession(ts=h.ts, tag=h.tag(), session=d))             # a waits on sem ...
    h.call(a, "t", "take")
    h.apply(DeleteObject(ts=h.ts, tag=h.tag(), name="t"))                # ... t's waiter ends
    h.call(c, "el", "leader")
    h.call(a, "box", "roll")
    h.create("Tally", "t")
    h.call(a, "t", "take", timeout=2)
    h.call(c, "q", "consume", timeout=100)
    f = h.open_session(3.0)
    h.call(f, "l", "acquire")

    h.checkpoint()
    h.tick(h.ts + 2.5)                                    # a's take times out
    h.call(a, "q", "produce", "z")
    h.apply(CloseSession(ts=h.ts, tag=h.tag(), session=c, secret=""))
    h.call(a, "cnt", "get")
    h.apply(Query(ts=h.ts, tag=h.tag(), what="objects"))
    assert wait_a in h.results
    return [(i, codec.encode(cmd)) for i, cmd in h.log], config


def regenerate() -> None:
    log, config = make_log()
    k, trace, digests, blobs = replay(log, config)
    first = min(blobs)
    every = {str(i): d for (i, _), d in zip(log, digests)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=DATA.parent.parent).stdout.strip()
    pins = {
        "made_by": commit,
        "reserved_classes": sorted(config.reserved_classes),
        "trace": _trace_hash(trace),
        "all_digests": hashlib.sha256("".join(digests).encode()).hexdigest(),
        "digests": {i: every[str(i)] for i in sorted({*blobs, log[len(log) // 2][0],
                                                      log[-1][0]})},
        "digest_not_volatile": k.state_digest(volatile=False),
        "checkpoints": sorted(blobs),
        "blobs": {str(i): hashlib.sha256(b).hexdigest() for i, b in blobs.items()},
        "checkpoint_file": hashlib.sha256(blobs[first]).hexdigest(),
    }
    DATA.mkdir(exist_ok=True)
    LOG.write_bytes(pickle.dumps(log, protocol=5))
    BLOB.write_bytes(blobs[first])
    PINS.write_text(json.dumps(pins, indent=1) + "\n")
    print(f"{len(log)} entries, checkpoints at {sorted(blobs)}, written to {DATA}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
    else:
        sys.exit("usage: python tests/test_golden.py --regenerate")
