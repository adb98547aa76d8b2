"""Backups of a running cluster and new clusters started from them (README "Backup and
restore"), as etcd's `snapshot save` and `snapshot restore` do.

Taking one (the Backup RPC, `Node.backup`). The replica proposes a Checkpoint command under a
tag of its own; every replica takes that checkpoint at the entry's index K, as it takes the
periodic ones. On the replica that proposed it, `capture` runs on the apply thread right
after the kernel applied the entry, before the next one: the checkpoint's bytes are the
state at K, and the digest is hashed there, from the same state. Nothing is held but the
bytes (immutable) once the entry is applied. The checkpoint is self-contained (kernel/
checkpoint.py: a checkpoint's bytes are those of a checkpoint of everything, whatever it
reused): the registry's sources, the sessions, the auth state, every object, every waiting
call.

Restoring (`gesmas server --restore FILE`, `seed`). On its first start, each replica of the
NEW cluster checks the file (gesmas.protocol.backups), loads the checkpoint into a kernel and
compares the digest with the one the file carries, refuses a data dir that is not empty,
then writes the snapshot file a replica would have written at K: the checkpoint, no commands
after it, the new cluster's members, and the two log entries at K-1 and K as no-ops of term
0. The replica then starts as after a restart: its log continues at K+1, so session ids,
fencing tokens and everything else numbered by the log go on growing from where the old
cluster left them. Its first leader grants every session a fresh TTL (as after any leader
change): a session whose client keeps it alive (same session id and secret, now at the new
addresses) goes on, the others expire one TTL later, which ends their waiting calls and
releases what they held. The waiting calls are in the checkpoint and wait again (DESIGN §5).
"""
from __future__ import annotations

import logging
import os
import pickle
import tempfile
import time
from typing import TYPE_CHECKING, Any

from gesmas.objects import RESERVED_CLASSES
from gesmas.protocol import backups
from gesmas.protocol.backups import BadBackup, Header
from gesmas.v1 import gesmas_pb2 as pb

from .calls import CallFailed
from .kernel import Config as KernelConfig
from .kernel import Kernel, codec
from .kernel.errors import Code, Error
from .kernel.checkpoint import FORMAT as CHECKPOINT_FORMAT

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger(__name__)

CHUNK = 1 << 20             # bytes of checkpoint per BackupChunk
_NO_OP = b"\x01"            # pysyncobj's no-op log entry (_COMMAND_TYPE.NO_OP)


def capture(kernel: Kernel, index: int) -> tuple[bytes, str, int]:
    """On the apply thread, right after the Checkpoint entry at `index` was applied: the
    checkpoint's bytes, the digest of the state there (what Status with_digest gives) and
    the format the bytes are in."""
    blob = kernel.checkpoint_blob
    if kernel.checkpoint_index != index or blob is None or kernel.checkpoint_format is None:
        raise RuntimeError(f"the checkpoint at {index} was not taken "
                           f"(last: {kernel.checkpoint_index})")
    return blob, kernel.checkpoints.digest(volatile=False), kernel.checkpoint_format


class Backups:
    """The backups this replica is taking: the tags of its Checkpoint commands in flight and
    what `capture` got for them (written on the apply thread, read on the event loop)."""

    def __init__(self) -> None:
        self._taken: dict[str, Any] = {}

    def applied(self, index: int, cmd: codec.Command, kernel: Kernel) -> None:
        """Node._applied, on the apply thread, before the command's caller is answered."""
        if type(cmd) is codec.Checkpoint and cmd.tag in self._taken:
            try:
                self._taken[cmd.tag] = capture(kernel, index)
            except Exception as e:          # answered as an error, never fails the entry
                log.exception("backup at log index %d failed", index)
                self._taken[cmd.tag] = e

    async def take(self, node: Node) -> tuple[int, bytes, str, int]:
        """Propose a Checkpoint and wait until it is applied here: (K, checkpoint, digest,
        the checkpoint's format)."""
        tag = node.new_tag()
        self._taken[tag] = None
        try:
            done, index = await node.call(codec.Checkpoint(ts=time.time(), tag=tag))
            if done.error is not None:
                raise CallFailed(done.error)
            got = self._taken[tag]
        finally:
            self._taken.pop(tag, None)
        if got is None:       # this replica loaded a snapshot past K instead of applying K
            raise CallFailed(Error(Code.UNAVAILABLE, f"the checkpoint at {index} was not "
                                   "applied here (a snapshot replaced it); retry", "NotCaptured"))
        if not isinstance(got, tuple):
            raise CallFailed(Error(Code.INTERNAL, f"the backup checkpoint at {index} could "
                                   f"not be captured: {got!r}"))
        return (index, *got)


