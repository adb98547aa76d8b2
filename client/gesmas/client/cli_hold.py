"""`gesmas lock`, `gesmas elect` and `gesmas delete`: hold a lock or a leadership while a
command runs (as `etcdctl lock NAME cmd` and `etcdctl elect` do), follow an election, delete
an object. cli.py adds the parsers (``add_commands``) and runs them.

Theory of operation
-------------------
The hold (a Lock's grant, an election's leadership) is taken in the CLI's own client
session. CMD then runs in a process group of its own, so that a signal reaches it and every
process it started, with the fencing token in its environment. The main thread waits on one
queue for three kinds of event:

- CMD exited (a thread waits for it): the hold is given back and gesmas exits with CMD's
  status (128 + N when a signal N ended it, as a shell reports it);
- a stop signal reached gesmas (SIGINT, SIGTERM, SIGHUP): the handler only puts the signal on
  the queue (``SimpleQueue.put`` may be called from a handler); the main thread forwards it to
  CMD's group and waits for CMD as before; a second one SIGKILLs the group. A Ctrl-C in a
  terminal reaches gesmas alone (CMD's group is not the terminal's foreground group), so CMD
  gets it once, from gesmas;
- the session was lost (the client's session listener, on its keep-alive thread): from that
  moment the hold is no longer sure, and the server gives it to the next waiter once it
  expires the session. CMD's group gets SIGTERM at once, SIGKILL after ``--kill-after``
  seconds, gesmas says why and exits with status 1. The fencing token is what lets the
  resource CMD works on refuse it should it still act after that.

Without CMD the hold is printed (the fencing token, the term) and kept until a stop signal
(exit 0: that is how such a hold ends) or the loss of the session (exit 1).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gesmas.client.errors import GesmasError, NotFound, SessionExpired, Timeout
from gesmas.client.session import SessionState

__all__ = ["HOLD_COMMANDS", "add_commands", "split_command"]

#: The commands that take a CMD after `--`.
HOLD_COMMANDS = ("lock", "elect")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_AFTER = 5.0              # seconds CMD has to exit on SIGTERM once the session is lost
MAX_TTL = 3600.0              # the longest session a replica grants


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """(gesmas's own arguments, CMD) of a `gesmas lock|elect ... -- CMD ARGS...` command
    line; CMD is None without a `--`. Every word after the first `--` is CMD's, options
    included, which argparse alone would not leave alone."""
    argv = list(argv)
    if argv[:1] and argv[0] in HOLD_COMMANDS and "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


class Events:
    """What the hold waits for, in arrival order: ("exit", status), ("signal", signum),
    ("lost", reason). Stop signals are recorded from installation on; with
    ``interrupt=True`` they raise KeyboardInterrupt instead (while the hold is being
    taken, so that Ctrl-C or SIGTERM leaves through the client's close)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.interrupt = True
        self._saved: dict[int, Any] = {}

    def install(self) -> Events:
        for s in STOP_SIGNALS:
            self._saved[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        for s, old in self._saved.items():
            signal.signal(s, old)
        self._saved.clear()

    def _handler(self, signum: int, frame: Any) -> None:
        if self.interrupt:
            raise KeyboardInterrupt(f"signal {signum}")
        self.queue.put(("signal", signum))

    def listener(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self.queue.put(("lost", "the session is lost"))

    def next(self) -> tuple[str, Any]:
        while True:                    # a timeout, so that signal handlers run promptly
            try:
                return self.queue.get(timeout=0.5)
            except queue.Empty:
                pass


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """CMD in a process group of its own. That group is in the background of gesmas's
    terminal, if any: reading from the terminal would stop CMD (SIGTTIN) while it holds the
    lock, so a terminal on stdin is replaced by /dev/null (EOF at once); a pipe or a file
    is passed on."""
    group: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                             else {"start_new_session": True})
    stdin = subprocess.DEVNULL if _is_terminal(0) else None
    try:
        return subprocess.Popen(cmd, env=dict(os.environ, **env), stdin=stdin, **group)
    except OSError as e:
        raise GesmasError(f"cannot run {cmd[0]!r}: {e.strerror or e}") from None


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.returncode is None:           # its pid (= its group) is not reused before
        try:                              # it is reaped
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_group(proc: subprocess.Popen[bytes], events: Events, grace: float) -> None:
    """SIGTERM CMD's group, SIGKILL it after `grace` seconds if CMD has not exited (at once
    on a stop signal meanwhile)."""
    _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.returncode is None and time.monotonic() < deadline:
        try:
            kind, _ = events.queue.get(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            continue
        if kind in ("exit", "signal"):
            break
    if proc.returncode is None:
        _signal_group(proc, signal.SIGKILL)
    proc.wait()


def hold(client: Any, what: str, printed: str, cmd: list[str] | None,
         env: dict[str, str], events: Events, kill_after: float) -> int:
    """Keep the hold that `client`'s session has just taken while CMD runs (or, without
    CMD, until a stop signal); return gesmas's exit status. The caller gives the hold back
    on return; on the loss of the session there is nothing left to give back."""
    client.add_listener(events.listener)
    events.interrupt = False
    if client.state is SessionState.LOST:        # lost before the listener was there
        events.queue.put(("lost", "the session is lost"))
    proc = None
    if cmd is not None:
        proc = _spawn(cmd, env)
        threading.Thread(target=lambda: events.queue.put(("exit", proc.wait())),
                         name="gesmas-cmd-wait", daemon=True).start()
    else:
        print(printed, flush=True)
    forwarded = 0
    while True:
        kind, value = events.next()
        if kind == "exit":
            return exit_status(value)
        if kind == "signal":
            if proc is None:
                return 0
            # the first is passed on; a second one kills at once (as `gesmas up` does)
            _signal_group(proc, value if not forwarded else signal.SIGKILL)
            forwarded += 1
        elif kind == "lost":
            lease = client.lease
            reason = (lease.reason if lease is not None else None) or value
            if proc is None:
                print(f"gesmas: {what} is no longer held: {reason}", file=sys.stderr)
                return 1
            print(f"gesmas: {what} is no longer held ({reason}): stopping the command "
                  f"(SIGTERM, SIGKILL after {kill_after:g} s)", file=sys.stderr, flush=True)
            _stop_group(proc, events, kill_after)
            return 1


# --- the commands --------------------------------------------------------------------------


class Commands:
    """The commands, with what cli.py gives them: how it makes a client from the parsed
    arguments, and its usage-error class (exit status 2)."""

    def __init__(self, make_client: Callable[..., Any], usage: type[Exception]) -> None:
        self.make_client = make_client
        self.usage = usage

    def _check(self, args: argparse.Namespace) -> None:
        if args.extra:
            raise self.usage(f"put -- before the command to run: gesmas {args.command} "
                             f"... -- {' '.join(args.extra)}")
        if args.cmd == []:
            raise self.usage("-- but no command after it")
        if not 0 < args.ttl <= MAX_TTL:
            raise self.usage(f"--ttl must be more than 0 and at most {MAX_TTL:g} seconds, "
                             f"not {args.ttl:g}")

    def lock(self, args: argparse.Namespace) -> int:
        self._check(args)
        events = Events().install()
        try:
            with self.make_client(args, session=True, session_ttl=args.ttl) as c:
                lock = c.lock(args.name)
                try:
                    fence = lock.acquire(timeout=args.timeout)
                except Timeout:
                    raise GesmasError(f"lock {args.name!r} not acquired within "
                                      f"{args.timeout:g} s") from None
                env = {"GESMAS_LOCK_NAME": args.name, "GESMAS_LOCK_TOKEN": str(int(fence))}
                what = f"the lock {args.name!r}"
                status = hold(c, what, str(int(fence)), args.cmd, env, events,
                              args.kill_after)
                # not through the proxy, which would make the lock again had it been deleted
                _give_back(c, what, lambda: c.invoke("Lock", args.name, "release"))
                return status
        finally:
            events.uninstall()

    def elect(self, args: argparse.Namespace) -> int:
        if args.listen:
            if args.proposal is not None or args.cmd is not None or args.extra:
                raise self.usage("--listen takes no PROPOSAL and no command")
            return self.listen(args)
        if args.proposal is None:
            raise self.usage("give a PROPOSAL (the value published while this campaign "
                             "leads), or --listen")
        self._check(args)
        events = Events().install()
        try:
            with self.make_client(args, session=True, session_ttl=args.ttl) as c:
                election = c.election(args.name)
                try:
                    term = election.campaign(args.proposal, timeout=args.timeout)
                except Timeout:
                    raise GesmasError(f"not elected in {args.name!r} within "
                                      f"{args.timeout:g} s") from None
                env = {"GESMAS_ELECTION_NAME": args.name,
                       "GESMAS_ELECTION_TERM": str(int(term)),
                       "GESMAS_ELECTION_VALUE": args.proposal}
                what = f"the leadership of {args.name!r}"
                status = hold(c, what, str(int(term)), args.cmd, env, events,
                              args.kill_after)
                _give_back(c, what, lambda: c.invoke("LeaderElection", args.name, "resign"))
                return status
        finally:
            events.uninstall()

    def listen(self, args: argparse.Namespace) -> int:
        """Print the election's leader, then each change, one JSON line each ({"session",
        "value", "term"}, or null while nobody leads), until Ctrl-C."""
        events = Events().install()         # SIGTERM and SIGHUP end it as Ctrl-C does
        try:
            with self.make_client(args) as c:
                election = c.election(args.name)
                term = None
                while True:
                    seen = election.watch(term)
                    term = seen["term"]
                    print(json.dumps(seen["leader"], ensure_ascii=False), flush=True)
        except KeyboardInterrupt:
            return 0                           # how a listener is meant to end
        except NotFound as e:
            if "has no method 'watch'" not in e.message:
                raise
            raise GesmasError(f"{args.name!r} was made by a version of LeaderElection "
                              "without watch(): delete it and campaign again to follow "
                              "it") from None
        finally:
            events.uninstall()

    def delete(self, args: argparse.Namespace) -> int:
        with self.make_client(args) as c:
            c.delete_object(args.name)
        print(f"deleted {args.name}")
        return 0


def _give_back(client: Any, what: str, give_back: Callable[[], Any]) -> None:
    """Release or resign, unless the session is gone (then the server did it already). A
    failure is said, not raised: the command's status is still gesmas's, and closing the
    session (or its expiry, within the TTL) gives the hold back too."""
    if client.state is SessionState.LOST:
        return
    try:
        give_back()
    except SessionExpired:
        pass                          # lost meanwhile: its end gave the hold back
    except NotFound as e:
        print(f"gesmas: {what} was gone before the command ended ({e}): the object was "
              "deleted meanwhile", file=sys.stderr)
    except GesmasError as e:
        print(f"gesmas: could not give back {what} ({e}); closing the session gives it "
              "back, else its expiry", file=sys.stderr)


def add_commands(sub: Any, common: argparse.ArgumentParser, make_client: Callable[..., Any],
                 usage: type[Exception], seconds: Callable[[str], float]) -> None:
    """Add lock, elect and delete to the `gesmas` parser (`seconds`: how cli.py reads a
    number of seconds)."""
    run = Commands(make_client, usage)

    def holding(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
        p.add_argument("--ttl", type=seconds, default=10.0, metavar="S",
                       help="the session's time to live: how long the cluster keeps the "
                            f"{what} of a gesmas that stopped answering (default "
                            "%(default)s)")
        p.add_argument("--timeout", type=seconds, metavar="S",
                       help=f"wait at most S seconds for the {what} (default: no limit)")
        p.add_argument("--kill-after", type=seconds, default=KILL_AFTER, metavar="S",
                       help="once the session is lost, SIGKILL the command S seconds after "
                            "its SIGTERM (default %(default)s)")
        p.set_defaults(cmd=None)

    p = sub.add_parser(
        "lock", parents=[common], help="hold a lock while a command runs",
        description="Acquire the Lock NAME (made if it does not exist), then run CMD with "
                    "GESMAS_LOCK_NAME and GESMAS_LOCK_TOKEN (the fencing token) in its "
                    "environment, in a process group of its own; release the lock when it "
                    "exits and exit with its status. Ctrl-C, SIGTERM and SIGHUP are passed "
                    "on to CMD (a second one kills it). If the session is lost, CMD gets SIGTERM (then SIGKILL) and "
                    "gesmas exits with 1. Without CMD: print the token and hold the lock "
                    "until interrupted.",
        usage="gesmas lock [options] NAME [-- CMD [ARG ...]]")
    p.add_argument("name", metavar="NAME")
    holding(p, "lock")
    p.set_defaults(func=run.lock)

    p = sub.add_parser(
        "elect", parents=[common], help="lead an election while a command runs, or follow it",
        description="Campaign in the LeaderElection NAME (made if it does not exist) with "
                    "PROPOSAL as the published value; once leader, run CMD as `gesmas lock` "
                    "does (GESMAS_ELECTION_NAME, GESMAS_ELECTION_TERM: the term, a fencing "
                    "token, GESMAS_ELECTION_VALUE) and resign when it exits; without CMD, "
                    "print the term and lead until interrupted. --listen: print the leader "
                    "and every change, one JSON line each (null while nobody leads).",
        usage="gesmas elect [options] NAME PROPOSAL [-- CMD [ARG ...]]\n"
              "       gesmas elect [options] NAME --listen")
    p.add_argument("name", metavar="NAME")
    p.add_argument("proposal", metavar="PROPOSAL", nargs="?")
    holding(p, "leadership")
    p.add_argument("--listen", action="store_true",
                   help="print each leader as it changes, until Ctrl-C")
    p.set_defaults(func=run.elect)

    p = sub.add_parser("delete", parents=[common], help="delete an object",
                       description="Delete the object NAME: calls waiting on it fail with "
                                   "Aborted; a lock held in it is gone with it.")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=run.delete)
