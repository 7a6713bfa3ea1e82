"""Shared-memory segments for the shm connector: creating, pre-faulting, attaching,
unlinking, and the byte layout they share (see shm.py for the protocol on top)."""

from __future__ import annotations

import math
import os
import struct
import sys
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from omni.connector.base import ConnectorError

KiB, MiB = 1024, 1024 * 1024
DEFAULT_BLOCK_SIZE = 64 * KiB
DEFAULT_CAPACITY = 64 * MiB  # per producer process; pipelines raise it per stage
DEFAULT_PUT_TIMEOUT_S = 5.0
PAGE = 4096
SHM_DIR = "/dev/shm"

_MAGIC = b"OMNISHM1"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQ")  # magic, version, block_size, nblocks, data_offset, cap
_FLAGS = 64  # offset of the flag bytes


# Segments this process created and has not unlinked yet (see _attach for why it matters).
_OWNED: set[str] = set()
# Mappings that could not be unmapped at close() because tensor views were still alive:
# kept here so the views stay valid; the memory goes away with the process.
_LINGERING: list[Any] = []


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


class _Arena:
    """The producer's segment: created, pre-faulted and (at close) unlinked by its owner."""

    def __init__(self, name: str, capacity_bytes: int, block_size: int) -> None:
        self.block_size = block_size
        self.nblocks = max(1, math.ceil(capacity_bytes / block_size))
        self.data_offset = _align(_FLAGS + self.nblocks, PAGE)
        self.size = self.data_offset + self.nblocks * block_size
        self.name = name
        _check_room(self.size)
        # Registered with multiprocessing's resource tracker (the default for create=True):
        # if the whole process tree dies, the tracker unlinks the segment when the last
        # process sharing it exits. close() unlinks (and unregisters) on the normal path.
        self.shm = shared_memory.SharedMemory(name=name, create=True, size=self.size)
        _OWNED.add(name)
        try:
            self.buf: memoryview = self.shm.buf
            # Pre-fault: one write per page now, so no put() pays page faults (tmpfs pages
            # are allocated on first write). A strided zero_() runs the loop in C.
            torch.frombuffer(self.buf, dtype=torch.uint8)[::PAGE].zero_()
            _HEADER.pack_into(self.buf, 0, _MAGIC, _VERSION, block_size, self.nblocks,
                              self.data_offset, self.nblocks * block_size)
        except BaseException:
            self.close(unlink=True)
            raise

    def close(self, unlink: bool) -> None:
        if unlink and self.name in _OWNED:
            _OWNED.discard(self.name)
            try:
                self.shm.unlink()  # also unregisters from the resource tracker
            except FileNotFoundError:
                # Unlinked by a sweep first (the launcher's unlink_arenas at stop): the
                # tracker still holds the name and would warn of a leak at exit.
                _forget_in_tracker(self.name)
        _close_mapping(self.shm)


def _check_room(size: int, shm_dir: str = "/dev/shm") -> None:
    """Refuse an arena tmpfs cannot hold: pre-faulting past the end of a full tmpfs is a
    SIGBUS (a dead process), not an exception (containers often give /dev/shm 64 MiB)."""
    try:
        stat = os.statvfs(shm_dir)
    except OSError:
        return  # no such directory to check (not Linux): let shm_open decide
    free = stat.f_bavail * stat.f_frsize
    if free < size:
        raise ConnectorError(
            f"shared-memory arena of {size / MiB:.0f} MiB does not fit: {shm_dir} has "
            f"{free / MiB:.0f} MiB free. Lower the stage's options.payload_arena_mb or give "
            f"{shm_dir} more room (docker: --shm-size)")


