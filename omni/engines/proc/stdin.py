"""The engine side of a replica started with another interpreter: its spec on stdin.

The server (omni/runtime/env_process.py) writes one frame to the child's stdin: a 4-byte
big-endian length, then the spec as msgpack (spec.py, spec_bytes). It keeps its end open
for the child's whole life, so the pipe's end of file means the server is gone, even when
it was killed with SIGKILL: the engine then removes its payload arenas and exits at once,
as a forked engine exits when its parent's sentinel fires (main.py, _exit_with_parent).

Its arenas are not registered with a resource tracker of its own, as a forked engine's are
with the server's: every way the engine can end already removes them (its own close; the
end of file above; the launcher, after a SIGKILL of the engine; the next server start,
after a SIGKILL of both), and a private tracker would only race the launcher's unlink and
print a leak warning at every killed replica.
"""

from __future__ import annotations

import glob
import os
import struct
import sys
import threading
from multiprocessing import resource_tracker
from typing import BinaryIO

from omni.engines.proc.spec import EngineSpec, spec_from_bytes

HEADER = struct.Struct(">I")
SHM_DIR = "/dev/shm"


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
    _untrack_shared_memory()
    threading.Thread(target=_exit_at_eof, args=(stream, spec.arena_name), daemon=True,
                     name="parent-watch").start()
    return spec


def _untrack_shared_memory() -> None:
    """Shared-memory segments skip this process's resource tracker (module doc); other
    resources keep it. SharedMemory looks these two functions up at each call."""
    def skipping(call):  # noqa: ANN001, ANN202 - resource_tracker.register / unregister
        def tracked(name: str, rtype: str) -> None:
            if rtype != "shared_memory":
                call(name, rtype)
        return tracked

    resource_tracker.register = skipping(resource_tracker.register)
    resource_tracker.unregister = skipping(resource_tracker.unregister)


def _exit_at_eof(stream: BinaryIO, arena_name: str | None) -> None:
    """The server writes nothing more: a read returns only at end of file, its death."""
    while stream.read(4096):
        pass
    if arena_name:  # this replica's arenas: <arena_name>-<suffix> (omni/connector/shm.py)
        for path in glob.glob(os.path.join(SHM_DIR, glob.escape(arena_name) + "-*")):
            try:
                os.unlink(path)
            except OSError:
                pass
    os._exit(0)
