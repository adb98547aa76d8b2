"""The `gesmas map NAME ...` commands over a standard Map: their parsers and how each runs
on a MapProxy. cli.py wires them in (it owns the client, argument parsing and printing)."""
from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import Any

#: operation -> (help, positional arguments)
OPS: dict[str, tuple[str, list[str]]] = {
    "get": ("print a key's value (null when missing; --entry: with its versions)", ["key"]),
    "put": ("set a key; --ephemeral keeps it only while this command runs", ["key", "value"]),
    "delete": ("delete a key: prints whether it existed", ["key"]),
    "cas": ("set a key if its version is VERSION (0: only if missing)",
            ["key", "version", "value"]),
    "items": ("print keys and values under PREFIX in key order, a page at a time",
              ["prefix?"]),
    "keys": ("print the keys under PREFIX in key order", ["prefix?"]),
    "txn": ("a transaction: --compares, --success, --failure as JSON lists", []),
    "watch": ("print each change under PREFIX as a JSON line, from --after (default: now)",
              ["prefix?"]),
    "revision": ("print the map's revision", []),
    "stat": ("print the map's revision, size and created (the log index that made it)", []),
}


def add_commands(sub: Any, common: argparse.ArgumentParser, parser_class: type,
                 func: Callable[[argparse.Namespace], int]) -> None:
    p = sub.add_parser("map", help="read, change and watch a key-value Map",
                       description="A standard Map (made on first use): gesmas map NAME OP ...")
    p.add_argument("name", metavar="NAME")
    ops = p.add_subparsers(dest="op", metavar="OP", parser_class=parser_class)
    ops.required = True
    for op, (text, params) in OPS.items():
        q = ops.add_parser(op, parents=[common], help=text, description=text)
        for param in params:
            if param.endswith("?"):
                q.add_argument(param[:-1], nargs="?", default="")
            else:
                q.add_argument(param, metavar=param.upper())
        if op == "get":
            q.add_argument("--entry", action="store_true",
                           help="the entry: value, version, revisions, ephemeral")
        if op == "put":
            q.add_argument("--ephemeral", action="store_true",
                           help="bound to this command's session: it stays until the "
                                "command is interrupted (a service registration)")
        if op in ("items", "keys"):
            q.add_argument("--limit", type=int, default=None,
                           help="at most N (default: all, fetched 1,000 at a time)")
        if op == "txn":
            for flag in ("compares", "success", "failure"):
                q.add_argument(f"--{flag}", metavar="JSON", default="[]")
        if op == "watch":
            q.add_argument("--after", type=int, default=None, metavar="REVISION",
                           help="print the changes after this revision (default: now)")
            q.add_argument("--count", type=int, default=None, metavar="N",
                           help="stop after N changes (default: never)")
        q.set_defaults(func=func)


def run(m: Any, args: argparse.Namespace, parse_arg: Callable[[str], Any],
        parse_json: Callable[[str, str, tuple[type, ...]], Any],
        dump: Callable[[Any], str]) -> int:
    """Run the `map` operation of `args` on the MapProxy `m`; print its result."""
    op = args.op
    if op == "get":
        print(dump(m.entry(args.key) if args.entry else m.get(args.key)))
    elif op == "put":
        print(dump(m.put(args.key, parse_arg(args.value), args.ephemeral)))
        if args.ephemeral:
            print("holding the entry until interrupted", flush=True)
            threading.Event().wait()        # the session's keep-alive holds it
    elif op == "delete":
        print(dump(m.delete(args.key)))
    elif op == "cas":
        try:
            version = int(args.version)
        except ValueError:
            raise ValueError(f"VERSION must be an integer, not {args.version!r}") from None
        print(dump(m.cas(args.key, version, parse_arg(args.value))))
    elif op in ("items", "keys"):
        _pages(m, op, args.prefix, args.limit, dump)
    elif op == "txn":
        lists = [parse_json(getattr(args, f), f"--{f}", (list,))
                 for f in ("compares", "success", "failure")]
        print(dump(m.txn(*lists)))
    elif op == "watch":
        left = args.count
        if left is not None and left < 1:
            raise ValueError(f"--count must be at least 1, not {left}")
        for event in m.watch_iter(args.prefix, args.after):
            print(dump(event), flush=True)
            if left is not None:
                left -= 1
                if left <= 0:
                    break
    elif op == "stat":
        print(dump(m.stat()))
    else:
        print(dump(m.revision()))
    return 0


def _pages(m: Any, op: str, prefix: str, limit: int | None, dump: Callable[[Any], str]
           ) -> None:
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, not {limit}")
    after, shown = "", 0
    while True:
        size = 1000 if limit is None else min(1000, limit - shown)
        page = getattr(m, op)(prefix, size, after)
        rows = page[op]
        for row in rows:
            print(dump(row) if op == "items" else row)
        shown += len(rows)
        if not page["more"] or not rows or (limit is not None and shown >= limit):
            return
        after = rows[-1]["key"] if op == "items" else rows[-1]
