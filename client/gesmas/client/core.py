"""What the synchronous client and the asyncio client (``gesmas.aio``) share, without I/O:
where a call goes (``Routing``), when it is retried and after what pause (``Attempts``), how a
failed RPC is classified (``classify``), and the exactly-once bookkeeping of a session's
sequence numbers (``Sequencer``); the session's keep-alives and lease are in
``gesmas.client.session``. Each client does its own waiting (``time.sleep`` or ``asyncio.sleep``),
its own clock readings and its own RPCs; the rules are here, once, and take the time as an
argument. See the module docstring of ``gesmas.client.client`` for the rules themselves
("Routing", "Retries", "Sessions").
"""
from __future__ import annotations

import os
import threading
from typing import Any

import grpc

from gesmas.client.errors import (
    ERROR_METADATA_KEY,
    GesmasError,
    Unauthenticated,
    Unavailable,
    error_from_rpc,
)
from gesmas.client.security import Login

__all__ = ["Attempts", "CONSISTENCIES", "Failure", "Routing", "Seen", "Sequencer", "classify",
           "classify_error", "consistency_setting", "read_options"]

BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
#: gRPC deadline of each attempt of a call that never waits (sessions, admin RPCs).
RPC_TIMEOUT = 10.0
#: RPCs whose answer is a stream of messages: read whole within the attempt, so that a
#: failure midway is retried like any failed call (Client._attempt)
STREAMED = frozenset({"Backup"})
#: An attempt that lasted this long before failing had reached a replica: the failure
#: starts a new retry period instead of counting against the current one.
ATTACHED = 3.0
#: A replica that gave no answer within an attempt's deadline is *unresponsive* (hung,
#: paused, cut off) for this long: hints naming it are not followed and calls go elsewhere
#: first, so that followers that still name a hung leader do not send the client back to it.
SUSPECT_FOR = 2.0
#: A client that has never reached the cluster gives up once every address has been found
#: unreachable (refused, unknown host, a TLS mismatch) for this long, instead of retrying for
#: its whole retry_timeout: a wrong address or a cluster that is not up is said at once.
UNREACHABLE_FOR = 1.0

# Failures without an ErrorDetail that mean "the call may not have reached a working
# replica": safe to resend (same seq for Invoke).
TRANSPORT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # our own deadline: the replica hung
    grpc.StatusCode.CANCELLED,  # the server shut down ("Cancelling all calls")
}


