"""LeaderElection: one leader at a time among campaigning sessions.

- campaign(value=None): wait until this session is the leader; returns {"term", "value"}.
  Candidates are elected in arrival order. The term is the log index of the election,
  strictly increasing: use it as a fencing token.
- resign(): the leader steps down; the next candidate is elected.
- leader(): {"session", "value", "term"} of the current leader, or None.
- observe(term): long-poll: returns the leader info at once if the current term differs from
  `term`, else waits for the next change (use the call timeout to bound it).
- watch(term): observe() that also names the term of a vacancy: returns
  {"term", "leader"} (leader: what leader() gives, None while the seat is empty), so that
  a watcher can wait for the next change after a vacancy too (`gesmas elect --listen`).
- When the leader's session ends, the next candidate takes over.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore, context


class LeaderElection:
    _restartable = ("campaign", "observe", "watch")  # waits a checkpoint leaves in place
    _parked = ("campaign",)      # waits that hold no greenlet
    _readers = ('leader', 'observe', 'watch')  # read-only: served without a log entry (observe's
    # wait too: in a reader, an acquire that would wait is NotYet, run again after entries)
    def __init__(self):
        self._seat = Semaphore(1)
        self._changed = Semaphore(0)
        self._leader = None
        self._value = None
        self._term = 0

    def campaign(self, value=None):
        me = context().session
        if self._leader == me:
            return {"term": self._term, "value": self._value}
        self._seat.acquire()
        self._leader = me
        self._value = value
        self._term = context().index
        self._announce()
        return {"term": self._term, "value": value}

    def resign(self):
        if self._leader != context().session:
            raise PermissionError("this session is not the leader")
        self._step_down()
        return True

    def leader(self):
        if self._leader is None:
            return None
        return {"session": self._leader, "value": self._value, "term": self._term}

    def observe(self, term=None):
        if term == self._term:
            self._changed.acquire()
        return self.leader()

    def watch(self, term=None):
        if term == self._term:
            self._changed.acquire()
        return {"term": self._term, "leader": self.leader()}

    def _step_down(self):
        self._leader = None
        self._value = None
        successor = self._seat.waiters
        self._seat.release()              # the successor runs later and announces itself
        if not successor:                 # nobody waits: announce the vacancy
            self._term = context().index
            self._announce()

    def _announce(self):
        if self._changed.waiters:
            self._changed.release(self._changed.waiters)

    def _on_session_end(self, session):
        if self._leader == session:
            self._step_down()
