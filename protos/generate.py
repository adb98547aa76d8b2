#!/usr/bin/env python
"""Regenerate the Python code for the gesmas wire API from ``protos/gesmas/v1/*.proto``.

    python protos/generate.py           # rewrite protos/gesmas/v1/*_pb2*.py and *_pb2.pyi
    python protos/generate.py --check   # exit 1 if the checked-in files are stale (CI)

The proto root is ``protos/`` (``-Iprotos``), so generated modules import each other as
``from gesmas.v1 import gesmas_pb2``, matching the ``gesmas.v1`` package. The output depends
on the grpcio-tools version (it is stamped into the files), so regenerate with the version
pinned for development.
"""
from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "gesmas" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def _protos() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("*.proto"))


def _generated(directory: Path) -> dict[str, Path]:
    return {
        p.name: p
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def _tools_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpcio-tools")
    except PackageNotFoundError:
        return "unknown"


def generate(out_root: Path) -> Path:
    """Run protoc on every .proto of the package, writing under ``out_root``; return the
    directory holding the generated files (``out_root/gesmas/v1``)."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        sys.exit("generate.py: grpcio-tools is not installed (pip install -e '.[dev]')")

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    protos = _protos()
    if not protos:
        sys.exit(f"generate.py: no .proto files in {PACKAGE_DIR}")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        sys.exit(f"generate.py: protoc failed with exit code {rc}")
    return out_root / "gesmas" / "v1"


def check() -> int:
    """Regenerate into a temporary directory and compare with the checked-in files."""
    with tempfile.TemporaryDirectory(prefix="gesmas-protos-") as tmp:
        fresh = _generated(generate(Path(tmp)))
        current = _generated(PACKAGE_DIR)
        problems = []
        for name in sorted(fresh.keys() | current.keys()):
            if name not in current:
                problems.append(f"missing: {name}")
            elif name not in fresh:
                problems.append(f"not generated from any .proto (stale?): {name}")
            elif not filecmp.cmp(fresh[name], current[name], shallow=False):
                problems.append(f"differs: {name}")
    if problems:
        print(
            f"generate.py --check: generated code in {PACKAGE_DIR.relative_to(PROTO_ROOT.parent)}"
            " is out of date with the .proto files:",
            file=sys.stderr,
        )
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print(
            f"Run `python protos/generate.py` and commit the result (compared with "
            f"grpcio-tools {_tools_version()}; a different version also changes the output).",
            file=sys.stderr,
        )
        return 1
    print(f"generate.py --check: {len(fresh)} generated files are up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if the checked-in generated files are stale",
    )
    opts = parser.parse_args(argv)
    if opts.check:
        return check()
    with tempfile.TemporaryDirectory(prefix="gesmas-protos-") as tmp:
        fresh = _generated(generate(Path(tmp)))
        for name, path in _generated(PACKAGE_DIR).items():
            if name not in fresh:
                path.unlink()
                print(f"removed {name}")
        for name, path in fresh.items():
            shutil.copyfile(path, PACKAGE_DIR / name)
            print(f"wrote {PACKAGE_DIR.relative_to(PROTO_ROOT.parent) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
