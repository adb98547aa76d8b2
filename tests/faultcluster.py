"""A LocalCluster whose replicas reach each other only through TCP proxies that a test can cut
(partitions). Fault-injection machinery: it lives with the tests, not in the server.

pysyncobj: of two replicas, the one whose own address is the greater string connects, and
introduces itself by that address. Proxy addresses must sort below every Raft address so that
the same replica still connects (through the proxy) and the other still recognises it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gesmas.server.cluster import LocalCluster, Member, free_ports


@dataclass
class FaultCluster(LocalCluster):
    """`proxy_factory(listen_port, target_port, name)` makes one proxy per pair of replicas
    (tests/faultproxy.py's FaultProxy); `partition()` cuts them, `heal()` mends them."""

    proxy_factory: Any = None
    proxies: dict[tuple[int, int], Any] = field(default_factory=dict)

    def _pairs(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.nodes) for j in range(i + 1, self.nodes)]

    def _ports(self, free: Any) -> tuple[list[int], list[int]]:
        pairs = self._pairs()
        if self.base_port is None:
            ports = sorted(free_ports(2 * self.nodes + len(pairs)))
            if len({len(str(p)) for p in ports}) != 1:
                raise RuntimeError(f"proxies need ports of one length: {ports}")
            proxy_ports, ports = ports[:len(pairs)], ports[len(pairs):]
            client, raft = ports[:self.nodes], ports[self.nodes:]
        else:
            client, raft = super()._ports(free)
            proxy_ports = [self.base_port + 50 + k for k in range(len(pairs))]
        self._proxy_ports = dict(zip(pairs, proxy_ports))
        return client, raft

    def peer_raft_addr(self, m: Member, o: Member) -> str:
        """The proxy of the pair when `m` is the replica that connects (its address is the
        greater), else o's own address."""
        if m.raft_addr < o.raft_addr:
            return o.raft_addr
        a, b = sorted((m.node_id - 1, o.node_id - 1))
        return f"127.0.0.1:{self._proxy_ports[(a, b)]}"

    def start_member(self, m: Member) -> None:
        self._start_proxies()
        super().start_member(m)

    def _start_proxies(self) -> None:
        if self.proxies:
            return
        if self.proxy_factory is None:
            raise ValueError("FaultCluster needs a proxy_factory (tests/faultproxy.py)")
        for (a, b), port in self._proxy_ports.items():
            hi, lo = sorted((self.members[a], self.members[b]), key=lambda x: x.raft_addr,
                            reverse=True)
            target = int(lo.raft_addr.rsplit(":", 1)[1])
            proxy = self.proxy_factory(port, target, f"{hi.node_id}->{lo.node_id}")
            proxy.start()
            self.proxies[(a + 1, b + 1)] = proxy

    def link(self, a: Member, b: Member) -> Any:
        """The proxy between members `a` and `b`."""
        lo, hi = sorted((a.node_id, b.node_id))
        return self.proxies[(lo, hi)]

    def partition(self, m: Member) -> None:
        """Cut `m` off from every other replica; clients still reach it."""
        for o in self.members:
            if o is not m:
                self.link(m, o).cut()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def stop(self) -> None:
        super().stop()
        for proxy in self.proxies.values():
            proxy.close()
        self.proxies.clear()
