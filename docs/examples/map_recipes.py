"""Three uses of a gesmas Map, each a few lines: a service registry with health, configuration
that follows changes, and a feature flag changed with compare-and-set.

    GESMAS_CLUSTER=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 python docs/examples/map_recipes.py

What ZooKeeper and etcd users write with ephemeral nodes / leases, watches and CAS loops;
here the server keeps the entries of a dead instance only until its session expires, a
watch is one call that waits on the replica, and a CAS loop is one call per attempt.
(tests/test_kvmap_cluster.py runs these functions against a real cluster.)
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from gesmas.client import Client


# --- 1. a service registry: instances register ephemeral entries; they go with the instance -----

def register(c: Client, service: str, instance: str, address: str, healthy: bool = True) -> int:
    """Announce (or re-announce, e.g. with a new health) this instance. The entry lives as long
    as `c`'s session: a crashed instance disappears after its session TTL. Returns the map's
    revision after the change."""
    put = c.map("services").put(f"{service}/{instance}",
                                {"address": address, "healthy": healthy}, ephemeral=True)
    return int(put["revision"])


def healthy_instances(c: Client, service: str) -> dict[str, str]:
    """instance -> address of the instances that say they are healthy (one read, no log
    entry; pages of 1,000 for large services)."""
    out: dict[str, str] = {}
    after = ""
    while True:
        page = c.map("services").items(f"{service}/", 1000, after)
        for item in page["items"]:
            if item["value"]["healthy"]:
                out[item["key"].split("/", 1)[1]] = item["value"]["address"]
        if not page["more"]:
            return out
        after = page["items"][-1]["key"]


def membership_changes(c: Client, service: str, after_revision: int | None = None,
                       timeout: float | None = None) -> Iterator[tuple[str, str, Any]]:
    """(event type, instance, value) for every registration, health change and departure."""
    for event in c.map("services").watch_iter(f"{service}/", after_revision, timeout=timeout):
        yield event["type"], event["key"].split("/", 1)[1], event["value"]


# --- 2. configuration: read it once, then follow every change ----------------------------------

def follow_config(c: Client, prefix: str, apply: Callable[[dict[str, Any]], bool],
                  stop: threading.Event, timeout: float = 5.0) -> dict[str, Any]:
    """Call `apply(config)` with the whole configuration under `prefix`, then again after each
    change, until it returns False or `stop` is set. No change is missed: the watch starts
    at the revision the first read saw."""
    m = c.map("config")
    config: dict[str, Any] = {}
    page = m.items(prefix, 10_000)
    for item in page["items"]:
        config[item["key"][len(prefix):]] = item["value"]
    revision = page["revision"]
    while apply(dict(config)) and not stop.is_set():
        try:
            got = m.watch(prefix, revision, timeout=timeout)
        except TimeoutError:
            continue                     # nothing changed; look at `stop` again
        for event in got["events"]:
            name = event["key"][len(prefix):]
            if event["type"] == "put":
                config[name] = event["value"]
            else:
                config.pop(name, None)
        revision = got["revision"]
    return config


# --- 3. a feature flag: change it only if nobody changed it since it was read ------------------

def set_flag(c: Client, flag: str, change: Callable[[Any], Any], attempts: int = 10) -> Any:
    """Read the flag, compute its new value, and store it if its version is still the one
    read (else read again). Returns the value stored."""
    m = c.map("flags")
    for _ in range(attempts):
        entry = m.entry(flag)
        version = 0 if entry is None else entry["version"]
        value = change(None if entry is None else entry["value"])
        if m.cas(flag, version, value):
            return value
    raise RuntimeError(f"flag {flag!r} kept changing: gave up after {attempts} attempts")


if __name__ == "__main__":
    with Client() as c:
        register(c, "api", "host-1", "10.0.0.1:8080")
        print("healthy api instances:", healthy_instances(c, "api"))
        c.map("config").put("app/log_level", "info")
        print("config:", follow_config(c, "app/", lambda cfg: False, threading.Event()))
        print("dark mode:", set_flag(c, "dark_mode", lambda v: not v))
