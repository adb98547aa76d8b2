"""A small threaded TCP proxy on 127.0.0.1 for partition tests (DESIGN §9).

`FaultProxy(listen_port, target_port)` forwards every connection accepted on
127.0.0.1:listen_port to 127.0.0.1:target_port, byte for byte, in both directions.

- `cut()` models a network partition of this link: from then on nothing crosses it. Bytes
  of established connections are read and dropped (the peers see silence, as with lost
  packets, not a reset); new connections are accepted and black-holed the same way.
- `heal()` ends the partition: the connections that lost bytes are closed (their streams
  have holes, as a TCP connection that timed out would be), so the peers reconnect; new
  connections are forwarded again.
- `stall()` models a congested link: nothing is read from either side until `flow()`, so
  what a peer sends piles up in its own socket's buffer (with `buffer_bytes`, the proxy's
  sockets buffer no more than that: the kernel would otherwise grow a loopback receive
  buffer to tens of MB).
- `close()` stops the proxy and closes every socket it holds.

Only loopback addresses are used; every thread is a daemon and stops on `close()`.
"""
from __future__ import annotations

import socket
import threading

__all__ = ["FaultProxy"]

_POLL = 0.2


class _Pair:
    """One proxied connection: the accepted socket and, unless black-holed, the upstream."""

    def __init__(self, down: socket.socket, up: socket.socket | None) -> None:
        self.down, self.up = down, up
        self.tainted = up is None        # lost bytes: never forwards again
        self.closed = False
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.down, self.up):
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class FaultProxy:
    def __init__(self, listen_port: int, target_port: int, name: str = "",
                 buffer_bytes: int | None = None) -> None:
        self.listen_port = listen_port
        self.buffer_bytes = buffer_bytes
        self._flowing = threading.Event()
        self._flowing.set()
        self.target_port = target_port
        self.name = name or f"{listen_port}->{target_port}"
        self._cut = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.forwarded = 0               # bytes forwarded
        self.dropped = 0                 # bytes dropped while cut

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    def start(self) -> FaultProxy:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._clamp(s)                   # inherited by the accepted sockets
        s.bind(("127.0.0.1", self.listen_port))
        s.listen(16)
        s.settimeout(_POLL)
        self._server = s
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"faultproxy-{self.name}")
        self._thread.start()
        return self

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for p in self._pairs:
                p.tainted = True

    def stall(self) -> None:
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    def _clamp(self, s: socket.socket) -> None:
        if self.buffer_bytes is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffer_bytes)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffer_bytes)

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            tainted = [p for p in self._pairs if p.tainted]
            self._pairs = [p for p in self._pairs if not p.tainted]
        for p in tainted:
            p.close()

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for p in pairs:
            p.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                down, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            down.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = None
            if not self._cut:
                up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    self._clamp(up)
                    up.settimeout(2.0)
                    up.connect(("127.0.0.1", self.target_port))
                    up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:          # the target is down: refuse, as it would
                    up.close()
                    down.close()
                    continue
            pair = _Pair(down, up)
            with self._lock:
                if self._cut:
                    pair.tainted = True
                self._pairs.append(pair)
            for src, dst in ((down, up), (up, down)):
                if src is not None:
                    threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True,
                                     name=f"faultproxy-{self.name}-pump").start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            src.settimeout(_POLL)        # in the try: a cut may close it before this runs
            while not self._stop.is_set() and not pair.closed:
                if not self._flowing.wait(_POLL):
                    continue
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                if pair.tainted or dst is None:
                    self.dropped += len(data)
                    continue
                dst.sendall(data)
                self.forwarded += len(data)
        except OSError:
            pass
        if not pair.tainted:             # an end closed: close the other, as TCP would
            pair.close()
            with self._lock:
                if pair in self._pairs:
                    self._pairs.remove(pair)
