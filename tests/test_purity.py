"""The kernel and the standard objects do no I/O and read no clock, randomness or threads.

Walks the AST of every .py file under the kernel and the objects and fails on any import
(module level or nested in a function, class, `if`, `try` ...) of a forbidden top-level
package, and on `__import__("x")` / `importlib.import_module("x")` with a literal name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("server/gesmas/server/kernel", "objects/gesmas/objects")
FORBIDDEN = frozenset({"grpc", "pysyncobj", "socket", "threading", "asyncio", "time", "random",
                       "os", "subprocess", "select", "signal"})


def forbidden_imports(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: import x' for every forbidden import in `source`."""
    tree = ast.parse(source, filename=filename)
    found = []

    def check(node: ast.AST, module: str | None) -> None:
        if module and module.partition(".")[0] in FORBIDDEN:
            found.append(f"{filename}:{node.lineno}: imports {module!r}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:                   # relative imports stay in the package
                check(node, node.module)
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else ""
            if name in ("__import__", "import_module"):
                check(node, node.args[0].value)
    return found


def scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_scan_finds_the_kernel_and_the_objects():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    kernel = "server/gesmas/server/kernel/"
    for expected in (kernel + "kernel.py", kernel + "sched.py", kernel + "codec.py",
                     kernel + "dialect.py", kernel + "registry.py", kernel + "sandbox.py",
                     kernel + "__init__.py", "objects/gesmas/objects/__init__.py"):
        assert expected in names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_forbidden_imports(path: Path):
    rel = path.relative_to(ROOT).as_posix()
    found = forbidden_imports(path.read_text(encoding="utf-8"), rel)
    assert not found, "forbidden imports:\n  " + "\n  ".join(found)


def test_checker_catches_every_form():
    src = """
import collections
import os.path
from time import monotonic
import threading as t, json
from . import sched
from .time import x

def f():
    import random
    from asyncio import sleep

class C:
    if True:
        try:
            import socket
        except ImportError:
            pass

mod = __import__("subprocess")
import importlib
sig = importlib.import_module("signal.foo")
g = __import__("grpc_tools")
"""
    found = forbidden_imports(src, "x.py")
    assert sorted(found, key=lambda s: int(s.split(":")[1])) == [
        "x.py:3: imports 'os.path'",
        "x.py:4: imports 'time'",
        "x.py:5: imports 'threading'",
        "x.py:10: imports 'random'",
        "x.py:11: imports 'asyncio'",
        "x.py:16: imports 'socket'",
        "x.py:20: imports 'subprocess'",
        "x.py:22: imports 'signal.foo'",
    ]


# -- the kernel's own import graph runs one way --------------------------------------------------

KERNEL = ROOT / "server/gesmas/server/kernel"
CYCLES_TOLERATED_AMONG: frozenset[str] = frozenset()    # none


def relative_imports(source: str) -> set[str]:
    """The sibling modules `source` imports (`from . import x`, `from .x import y`), wherever
    the import is: module level, in a function, or under `if TYPE_CHECKING:`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.partition(".")[0])
            else:
                found.update(alias.name.partition(".")[0] for alias in node.names)
    return found


def kernel_import_graph() -> dict[str, set[str]]:
    return {p.stem: relative_imports(p.read_text(encoding="utf-8"))
            for p in sorted(KERNEL.glob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with a cycle in them (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_kernel_import_graph_has_no_cycle():
    """Each part of the kernel is an object the kernel owns (kernel.py): the modules import
    one way, TYPE_CHECKING imports included (a part that needs to see more than its
    constructor's arguments declares a Protocol instead)."""
    graph = kernel_import_graph()
    assert {"kernel", "runner", "sessions", "lifecycle", "checkpoint", "queries"} <= set(graph)
    bad = [sorted(c) for c in cycles(graph) if not c <= CYCLES_TOLERATED_AMONG]
    assert not bad, f"import cycles in the kernel: {bad}"
    importers = sorted(m for m, deps in graph.items() if "kernel" in deps)
    assert importers == ["__init__"], f"kernel.py is imported by {importers}"


def test_the_cycle_finder_sees_every_form():
    src = """
from typing import TYPE_CHECKING
from . import a, b as bee
from .c import x
from .d.e import y
from .. import outside
from gesmas.server.kernel import absolute

def f():
    from .g import z

if TYPE_CHECKING:
    from .h import Kernel
"""
    assert relative_imports(src) == {"a", "b", "c", "d", "g", "h"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"a"}, "b": set()}) == [{"a"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
