"""The engine side of a replica started with another interpreter: its spec on stdin.

The server (omni/runtime/env_process.py) writes one frame to the child's stdin: a 4-byte
big-endian length, then the spec as msgpack (spec.py, spec_bytes). It keeps its end open
for the child's whole life, so the pipe's end of file means the server is gone, even when
it was killed with SIGKILL: the engine then exits at once, as a forked engine does when
its parent's sentinel fires (main.py, _exit_with_parent).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from typing import BinaryIO

from omni.engines.proc.spec import EngineSpec, spec_from_bytes

HEADER = struct.Struct(">I")


def frame(data: bytes) -> bytes:
    """What the server writes: the length, then the bytes."""
    return HEADER.pack(len(data)) + data


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise SystemExit("omni engine: stdin closed before the whole spec arrived "
                             "(--spec-stdin is for the server that starts this replica)")
        data += chunk
    return data


def spec_from_parent(stream: BinaryIO | None = None) -> EngineSpec:
    """Read the spec, then watch the rest of stdin for the server's death."""
    stream = stream or sys.stdin.buffer
    (size,) = HEADER.unpack(_read_exactly(stream, HEADER.size))
    spec = spec_from_bytes(_read_exactly(stream, size))
    threading.Thread(target=_exit_at_eof, args=(stream,), daemon=True,
                     name="parent-watch").start()
    return spec


def _exit_at_eof(stream: BinaryIO) -> None:
    """The server writes nothing more: a read returns only at end of file, its death."""
    while stream.read(4096):
        pass
    os._exit(0)