def messages(index: int, blob: bytes, digest: str, checkpoint_format: int,
             members: list[str], node_id: str) -> list[pb.BackupChunk]:
    """What a Backup stream sends: the info and the first piece, then a piece per message.
    `checkpoint_format`: the blob's own (a backup's Checkpoint writes format 4, which every
    gesmas since 4 restores), not the newest this gesmas writes."""
    head = backups.header_for(blob, index=index, state_digest=digest,
                              checkpoint_format=checkpoint_format, members=sorted(members),
                              node_id=node_id, created=time.time())
    info = pb.BackupInfo(index=head.index, state_digest=head.state_digest, sha256=head.sha256,
                         size=head.size, checkpoint_format=head.checkpoint_format,
                         members=head.members, node_id=head.node_id, created=head.created)
    parts = [blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK)] or [b""]
    return [pb.BackupChunk(info=info, data=parts[0], applied_index=index)] + \
        [pb.BackupChunk(data=p) for p in parts[1:]]


# -- restoring -------------------------------------------------------------------------------

def load_checked(path: str) -> tuple[Header, bytes]:
    """The backup at `path`, refused (BadBackup) unless it is intact, of a checkpoint format
    this gesmas reads, and its checkpoint loads into a kernel with the digest it claims.
    Call it with the replicas' PYTHONHASHSEED (the digest depends on it, DESIGN §3.3)."""
    head, blob = backups.read(path)
    if not 1 <= head.checkpoint_format <= CHECKPOINT_FORMAT:
        raise BadBackup(f"checkpoint format {head.checkpoint_format} is not one this gesmas "
                        f"reads (1 to {CHECKPOINT_FORMAT}): restore it with a newer gesmas")
    try:
        kernel = Kernel.restore(blob, KernelConfig(reserved_classes=RESERVED_CLASSES))
    except Exception as e:
        raise BadBackup(f"the checkpoint does not load: {type(e).__name__}: {e}") from None
    if kernel.index != head.index:
        raise BadBackup(f"the checkpoint is at log index {kernel.index}, the header says "
                        f"{head.index}")
    digest = kernel.checkpoints.digest(volatile=False)
    if digest != head.state_digest and not kernel.state.hooked_touched:
        # taken by a gesmas before checkpoint command version 9, whose digest hashed every
        # object a session remembered (digests.state_digest)
        if kernel.checkpoints.digest(volatile=False, every_remembered=True) == \
                head.state_digest:
            return head, blob
    if digest != head.state_digest:
        raise BadBackup(f"the restored state's digest {digest[:16]}... is not the one the "
                        f"backup was taken with ({head.state_digest[:16]}...)")
    return head, blob


def require_empty(data_dir: str) -> None:
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        raise BadBackup(f"data dir {data_dir} is not empty: a backup is restored into the "
                        "empty data dirs of a new cluster only (start this replica without "
                        "--restore to go on from its data, or empty the directory)")


def seed(data_dir: str, head: Header, blob: bytes, members: list[str],
         fsync: bool = True) -> str:
    """Write the snapshot of a new replica of `members` (Raft addresses, this one included)
    at the backup's state into `data_dir`, which must be empty or missing. Returns the
    snapshot's path."""
    from .replication.journal import fsync_dir
    from .replication.replica import _SNAPSHOT_FORMAT, SNAPSHOT_NAME
    require_empty(data_dir)
    if not members:
        raise BadBackup("the new cluster has no members")
    os.makedirs(data_dir, exist_ok=True)
    k = head.index
    payload: dict[str, Any] = {
        "format": _SNAPSHOT_FORMAT, "last_entry": (_NO_OP, k, 0),
        "prev_entry": (_NO_OP, k - 1, 0), "cluster": sorted(members),
        "checkpoint_index": k, "checkpoint_blob": blob, "commands": [], "aborted": {},
        "checkpoint_marks": [k]}
    path = os.path.join(data_dir, SNAPSHOT_NAME)
    fd, tmp = tempfile.mkstemp(prefix=".restore-", dir=data_dir)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(payload, f, protocol=5)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(data_dir)
    return path


def restore(path: str, data_dir: str, members: list[str], fsync: bool = True) -> Header:
    """`gesmas server --restore`: check the backup at `path` and seed `data_dir` with it."""
    require_empty(data_dir)                  # before the costly load
    head, blob = load_checked(path)
    seed(data_dir, head, blob, members, fsync)
    log.warning("restored backup %s (log index %d, taken on %s of %s) into %s; this cluster's "
                "members: %s", path, head.index, head.node_id, ", ".join(head.members),
                data_dir, ", ".join(sorted(members)))
    return head
