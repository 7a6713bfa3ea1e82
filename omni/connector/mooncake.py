"""Mooncake backend: a registered arena per producer, read by consumers through Mooncake's
transfer engine (TCP here; RDMA where a deployment has it), released by a remote write.

Layout of a producer's arena (one CPU buffer, registered with its engine once)::

    0    release flags: one byte per block (only the byte of a run's FIRST block is used)
    data_offset (page aligned): nblocks * block_size bytes of payload blocks

Producer: ``put`` copies the payload into a run of blocks (blocks.py, as shm.py) and
returns ``[session, base, offset, block, tag]``: its engine's ``HOST:RPC_PORT``, the
arena's address, the payload's offset, the run's first block and tag (shm.py says why).
Consumer: ``get`` reads ``base + offset`` straight into a registered receive buffer of
its pool (mooncake_pool.py) and returns a view of it, valid until ``release`` (or
``forget``) gives the buffer back, as an shm view is valid until release. ``release``
writes the tag into the flag byte at ``base + block`` (a one-byte remote write from a
registered table whose byte t is t) without waiting for it: the read it ends finished
before get returned, so the producer cannot reuse the blocks early, and a write that
never lands only keeps the blocks until the producer's ``cleanup(owner)``. Posted writes
are checked (their batches freed, failures counted) on later calls, and waited for by
``drain`` and ``close``. The producer frees runs whose flag equals their tag on its next
put or health(), as shm does (BlockTable.reclaim). Engine facts: mooncake_engine.py.

Security: the engine's TCP transport has NO authentication and NO encryption. Anyone who
reaches its ports can read every registered byte (the arena, a consumer's receive
buffers) and write into it (flags included), and peers are not verified. Keep it on a
private network (or host firewall) of the deployment's own machines; the zmq backend
(zmq_data.py, CURVE) is the authenticated one and is what to use over any network you do
not control.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

import torch

from omni.connector.base import (
    BYTES_DTYPE,
    Connector,
    ConnectorError,
    Payload,
    PayloadRef,
    as_bytes_view,
    cpu_tensor,
    dtype_from_name,
    dtype_name,
)
from omni.connector.blocks import MAX_TAG, BlockTable, Run, allocate_waiting
from omni.connector.mooncake_engine import DONE, LOST, Engine
from omni.connector.mooncake_pool import RecvPool
from omni.connector.shm_segment import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_PUT_TIMEOUT_S,
    PAGE,
    MiB,
)

__all__ = ["DEFAULT_IO_TIMEOUT_S", "DEFAULT_RECV_POOL_BYTES", "MooncakeConnector"]

log = logging.getLogger("omni.connector.mooncake")

DEFAULT_IO_TIMEOUT_S = 5.0  # first contact (probe) and "no progress" on an open session
DEFAULT_RECV_POOL_BYTES = 256 * MiB
_MAX_POSTED = 256  # releases in flight before release() waits for them
_USAGE_KEYS = ("capacity_bytes", "used_bytes", "payload_bytes", "blocks_total", "blocks_in_use",
               "payloads_in_use", "owners", "reclaimed", "cleaned_up")  # health, no arena


class MooncakeConnector(Connector):
    """Producer arena (created on first put) + consumer receive pool, over one lazily
    started transfer engine listening on ``host`` (an address the other hosts reach).
    ``recv_pool_bytes`` bounds the receive buffers a consumer keeps (mooncake_pool.py; 0:
    every get reads into a fresh buffer of its own)."""

    backend = "mooncake"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, host: str = "127.0.0.1",
                 protocol: str = "tcp", device: str = "",
                 io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
                 recv_pool_bytes: int = DEFAULT_RECV_POOL_BYTES) -> None:
        if block_size <= 0 or block_size % 64:
            raise ConnectorError(f"block_size must be a positive multiple of 64, got {block_size}")
        if capacity_bytes <= 0:
            raise ConnectorError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if recv_pool_bytes < 0:
            raise ConnectorError(f"recv_pool_bytes must be >= 0, got {recv_pool_bytes}")
        if host in ("", "0.0.0.0", "::"):
            raise ConnectorError(f"mooncake host must be an address peers reach, got {host!r}")
        self.name = name
        self.capacity_bytes, self.block_size = capacity_bytes, block_size
        self.put_timeout_s, self.io_timeout_s = put_timeout_s, io_timeout_s
        self.recv_pool_bytes = recv_pool_bytes
        self._engine_args = (host, protocol, device, io_timeout_s)
        self._lock = threading.Lock()  # producer: arena and block table
        self._start_lock = threading.Lock()
        self._post_lock = threading.Lock()  # consumer: posted releases
        self._engine: Engine | None = None
        self._pool: RecvPool | None = None
        self._arena: torch.Tensor | None = None
        self._blocks: BlockTable | None = None
        self._data_offset = 0
        self._tags_addr = 0
        self._sessions: set[str] = set()  # peers that answered a probe
        self._posted: deque[tuple[int, str, str]] = deque()  # (batch, ref key, session)
        self._counter = 0
        self._closed = False
        self._stats = dict.fromkeys(("puts", "gets", "releases", "release_failures",
                                     "forgotten", "full_waits", "full_errors"), 0)

    # -- engine --------------------------------------------------------------------------

    @property
    def session(self) -> str | None:
        return self._engine.session if self._engine else None

    def _started(self) -> Engine:
        with self._start_lock:
            if self._closed:
                raise ConnectorError("connector is closed")
            if self._engine is None:
                engine = Engine(*self._engine_args)
                tags = torch.arange(MAX_TAG + 1, dtype=torch.uint8)  # byte t holds t
                self._tags_addr = engine.register(tags, pin=True)
                self._pool = RecvPool(engine, self.recv_pool_bytes)
                self._engine = engine
            return self._engine

    def _reach(self, session: str) -> Engine:
        """The engine, once ``session`` answered a probe (bounded: never the 60 s hang)."""
        engine = self._started()
        if session in self._sessions:
            return engine
        rc = engine.probe(session, self.io_timeout_s)
        if rc != 0:
            why = "did not answer" if rc is None else f"refused the probe (rc {rc})"
            raise ConnectorError(f"mooncake producer {session} {why} within "
                                 f"{self.io_timeout_s:g} s: it exited or is unreachable")
        self._sessions.add(session)
        return engine
    # -- producer ------------------------------------------------------------------------

    def open_arena(self) -> str:
        """Start the engine and register the arena now; returns the session id."""
        with self._lock:
            self._open_arena_locked()
        return self.session

    def _open_arena_locked(self) -> torch.Tensor:
        engine = self._started()
        if self._arena is None:
            nblocks = max(1, math.ceil(self.capacity_bytes / self.block_size))
            self._data_offset = -(-nblocks // PAGE) * PAGE
            arena = torch.empty(self._data_offset + nblocks * self.block_size, dtype=torch.uint8)
            arena[:self._data_offset].zero_()
            arena[::PAGE].zero_()  # pre-fault: no put pays page faults
            engine.register(arena, pin=True)
            self._blocks = BlockTable(nblocks, memoryview(arena.numpy()), 0)
            self._arena = arena
        return self._arena

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        if isinstance(value, torch.Tensor):
            src = cpu_tensor(value)
            ref = self._allocate(dtype_name(src.dtype), tuple(src.shape),
                                 src.numel() * src.element_size(), owner, timeout_s)
            if ref.nbytes:
                self._fill(ref, lambda view: view.view(src.dtype).view(src.shape).copy_(src))
        elif isinstance(value, bytes | bytearray | memoryview):
            src_bytes = as_bytes_view(value)
            ref = self._allocate(BYTES_DTYPE, (src_bytes.nbytes,), src_bytes.nbytes, owner,
                                 timeout_s)
            if ref.nbytes:
                self._fill(ref, lambda view: _write_bytes(view, src_bytes))
        else:
            raise ConnectorError(f"cannot publish a {type(value).__name__}")
        self._stats["puts"] += 1
        return ref

    def _fill(self, ref: PayloadRef, write: Any) -> None:
        """Copy the payload in (copy_ gathers a non-contiguous source in one pass)."""
        offset = ref.location[2]
        try:
            write(self._arena[offset:offset + ref.nbytes])
        except BaseException:
            with self._lock:
                if self._blocks is not None:
                    self._blocks.free_start(ref.location[3])
            raise

    def _allocate(self, dtype: str, shape: tuple[int, ...], nbytes: int, owner: str,
                  timeout_s: float | None) -> PayloadRef:
        with self._lock:
            arena = self._open_arena_locked()
            self._counter += 1
            key, session, base = f"{owner}/{self._counter}", self.session, arena.data_ptr()
            if nbytes == 0:  # nothing to hold: no blocks, nothing to release
                return PayloadRef("mooncake", key, owner, dtype, shape, 0,
                                  [session, base, self._data_offset, -1, 0])
            need = -(-nbytes // self.block_size)
            if need > self._blocks.nblocks:
                raise ConnectorError(
                    f"payload of {nbytes} bytes for {owner!r} is larger than the whole "
                    f"mooncake arena of {session} ({self._blocks.nblocks * self.block_size} "
                    f"bytes); raise the connector capacity")
            run = self._blocks.find(need, owner, nbytes)
        if run is None:
            run = self._wait_for_room(need, nbytes, owner, timeout_s)
        return PayloadRef("mooncake", key, owner, dtype, shape, nbytes,
                          [session, base, self._data_offset + run.start * self.block_size,
                           run.start, run.tag])

    def _wait_for_room(self, need: int, nbytes: int, owner: str,
                       timeout_s: float | None) -> Run:
        # Bounded backoff polling (50 us .. 2 ms), as for shm: a release is a remote write
        # that the engine's server thread lands in the flag bytes, with nothing a thread
        # could block on (the engine's notifies are a non-blocking poll as well).
        timeout = self.put_timeout_s if timeout_s is None else timeout_s
        return allocate_waiting(self._lock, self._blocks, need, owner, nbytes, timeout,
                                self._stats, f"mooncake arena of {self.session}",
                                self.block_size)

    def cleanup(self, owner: str) -> int:
        with self._lock:
            return self._blocks.cleanup(owner) if self._blocks is not None else 0

    # -- consumer ------------------------------------------------------------------------

    @staticmethod
    def _place(ref: PayloadRef) -> tuple[str, int, int, int, int]:
        if ref.backend != "mooncake":
            raise ConnectorError(f"mooncake connector cannot read a {ref.backend!r} ref")
        session, base, offset, block, tag = ref.location
        # Blocks come after their flag bytes; the producer's engine refuses anything
        # outside its registered arena, so these checks only catch nonsense early.
        if not (base > 0 and 0 <= block < offset and 1 <= tag <= MAX_TAG):
            raise ConnectorError(f"payload ref {ref.key!r} points outside the arena of "
                                 f"{session} (block {block}, offset {offset}, tag {tag})")
        return session, base, offset, block, tag

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        """The payload, read from the producer into a receive buffer: a tensor view of
        it, valid until :meth:`release` or :meth:`forget` of the ref (then the buffer
        serves another get); treat it as read-only and copy what must outlive that. Bytes
        payloads come back as owned ``bytes``. ConnectorError naming the session when the
        producer is gone."""
        self._stats["gets"] += 1
        if ref.nbytes == 0:
            if ref.backend != "mooncake":
                raise ConnectorError(f"mooncake connector cannot read a {ref.backend!r} ref")
            return b"" if ref.dtype == BYTES_DTYPE else torch.empty(
                ref.shape, dtype=dtype_from_name(ref.dtype))
        session, base, offset, _, _ = self._place(ref)
        engine = self._reach(session)
        self._reap()
        buf = self._read(engine, session, base + offset, ref)
        if ref.dtype == BYTES_DTYPE:
            data = buf[:ref.nbytes].numpy().tobytes()
            self._pool.drop(buf)
            return data
        self._pool.keep(_key(ref), buf)
        return buf[:ref.nbytes].view(dtype_from_name(ref.dtype)).view(ref.shape)

    def _read(self, engine: Engine, session: str, remote: int, ref: PayloadRef) -> torch.Tensor:
        buf = self._pool.take(ref.nbytes)
        rc = LOST  # until the read says otherwise (interrupted while waiting: it may land)
        try:
            rc = engine.read(session, buf.data_ptr(), remote, ref.nbytes)
        finally:
            if rc == LOST:
                self._pool.retire(buf)
            elif rc != DONE:
                self._pool.drop(buf)
        if rc != DONE:
            self._sessions.discard(session)  # probe again before the next use
            raise ConnectorError(f"mooncake read of {ref.key!r} ({ref.nbytes} bytes) "
                                 f"from {session} failed: the producer exited, is "
                                 f"unreachable, or freed the payload")
        return buf

    def release(self, ref: PayloadRef) -> None:
        """Give the receive buffer back and post the run's tag to its flag byte on the
        producer (a one-byte remote write, not waited for: module doc).

        Releasing a ref that was never read is fine. A producer that is gone has nothing
        left to release: the failure is counted (``release_failures``) and logged, not
        raised, as for shm; a producer that is only cut off keeps the blocks until
        ``cleanup(owner)`` runs there.
        """
        if ref.nbytes == 0:
            return
        session, base, _, block, tag = self._place(ref)
        if self._pool is not None:
            self._pool.give(_key(ref))
        try:
            engine = self._reach(session)
            batch = engine.post_write(session, self._tags_addr + tag, base + block, 1)
        except ConnectorError as exc:  # not reachable (or closed)
            self._release_failed(ref.key, session, str(exc))
            return
        if batch is None:
            self._release_failed(ref.key, session, "the engine refused the write")
            return
        with self._post_lock:
            self._posted.append((batch, ref.key, session))
        self._reap(self.io_timeout_s if len(self._posted) > _MAX_POSTED else 0.0)

    def forget(self, ref: PayloadRef) -> None:
        """Give the receive buffer back without releasing the payload (an abort: the
        producer frees it with ``cleanup``); the view of it is invalid from now on."""
        if ref.nbytes and self._pool is not None and self._pool.give(_key(ref)):
            self._stats["forgotten"] += 1

    def _release_failed(self, key: str, session: str, why: str) -> None:
        self._sessions.discard(session)
        self._stats["release_failures"] += 1
        log.warning("mooncake release of %r to %s failed (%s)", key, session, why)

    def _reap(self, wait_s: float = 0.0) -> None:
        """Settle the posted releases that ended (``wait_s``: wait that long for all)."""
        engine, deadline = self._engine, time.monotonic() + wait_s
        if engine is None or not self._posted:
            return
        with self._post_lock:
            for _ in range(len(self._posted)):
                batch, key, session = self._posted.popleft()
                rc = engine.wait(engine.te, batch, deadline) if wait_s else engine.check(batch)
                if rc is None:
                    self._posted.append((batch, key, session))
                elif rc == DONE:
                    self._stats["releases"] += 1
                else:
                    self._release_failed(key, session, "the write failed" if rc != LOST
                                         else "the write did not end in time")

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait for every posted release to land (default: io_timeout_s at most)."""
        self._reap(self.io_timeout_s if timeout_s is None else timeout_s)

    # -- both ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        self._reap()
        with self._lock:
            out: dict[str, Any] = {
                "backend": "mooncake", "session": self.session, "block_size": self.block_size,
                "sessions_reached": len(self._sessions), "releases_posted": len(self._posted),
                **self._stats,
                **(self._pool.usage() if self._pool is not None else {})}
            blocks = self._blocks
            if blocks is None:
                return out | dict.fromkeys(_USAGE_KEYS, 0)
            blocks.reclaim()  # first, so the counters below include it
            out.update(blocks.usage(self.block_size), reclaimed=blocks.reclaimed,
                       cleaned_up=blocks.cleaned_up)
            return out

    def close(self) -> None:
        """Wait (io_timeout_s at most) for posted releases, drop the receive pool (views
        still held keep their memory), unregister everything and stop the engine (its
        ports close; consumers' reads then fail at once). The arena is freed once the
        engine is gone. Idempotent."""
        if self._closed:
            return
        self.drain()
        with self._lock, self._start_lock:  # put's order
            if self._closed:
                return
            self._closed = True
            engine, self._engine = self._engine, None
            pool, self._pool = self._pool, None
            self._arena = self._blocks = None
            self._sessions.clear()
        if pool is not None:
            pool.close()
        if engine is not None:
            engine.shutdown()


def _key(ref: PayloadRef) -> tuple:
    """What a lent receive buffer is filed under: the ref itself (its location is a list)."""
    return (ref.key, *ref.location)


def _write_bytes(view: torch.Tensor, src: memoryview) -> None:
    memoryview(view.numpy())[:] = src
