"""The gesmas kernel. It does no I/O: no sockets, files, clocks, threads or randomness.

Committed commands go in (`Kernel.apply(index, command)`), completions come out. Time and
random numbers come from the log, so every replica that applies the same log reaches the same
state and gives the same answers. `tests/test_purity.py` walks the imports to keep it so.
"""
from .codec import (Cancel, Checkpoint, CloseSession, Command, CreateObject, DeleteObject,
                    ExpireSession, Invoke, OpenSession, Query, RegisterClass, Tick, decode,
                    encode)
from .errors import Code, Error, KernelError
from .kernel import Completion, Config, Kernel

__all__ = [
    "Cancel", "Checkpoint", "CloseSession", "Code", "Command", "Completion", "Config", "CreateObject",
    "DeleteObject", "Error", "ExpireSession", "Invoke", "Kernel", "KernelError", "OpenSession",
    "Query", "RegisterClass", "Tick", "decode", "encode",
]