class Failure(Exception):
    """An attempt failed in a way that may be retried elsewhere. ``unresponsive``: the
    replica gave no answer in time (our deadline passed, or gRPC's keepalive ping went
    unanswered), as opposed to answering or refusing the connection. ``unreachable``: no
    connection could be made at all (refused, unknown host, TLS on one side only)."""

    def __init__(self, error: GesmasError, unresponsive: bool = False,
                 unreachable: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.unresponsive = unresponsive
        self.unreachable = unreachable


#: gRPC's words for a connection that could not be made -> what to tell the user.
_UNREACHABLE = (
    ("connection refused", "connection refused"),
    ("domain name not found", "unknown host name"),
    ("dns resolution failed", "unknown host name"),
    ("errors resolving", "cannot resolve the host name"),
    ("socket closed", "the connection was closed while connecting (a TLS port? give its CA: "
                      "Client(tls=TLS(ca=...)), GESMAS_TLS_CA or --tls-ca)"),
    ("wrong_version_number", "the TLS handshake failed (a port without TLS? then drop the "
                             "TLS settings)"),
    ("certificate_verify_failed", "its certificate is not signed by the CA given"),
    ("handshake failed", "the TLS handshake failed"),
)


def unreachable(details: str) -> str | None:
    """Why a connection could not be made, from a failed RPC's details, or None when the
    failure was something else (a replica that answered, hung, or went away mid-call)."""
    text = details.lower()
    if "failed to connect" not in text and "resolv" not in text and "dns" not in text:
        return None
    for words, why in _UNREACHABLE:
        if words in text:
            return why
    return None


def unresponsive(e: grpc.RpcError) -> bool:
    """The failed RPC got no answer: our deadline passed, or a keepalive ping did not."""
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    details = (e.details() if callable(getattr(e, "details", None)) else "") or ""
    return e.code() == grpc.StatusCode.UNAVAILABLE and (
        "keepalive" in details.lower() or "ping timeout" in details.lower())


def has_detail(e: grpc.RpcError) -> bool:
    trailing = getattr(e, "trailing_metadata", None)
    metadata = trailing() if callable(trailing) else None
    return any(key == ERROR_METADATA_KEY for key, _ in metadata or ())


def classify(e: grpc.RpcError, address: str, login: Login,
             metadata: tuple[tuple[str, str], ...]) -> BaseException:
    """What a failed attempt raises: ``Failure`` (retry elsewhere) or the GesmasError."""
    error = error_from_rpc(e)
    if has_detail(e):
        return classify_error(error, address, login, metadata)
    if e.code() in TRANSPORT:
        why = unreachable(error.message) if e.code() == grpc.StatusCode.UNAVAILABLE else None
        return Failure(Unavailable(f"{address}: {why or error.message}"), unresponsive(e),
                       unreachable=why is not None)
    return error


def classify_error(error: GesmasError, address: str, login: Login,
                   metadata: tuple[tuple[str, str], ...]) -> BaseException:
    """``classify`` for an error the server stated (an ErrorDetail)."""
    if isinstance(error, Unavailable):
        return Failure(error)
    if isinstance(error, Unauthenticated) and metadata and login.refused(metadata):
        # an expired or revoked token: log in again (the call did not run)
        return Failure(Unavailable(f"{address}: {error.message}"))
    return error


class Routing:
    """The cluster's client addresses, the leader as last learned, the address calls try
    first, and the replicas that recently gave no answer (``suspect``). Thread-safe.

    A suspect is skipped while it lasts (``SUSPECT_FOR`` seconds): a hint naming it is not
    followed (the followers of a hung leader name it until they elect another), and the
    round-robin passes over it unless every replica is suspect. An answer clears it."""

    def __init__(self, addresses: list[str], route_leader: bool) -> None:
        self.addresses = addresses
        self.preferred = 0
        self.leader: str | None = None
        self.route_leader = route_leader
        self.lock = threading.Lock()
        self._suspects: dict[str, float] = {}     # address -> suspected until (monotonic)
        self.reached = False                      # whether any replica ever answered

    def learn_leader(self, address: str) -> None:
        """Note the leader's address (with ``lock`` held), adding it to the list if the
        cluster list lacked it."""
        if address not in self.addresses:
            self.addresses.append(address)
        self.leader = address

    def suspect(self, address: str, now: float) -> None:
        """``address`` gave no answer in time."""
        with self.lock:
            self._suspects[address] = now + SUSPECT_FOR
            if self.leader == address:
                self.leader = None

    def answered(self, address: str) -> None:
        with self.lock:
            self._suspects.pop(address, None)
            self.reached = True

    def suspected(self, address: str, now: float) -> bool:
        """Whether ``address`` is a suspect now (with ``lock`` held)."""
        until = self._suspects.get(address)
        if until is None:
            return False
        if now >= until:
            del self._suspects[address]
            return False
        return True

    def _after(self, address: str, now: float) -> str:
        """The next address after ``address`` round-robin that is no suspect (the plain
        next one if all are)."""
        i = self.addresses.index(address) if address in self.addresses else -1
        n = len(self.addresses)
        for k in range(1, n + 1):
            candidate = self.addresses[(i + k) % n]
            if not self.suspected(candidate, now):
                return candidate
        return self.addresses[(i + 1) % n]

    def first(self, keepalive: bool, now: float) -> str:
        with self.lock:
            if (keepalive or self.route_leader) and self.leader \
                    and not self.suspected(self.leader, now):
                return self.leader
            address = self.addresses[self.preferred]
            if self.suspected(address, now):
                address = self._after(address, now)
            return address

    def next(self, failed: str, hint: str, keepalive: bool, now: float) -> str:
        """Where to go after ``failed`` answered ``hint`` (maybe empty). A hint names the
        leader; a call also makes the next address its preferred one, a keep-alive leaves the
        calls' routing alone."""
        with self.lock:
            if hint and hint != failed and not self.suspected(hint, now):
                self.learn_leader(hint)
                nxt = hint
            else:
                if failed == self.leader:
                    self.leader = None
                nxt = self._after(failed, now)
            if not keepalive:
                self.preferred = self.addresses.index(nxt)
            return nxt


class Attempts:
    """The retry schedule of one call: ``address`` to try now; after a failure, ``failed``
    moves it and returns the pause before the next attempt, or raises the error when the
    call must give up (``budget`` seconds of failing without a break; never past ``cap``).
    A failure that got no answer (``unresponsive``) makes the replica a suspect first.
    A client that never reached the cluster gives up once every address has been
    ``unreachable`` for UNREACHABLE_FOR seconds. Giving up after failures at several
    addresses raises an Unavailable that says what each of them did."""

    def __init__(self, routing: Routing, budget: float, cap: float | None,
                 keepalive: bool, now: float, max_pause: float = BACKOFF_MAX) -> None:
        self.routing = routing
        self.budget = budget
        self.cap = cap
        self.keepalive = keepalive
        self.address = routing.first(keepalive, now)
        self._period_start: float | None = None
        self._delay = BACKOFF_FIRST
        self._max_pause = max_pause
        self._followed_hint = False
        self._said: dict[str, str] = {}          # address -> what its last failure was
        self._unreachable: dict[str, float] = {}  # address -> unreachable since (monotonic)

    def succeeded(self) -> None:
        self.routing.answered(self.address)
        if self.keepalive:
            with self.routing.lock:
                self.routing.leader = self.address

    def failed(self, error: GesmasError, started: float, now: float,
               unresponsive: bool = False, unreachable: bool = False) -> float:
        address = self.address
        if unresponsive:
            self.routing.suspect(address, now)
        if self._period_start is None:
            self._period_start = started
        elif now - started >= ATTACHED:         # it had reached a replica: a new period
            self._period_start = now
        give_up = self._period_start + self.budget
        if self.cap is not None:
            give_up = min(give_up, self.cap)
        self._said[address] = error.message if error.message.startswith(address) \
            else f"{address}: {error.message}"
        if unreachable:
            self._unreachable.setdefault(address, now)
        else:
            self._unreachable.pop(address, None)
            if not unresponsive:
                self.routing.reached = True     # a replica answered, if only to refuse
        down = [self._unreachable.get(a) for a in self.routing.addresses]
        if not self.routing.reached and None not in down and \
                now - min(t for t in down if t is not None) >= UNREACHABLE_FOR:
            give_up = now                       # nothing there: say so now
        if now >= give_up:
            raise self._summary(error)
        self.address = self.routing.next(self.address, error.leader_hint, self.keepalive, now)
        hint = bool(error.leader_hint) and self.address == error.leader_hint
        if (hint and not self._followed_hint) or unresponsive:
            pause = 0.0              # a fresh hint, or away from a replica that hung: at once
        else:
            pause, self._delay = min(self._delay, give_up - now), min(self._delay * 2,
                                                                      self._max_pause)
        self._followed_hint = hint
        return pause

    def _summary(self, error: GesmasError) -> GesmasError:
        """The error to give up with: ``error``, or when several addresses failed an
        Unavailable that names each with what it did."""
        if not isinstance(error, Unavailable) or len(self._said) < 2:
            return error
        said = "; ".join(self._said[a] for a in self.routing.addresses if a in self._said)
        return Unavailable(f"no replica could serve the call: {said}", error.type,
                           error.leader_hint)


class Sequencer:
    """A session's sequence numbers: ``new`` for each call (kept across its retries), ``end``
    when the caller will never ask about it again, ``ack`` the highest n such that every call
    with seq <= n has ended. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._ack = 0
        self._ended: set[int] = set()

    def new(self) -> int:
        with self._lock:
            seq = self._next
            self._next += 1
            return seq

    def end(self, seq: int) -> None:
        with self._lock:
            self._ended.add(seq)
            while self._ack + 1 in self._ended:
                self._ack += 1
                self._ended.discard(self._ack)

    def ack(self) -> int:
        with self._lock:
            return self._ack


CONSISTENCIES = ("linearizable", "sequential")


def consistency_setting(value: str | None, default: str = "linearizable") -> str:
    """A read's consistency: ``value``, else ``default``; refused unless it is one of
    ``CONSISTENCIES``."""
    consistency = default if value is None else value
    if consistency not in CONSISTENCIES:
        raise ValueError(f"consistency must be 'linearizable' or 'sequential', not "
                         f"{consistency!r}")
    return consistency


class Seen:
    """The highest log index this client has seen in an answer (every response's
    ``applied_index``): its sequential reads ask for at least that (``read_options``), so
    that they never go back in time, whichever replica answers. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.index = 0

    def note(self, response: Any) -> None:
        index = getattr(response, "applied_index", 0)
        if index > self.index:
            with self._lock:
                if index > self.index:
                    self.index = index


MAX_PAGE = 10_000      # the largest ListObjects page a server gives
# Pages the clients ask for: a page is read under the replica's apply lock, and 1,000
# objects hold it ~2 ms where 10,000 hold it ~20 ms, a stall of every write meanwhile.
DEFAULT_PAGE = 1000


def page_size(limit: int | None, page_size: int) -> int:
    """The page size of a listing of at most `limit` objects (None: all), checked: a
    ValueError names the argument that is wrong."""
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError(f"limit must be None (all) or an integer >= 0, not {limit!r}")
    if type(page_size) is not int or not 1 <= page_size <= MAX_PAGE:
        raise ValueError(f"page_size must be an integer from 1 to {MAX_PAGE}, "
                         f"not {page_size!r}")
    return page_size


def read_options(consistency: str, seen: Seen) -> Any:
    """The ReadOptions of a read: its consistency and the highest index seen."""
    from gesmas.v1 import gesmas_pb2 as pb
    return pb.ReadOptions(
        consistency=pb.CONSISTENCY_SEQUENTIAL if consistency == "sequential"
        else pb.CONSISTENCY_LINEARIZABLE, min_index=seen.index)


def call_stream_setting(value: bool | None) -> bool:
    """Whether invocations go over Calls streams: the argument, else GESMAS_CALL_STREAM
    ("0" / "false" / "no" / "off": unary Invoke), else yes."""
    if value is not None:
        return bool(value)
    env = os.environ.get("GESMAS_CALL_STREAM", "").strip().lower()
    return env not in ("0", "false", "no", "off")


def rpc_deadline(timeout: float | None, margin: float, limit: float) -> float | None:
    """The gRPC deadline (seconds from now) of a call that may wait ``timeout`` seconds:
    ``timeout + margin``, or none beyond ``limit`` (a deadline that far away overflows
    grpc's clock and fails at once)."""
    if timeout is None or timeout + margin > limit:
        return None
    return timeout + margin


def invoke_request(class_name: str, object_name: str, method: str, args: Any, kwargs: Any,
                   timeout: float | None,
                   create: tuple[tuple[Any, ...], dict[str, Any]] | None) -> Any:
    """The InvokeRequest of a call (without session, seq, ack)."""
    from gesmas.client import convert
    from gesmas.v1 import gesmas_pb2 as pb
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
    request = pb.InvokeRequest(class_name=class_name, object_name=object_name, method=method)
    convert.fill_values(request.args, args)
    convert.fill_map(request.kwargs, kwargs)
    if create is not None:
        request.create = True
        convert.fill_values(request.ctor_args, create[0])
        convert.fill_map(request.ctor_kwargs, create[1])
    if timeout is not None:
        request.timeout = float(timeout)
    return request