class _Mapping:
    """A consumer's mapping of another process's arena (read geometry from its header)."""

    def __init__(self, name: str, prefault: bool) -> None:
        self.name = name
        self.shm = _attach(name)
        self.buf: memoryview = self.shm.buf
        try:
            magic, version, self.block_size, self.nblocks, self.data_offset, capacity = (
                _HEADER.unpack_from(self.buf, 0))
            if magic != _MAGIC or version != _VERSION:
                raise ConnectorError(f"shared memory segment {name!r} is not an omni arena "
                                     f"(magic {magic!r}, version {version})")
            self.size = self.data_offset + capacity
            if self.size > len(self.buf):
                raise ConnectorError(f"arena {name!r} is smaller than its header says")
            if prefault:
                # Map every page now (minor faults, no copy) so get() latency stays flat;
                # the sum forces the reads.
                torch.frombuffer(self.buf, dtype=torch.uint8)[::PAGE].sum()
        except BaseException:
            _close_mapping(self.shm)
            raise


class _PlainMapping:
    """What SharedMemory(name, track=False) gives on 3.13+, for 3.11/3.12."""

    def __init__(self, name: str) -> None:
        import _posixshmem  # CPython's own shm_open/shm_unlink binding (stdlib-internal)
        import mmap

        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


def _attach(name: str) -> Any:
    """Map an existing segment WITHOUT registering it with the resource tracker.

    On Python < 3.13, ``SharedMemory(name)`` registers the segment with this process's
    resource tracker, which unlinks it when the process tree exits: a consumer would destroy
    the producer's arena. Unregistering right after attaching is not enough either: spawned
    processes share their parent's tracker, whose bookkeeping is a *set* of names, so the
    consumer's REGISTER is a no-op and its UNREGISTER would delete the producer's own
    registration (and the producer's later unlink makes the tracker print a KeyError). So a
    consumer never registers: ``track=False`` on 3.13+, and the same shm_open + mmap that
    SharedMemory does internally on older versions.
    """
    try:
        if sys.version_info >= (3, 13):
            return shared_memory.SharedMemory(name=name, track=False)
        return _PlainMapping(name)
    except FileNotFoundError:
        raise ConnectorError(f"producer arena {name!r} is gone (producer exited or was "
                             f"cleaned up)") from None


def _close_mapping(shm: Any) -> None:
    try:
        shm.close()
    except BufferError:
        # Tensor views from get()/reserve() still point into the mapping; unmapping now
        # would turn them into dangling pointers. Keep the mapping for the process lifetime.
        _LINGERING.append(shm)


def drop_unlinked(mappings: dict[str, Any], shm_dir: str = SHM_DIR) -> list[str]:
    """Close the cached mappings whose segment is gone from ``shm_dir`` (its producer died
    and the launcher unlinked its arena), and retry the lingering ones. Called when a new
    segment is first mapped, which is when a restarted producer shows up: before, every
    restart left the old arena's touched pages mapped in each of its consumers and in the
    front end (bench soak: +12 MiB of PSS per killed replica, +6.8% in 10 minutes)."""
    gone = [name for name in mappings if not os.path.exists(os.path.join(shm_dir, name))]
    for name in gone:
        _close_mapping(mappings.pop(name).shm)
    for shm in list(_LINGERING):  # their views may have been let go since
        try:
            shm.close()
            _LINGERING.remove(shm)
        except BufferError:
            pass
    return gone


def cleanup_stale(prefix: str, *, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every shared-memory segment whose name starts with ``prefix``.

    For the launcher, after a producer was killed (SIGKILL leaves its arena behind): pass
    the prefix of that replica (or of the whole launch). Names this process's resource
    tracker holds are unregistered too (spawned engines share their parent's tracker, which
    would otherwise try to unlink them again at exit and warn). Returns the names removed.
    """
    if not prefix or "/" in prefix or len(prefix) < 4:
        raise ValueError(f"refusing to clean shared memory with prefix {prefix!r}")
    try:
        names = sorted(n for n in os.listdir(shm_dir) if n.startswith(prefix))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(shm_dir, name))
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not ours to remove (permissions): leave it, report what we did
        removed.append(name)
        _OWNED.discard(name)
        _forget_in_tracker(name)
    return removed


def _forget_in_tracker(name: str) -> None:
    """Unregister a segment from this process's resource tracker, if it runs one."""
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    if getattr(tracker, "_fd", None) is None:
        return  # no tracker in this process tree: nothing registered, don't start one
    try:
        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:  # noqa: BLE001 - best effort; the segment is already gone
        pass
