"""Group, Election and SharedLock: the server side of the tooz driver (gesmas.client.tooz_driver).

Group: a tooz group. Members are named by the caller (tooz member ids), hold capabilities and
  belong to the session that joined: when that session ends its members leave. Any session
  may make a member leave (tooz lets a second coordinator with the same member id do it).
  - claim(): True the first time (create_group), then False (GroupAlreadyExist).
  - join(member, caps) / leave(member) / update(member, caps): MemberAlreadyExist,
    MemberNotJoined.
  - members() / members_caps() / member(member) / check_empty().
  - changes(version): long-poll: {"version", "members"} at once if the version differs from
    `version`, else when the membership next changes (bound it with the call timeout).
  - Group(max_bytes=48 MiB): the member ids and capabilities held (strings in UTF-8, bytes
    as they are, 8 per other item, and 200 a member for its record, as the kernel measures
    it) stay under it: a join or update past it is refused with a ValueError, and members
    can still leave. Past the kernel's 64 MiB an object takes no more calls, leaves
    included.
Election: one leader (a member id) at a time, owned by its session.
  - try_campaign(member): True if this member is (now) the leader, never waits.
  - campaign(member): waits until elected (FIFO among the waiting candidates).
  - resign(member) / leader(); the leader's session ending elects the next waiting candidate.
SharedLock: tooz's lock: exclusive or shared (readers), owned by a (session, token) pair, so two
  tooz Lock objects of one coordinator exclude each other; granted FIFO; not reentrant in
  exclusive mode, counted in shared mode; `break_()` drops every holder.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import (Interrupted, Semaphore, SessionEnded, Timeout,
                                              context)


class MemberAlreadyExist(RuntimeError):
    pass


class MemberNotJoined(RuntimeError):
    pass


class GroupNotEmpty(RuntimeError):
    pass


_MEMBER = 200       # a member's record (its dict, session, times, size), as measured


class Group:
    _restartable = ("changes",)  # waits a checkpoint leaves in place
    _readers = ('members', 'members_caps', 'member', 'check_empty', 'changes')  # read-only:
    # served without a log entry (changes' wait too: NotYet in a reader, see readers.py)
    _constructor_args = ("max_bytes",)
    def __init__(self, *, max_bytes=48 << 20):
        if type(max_bytes) is not int or not 1 <= max_bytes <= 1 << 40:
            raise ValueError(f"max_bytes must be an int from 1 to {1 << 40}, not "
                             f"{max_bytes!r:.60}")
        self.max_bytes = max_bytes
        self._claimed = False
        self._members = {}    # member -> {"caps", "session", "created", "updated", "size"}
        self._version = 0
        self._changed = Semaphore(0)
        self._bytes = 0                   # the members' sizes

    def claim(self):
        if self._claimed:
            return False
        self._claimed = True
        return True

    def join(self, member, caps=None):
        if member in self._members:
            raise MemberAlreadyExist(member)
        size = self._room([member, caps], 0) + _MEMBER
        now = context().now()
        self._members[member] = {"caps": caps, "session": context().session,
                                 "created": now, "updated": now, "size": size}
        self._bytes += size
        self._bump()
        return True

    def leave(self, member):
        if member not in self._members:
            raise MemberNotJoined(member)
        self._bytes -= self._members.pop(member)["size"]
        self._bump()
        return True

    def update(self, member, caps):
        if member not in self._members:
            raise MemberNotJoined(member)
        info = self._members[member]
        size = self._room([member, caps], info["size"]) + _MEMBER
        self._bytes += size - info["size"]
        info["caps"] = caps
        info["updated"] = context().now()
        info["size"] = size
        return True

    def members(self):
        return list(self._members)

    def members_caps(self):
        return {m: info["caps"] for m, info in self._members.items()}

    def member(self, member):
        if member not in self._members:
            raise MemberNotJoined(member)
        info = self._members[member]
        return {"capabilities": info["caps"], "created_at": info["created"],
                "updated_at": info["updated"]}

    def check_empty(self):
        if self._members:
            raise GroupNotEmpty("the group has members")
        return True

    def changes(self, version=None):
        if version == self._version:
            self._changed.acquire()
        return {"version": self._version, "members": list(self._members)}

    def _room(self, parts, freed):
        """The size of `parts` (a member id and its capabilities), refused (ValueError) if
        the members would then pass max_bytes, `freed` bytes given back first."""
        size = self._size(parts, self.max_bytes - self._bytes + freed - _MEMBER)
        if size is None:
            raise ValueError(f"the group is full: its members and capabilities would pass "
                             f"max_bytes ({self.max_bytes}); make it with a larger max_bytes")
        return size

    def _size(self, parts, room):
        """The size of the values in the list `parts` (strings in UTF-8, bytes as they are,
        8 per other item), or None past `room` (the walk stops there). About a step a part:
        the lists to walk are taken in order by index, as popping them from a stack would
        charge the stack's length each time (the dialect counts a pop as moving what follows
        it). Map, Queue and Group hold the same method: each standard class is a source of
        its own, and a source imports none of the others."""
        size = 0
        todo = [parts]
        i = 0
        while i < len(todo):
            items = todo[i]
            i += 1
            for x in items:
                t = type(x)
                if t is str:
                    size += len(x) if x.isascii() else len(x.encode("utf-8"))
                elif t is bytes:
                    size += len(x)
                else:
                    size += 8
                    if t is list:
                        todo.append(x)
                    elif t is dict:
                        todo.append(list(x.keys()))
                        todo.append(list(x.values()))
                if size > room:
                    return None
        return size

    def _bump(self):
        self._version += 1
        if self._changed.waiters:
            self._changed.release(self._changed.waiters)

    def _on_session_end(self, session):
        gone = [m for m, info in self._members.items() if info["session"] == session]
        for m in gone:
            self._bytes -= self._members.pop(m)["size"]
        if gone:
            self._bump()


class Election:
    _readers = ('leader',)  # read-only: served without a log entry

    def __init__(self):
        self._leader = None
        self._session = None
        self._waiting = []                # [member, session, Semaphore(0)], FIFO

    def try_campaign(self, member):
        if self._leader is not None:
            return self._leader == member and self._session == context().session
        self._leader = member
        self._session = context().session
        return True

    def campaign(self, member):
        if self.try_campaign(member):
            return True
        if self._leader == member:
            raise RuntimeError("this member is the leader from another session")
        entry = [member, context().session, Semaphore(0)]
        self._waiting.append(entry)
        try:
            entry[2].acquire()
        except (Timeout, SessionEnded):
            if entry in self._waiting:
                self._waiting.remove(entry)
            raise
        except Interrupted:               # a checkpoint re-runs this call: it queues again
            self._waiting.remove(entry)
            raise
        return True

    def resign(self, member):
        if self._leader != member:
            return False
        self._next()
        return True

    def leader(self):
        return self._leader

    def _next(self):
        self._leader = None
        self._session = None
        if self._waiting:
            entry = self._waiting.pop(0)
            self._leader = entry[0]
            self._session = entry[1]
            entry[2].release()

    def _on_session_end(self, session):
        self._waiting = [e for e in self._waiting if e[1] != session]
        if self._session == session:
            self._next()


class SharedLock:
    def __init__(self):
        self._exclusive = None            # [session, token] of the exclusive holder
        self._shared = []                 # [session, token, count] of each shared holder
        self._queue = []                  # [session, token, shared, Semaphore(0)], FIFO

    def acquire(self, token, shared=False, blocking=True):
        me = context().session
        if not self._queue and self._free(shared):
            self._grant(me, token, shared)
            return True
        if not blocking:
            return False
        entry = [me, token, bool(shared), Semaphore(0)]
        self._queue.append(entry)
        try:
            entry[3].acquire()
        except (Timeout, SessionEnded):
            if entry in self._queue:
                self._queue.remove(entry)
                self._pump()
            raise
        except Interrupted:               # a checkpoint re-runs every waiter in this order:
            self._queue.remove(entry)     # no grant here, or the re-run would take it twice
            raise
        return True

    def release(self, token):
        me = context().session
        if self._exclusive == [me, token]:
            self._exclusive = None
            self._pump()
            return True
        for holder in self._shared:
            if holder[0] == me and holder[1] == token:
                holder[2] -= 1
                if holder[2] == 0:
                    self._shared.remove(holder)
                    self._pump()
                return True
        return False

    def is_owner(self, token):
        me = context().session
        if self._exclusive == [me, token]:
            return True
        return any(h[0] == me and h[1] == token for h in self._shared)

    def break_(self):
        self._exclusive = None
        self._shared = []
        self._pump()
        return True

    def _free(self, shared):
        if self._exclusive is not None:
            return False
        return shared or not self._shared

    def _grant(self, session, token, shared):
        if not shared:
            self._exclusive = [session, token]
            return
        for holder in self._shared:
            if holder[0] == session and holder[1] == token:
                holder[2] += 1
                return
        self._shared.append([session, token, 1])

    def _pump(self):
        while self._queue and self._free(self._queue[0][2]):
            entry = self._queue.pop(0)
            self._grant(entry[0], entry[1], entry[2])
            entry[3].release()

    def _on_session_end(self, session):
        self._queue = [e for e in self._queue if e[0] != session]
        if self._exclusive is not None and self._exclusive[0] == session:
            self._exclusive = None
        self._shared = [h for h in self._shared if h[0] != session]
        self._pump()
