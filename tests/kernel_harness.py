"""A small driver for kernel tests: builds commands, numbers the log, collects completions.

    h = H()
    s = h.open_session()
    h.register(SRC)
    h.create("Buf", "b", 1)
    t = h.call(s, "b", "get")          # a tag; h.results[t] once it completed
    h.call(s, "b", "put", 7)
    assert h.value(t) == 7

Every command the harness applies is kept in `h.log` as (index, command), so a test can feed
the same log to another kernel (`replay`). Commands are applied as encoded bytes by default
(`H(encoded=False)` passes the dataclasses), so every kernel test also runs the codec.
"""
from __future__ import annotations

from typing import Any

from gesmas.server.kernel import (Checkpoint, Code, Completion, Config, CreateObject, Invoke,
                                  Kernel, OpenSession, RegisterClass, Tick, encode)
from gesmas.server.kernel.codec import Command


class H:
    def __init__(self, config: Config | None = None, *, kernel: Kernel | None = None,
                 encoded: bool = True) -> None:
        self.kernel = kernel if kernel is not None else Kernel(config or Config())
        self.index = self.kernel.index
        self.ts = self.kernel.now
        self.encoded = encoded
        self.defer = True                # checkpoint()'s defaults
        self.apart = True
        self.listed = True
        self.parts = True
        self.log: list[tuple[int, Command]] = []
        self.results: dict[str, Completion] = {}    # every completion seen, by tag
        self.trace: list[tuple[int, list[Completion]]] = []   # per index, in order
        self.seqs: dict[int, int] = {}
        self._tags = 0

    # -- raw --------------------------------------------------------------------------------

    def tag(self, prefix: str = "t") -> str:
        self._tags += 1
        return f"{prefix}{self._tags}"

    def apply(self, cmd: Command, index: int | None = None) -> dict[str, Completion]:
        """Apply `cmd` at the next index (or `index`); returns this command's completions."""
        self.index = self.index + 1 if index is None else index
        out = self.kernel.apply(self.index, encode(cmd) if self.encoded else cmd)
        self.log.append((self.index, cmd))
        self.trace.append((self.index, list(out)))
        by_tag: dict[str, Completion] = {}
        for c in out:
            assert c.tag not in by_tag, f"two completions for tag {c.tag!r} at {self.index}"
            assert c.tag not in self.results, f"tag {c.tag!r} completed twice"
            by_tag[c.tag] = c
        self.results.update(by_tag)
        return by_tag

    def run(self, cmd: Command) -> Completion:
        """Apply a command that completes at once; returns its completion."""
        if not cmd.tag:
            cmd = _with(cmd, tag=self.tag("c"))
        out = self.apply(cmd)
        assert cmd.tag in out, f"{cmd} did not complete: {out}"
        return out[cmd.tag]

    # -- helpers ----------------------------------------------------------------------------

    def open_session(self, ttl: float = 10.0) -> int:
        c = self.run(OpenSession(ts=self.ts, ttl=ttl))
        assert c.error is None, c.error
        return c.value

    def register(self, src: str) -> Completion:
        return self.run(RegisterClass(ts=self.ts, source=src))

    def create(self, cls: str, name: str, *args: Any, **kw: Any) -> Completion:
        return self.run(CreateObject(ts=self.ts, class_name=cls, name=name, args=list(args),
                                     kwargs=kw))

    def call(self, session: int, obj: str, method: str, *args: Any, seq: int | None = None,
             timeout: float | None = None, tag: str | None = None, ack: int = 0,
             kwargs: dict[str, Any] | None = None, class_name: str = "") -> str:
        """Invoke; returns the call's tag (look it up in `results`, it may be blocked)."""
        if seq is None:
            seq = self.seqs.get(session, 0) + 1
        self.seqs[session] = max(self.seqs.get(session, 0), seq)
        if tag is None:
            tag = self.tag()
        self.apply(Invoke(ts=self.ts, tag=tag, session=session, seq=seq, ack=ack,
                          class_name=class_name, name=obj, method=method, args=list(args),
                          kwargs=kwargs or {}, timeout=timeout))
        return tag

    def tick(self, ts: float) -> dict[str, Completion]:
        self.ts = max(self.ts, ts)
        return self.apply(Tick(ts=ts))

    def checkpoint(self, defer: bool | None = None, apart: bool | None = None,
                   listed: bool | None = None, parts: bool | None = None,
                   hooked: bool = False, keep_gone: bool | None = None) -> Completion:
        """A Checkpoint as the leader proposes it: its standard-class objects and its waiting
        calls saved after it, the changed objects found by its capture (kernel/capture.py)
        and the sessions' objects written in parts, unless `defer`, `apart`, `listed` and
        `parts` (or the harness's) say otherwise; `hooked`: with hooked_touched (the sessions
        keep only the objects with a session-end hook), and with it `keep_gone` unless it is
        False (version 9's rule)."""
        defer = self.defer if defer is None else defer
        apart = (self.apart and defer) if apart is None else apart
        listed = (self.listed and apart) if listed is None else listed
        parts = (self.parts and listed) if parts is None else parts
        return self.run(Checkpoint(ts=self.ts, defer=defer, calls_apart=apart,
                                   listed_after=listed, touched_in_parts=parts,
                                   hooked_touched=hooked,
                                   keep_gone=hooked if keep_gone is None else keep_gone))

    # -- reading results ----------------------------------------------------------------------

    def done(self, tag: str) -> bool:
        return tag in self.results

    def value(self, tag: str) -> Any:
        assert tag in self.results, f"{tag} has not completed"
        c = self.results[tag]
        assert c.error is None, f"{tag} failed: {c.error}"
        return c.value

    def error(self, tag: str, code: Code | None = None) -> Any:
        assert tag in self.results, f"{tag} has not completed"
        e = self.results[tag].error
        assert e is not None, f"{tag} succeeded with {self.results[tag].value!r}"
        if code is not None:
            assert e.code == code, f"{tag}: expected {code.name}, got {e}"
        return e


def _with(cmd: Command, **changes: Any) -> Command:
    import dataclasses
    return dataclasses.replace(cmd, **changes)


def replay(log: list[tuple[int, Command]], kernel: Kernel | None = None,
           encoded: bool = False) -> tuple[Kernel, list[tuple[int, list[Completion]]]]:
    """Feed `log` to `kernel` (a fresh one by default); returns it and its trace."""
    k = kernel if kernel is not None else Kernel()
    trace = []
    for index, cmd in log:
        trace.append((index, k.apply(index, encode(cmd) if encoded else cmd)))
    return k, trace
