"""Block bookkeeping shared by the shm arena and the CUDA IPC pool.

A producer's buffer (host arena or device pool) is cut into fixed-size blocks; a payload
takes a *run* of contiguous blocks. Consumers release a run by writing its generation tag
(1..255) into the run's flag byte in a small shared-memory region; the producer frees
runs whose flag equals their tag when it next allocates or reports (no control message
per release). A late release of an older run at the same start writes an older tag and is
ignored. Owners (request ids) let `cleanup` free everything of an aborted request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni.connector.base import ArenaFullError

MAX_TAG = 255

# Backpressure: first sleep, and the longest single sleep, while waiting for room.
WAIT_FIRST_S = 50e-6
WAIT_MAX_S = 2e-3


@dataclass(slots=True)
class Run:
    start: int
    nblocks: int
    tag: int
    owner: str
    nbytes: int


class BlockTable:
    """First-fit runs over ``nblocks`` blocks; ``flags[flags_offset + start]`` is the
    release flag byte of the run starting at ``start``."""

    def __init__(self, nblocks: int, flags: Any, flags_offset: int) -> None:
        self.nblocks = nblocks
        self.flags = flags
        self.flags_offset = flags_offset
        self.used = bytearray(nblocks)  # 1 = allocated
        self.gens = bytearray(nblocks)  # per start block: tag of the last run started there
        self.runs: dict[int, Run] = {}  # start block -> live run
        self.owners: dict[str, set[int]] = {}  # owner -> start blocks of its live runs
        self.reclaimed = self.cleaned_up = 0

    def find(self, need: int, owner: str, nbytes: int) -> Run | None:
        """First fit: lowest start of ``need`` free contiguous blocks, after reclaiming.

        First fit over a byte-per-block map, because ``bytearray.find`` scans it in C (a
        16k-block map takes microseconds) and payloads are short-lived (put -> get ->
        release within a step or two), so the buffer is mostly empty and packing low keeps
        the large free run at the top for the next big payload. None when there is no room.
        """
        self.reclaim()
        start = self.used.find(bytes(need))
        if start < 0:
            return None
        self.used[start:start + need] = b"\x01" * need
        tag = self.gens[start] % MAX_TAG + 1
        self.gens[start] = tag
        # Clear the run's flag byte before the ref exists (see the module docstring).
        self.flags[self.flags_offset + start] = 0
        run = self.runs[start] = Run(start, need, tag, owner, nbytes)
        self.owners.setdefault(owner, set()).add(start)
        return run

    def reclaim(self) -> int:
        """Free runs whose flag byte a consumer set to the run's tag.

        Memory ordering: a consumer finishes every read of the payload, then stores ONE byte
        (a single-byte store is atomic on every CPU, so it is never torn). The producer loads
        that byte here and only afterwards writes new data into those blocks. On x86 (TSO)
        neither side needs a fence: loads are not reordered with later stores, so the
        consumer's reads complete before its flag store becomes visible, and the producer's
        later stores cannot pass its flag load. On weakly ordered CPUs (aarch64) this relies
        on the hundreds of interpreter instructions, with data dependencies, between the
        consumer's last read and the flag store (no explicit barrier is available from
        Python). A release acknowledged through the control plane, or a tiny C helper with
        a release store, would make that formal when ARM hosts matter.
        """
        flags, base = self.flags, self.flags_offset
        done = [run for run in self.runs.values() if flags[base + run.start] == run.tag]
        for run in done:
            self.free(run)
        self.reclaimed += len(done)
        return len(done)

    def free(self, run: Run) -> None:
        self.used[run.start:run.start + run.nblocks] = bytes(run.nblocks)
        del self.runs[run.start]
        starts = self.owners.get(run.owner)
        if starts is not None:
            starts.discard(run.start)
            if not starts:
                del self.owners[run.owner]

    def free_start(self, start: int) -> None:
        run = self.runs.get(start)
        if run is not None:
            self.free(run)

    def cleanup(self, owner: str) -> int:
        starts = list(self.owners.get(owner, ()))
        for start in starts:
            self.free(self.runs[start])
        self.cleaned_up += len(starts)
        return len(starts)

    def blocks_in_use(self) -> int:
        return sum(r.nblocks for r in self.runs.values())

    def usage(self, block_size: int) -> dict[str, int]:
        blocks = self.blocks_in_use()
        return {"capacity_bytes": self.nblocks * block_size, "used_bytes": blocks * block_size,
                "payload_bytes": sum(r.nbytes for r in self.runs.values()),
                "blocks_total": self.nblocks, "blocks_in_use": blocks,
                "payloads_in_use": len(self.runs), "owners": len(self.owners),
                "longest_free_blocks": longest_zero_run(self.used)}


def allocate_waiting(lock: Any, blocks: BlockTable, need: int, owner: str, nbytes: int,
                     timeout_s: float, stats: dict[str, int], what: str,
                     block_size: int) -> Run:
    """A run of ``need`` blocks, waiting (bounded) for consumers to release some; then
    ArenaFullError, which fails only the request being published for. ``what`` names the
    buffer in the message (e.g. "shm arena 'omni-...'")."""
    stats["full_waits"] += 1

    def find() -> Run | None:
        with lock:
            return blocks.find(need, owner, nbytes)

    def full() -> Exception:
        if timeout_s > 0:  # a try without waiting (engine loop) fails no request by itself
            stats["full_errors"] += 1
        return ArenaFullError(
            f"{what} full for {timeout_s:g} s: payload of {nbytes} bytes ({need} blocks of "
            f"{block_size}) for request {owner!r}; capacity {blocks.nblocks * block_size} "
            f"bytes, in use {blocks.blocks_in_use() * block_size} bytes in "
            f"{len(blocks.runs)} payloads of {len(blocks.owners)} requests. Consumers are "
            f"not releasing, or the capacity is too small for the traffic.")

    return wait_for_room(find, timeout_s, full)


def wait_for_room(find: Callable[[], Run | None], timeout_s: float,
                  full: Callable[[], Exception]) -> Run:
    """Backpressure: wait (bounded) for consumers to release blocks, then raise ``full()``.

    Sleeping in short increments is the one polling loop of the runtime, on purpose: room
    appears when a consumer in *another process* writes a flag byte into shared memory, and
    no event, socket or futex comes with that write that this thread could wait on (adding
    one would cost a message per release, which the flag design avoids). ``find`` takes the
    caller's lock itself.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    delay = WAIT_FIRST_S
    while (now := time.monotonic()) < deadline:
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, WAIT_MAX_S)
        if (run := find()) is not None:
            return run
    if (run := find()) is not None:
        return run
    raise full()


def longest_zero_run(used: bytearray) -> int:
    best = run = 0
    for byte in used:
        run = run + 1 if byte == 0 else 0
        best = max(best, run)
    return best
