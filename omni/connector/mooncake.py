"""Mooncake backend: a registered arena per producer, read by consumers through Mooncake's
transfer engine (TCP here; RDMA where a deployment has it), released by a remote write.

Layout of a producer's arena (one CPU buffer, registered with its engine once)::

    0    release flags: one byte per block (only the byte of a run's FIRST block is used)
    data_offset (page aligned): nblocks * block_size bytes of payload blocks

Producer: ``put`` copies the payload into a run of blocks (blocks.py, as shm.py) and
returns ``[session, base, offset, block, tag]``: its engine's ``HOST:RPC_PORT``, the
arena's address, the payload's offset, the run's first block and tag (shm.py says why).
Consumer: ``get`` reads ``base + offset`` with the engine's synchronous read into its own
registered staging buffer and returns an owned copy (staging is reused at once).
``release`` writes the tag into the flag byte at ``base + block`` (one-byte remote write
from a registered table whose byte t is t); the producer frees runs whose flag equals
their tag on its next put or health(), as shm does (BlockTable.reclaim).

Engine facts (mooncake-transfer-engine 0.3.13, TCP, measured on a 2-core box):
- ``initialize(host, "P2PHANDSHAKE", "tcp", "")``: no metadata server. The engine takes a
  random handshake/RPC port (``get_rpc_port()``; session = ``host:port``) and a random TCP
  data port, both bound to EVERY interface whatever ``host`` says (``host`` is only what
  peers are told). 2 threads per engine, +1 client I/O thread on its first transfer; no
  CPU when idle. Dropping the engine closes its ports and joins its threads, which takes
  ~1 s (one of them wakes once a second): close() blocks that long.
- A killed producer fails a read at once (connection refused, rc -1). A hung or
  black-holed one is the slow case: an open session gives up after
  MC_TCP_PROGRESS_TIMEOUT_SEC (default 30 s; we default it to ``io_timeout_s``), and a
  first contact's handshake waits a fixed 60 s, so each session is probed once
  (``send_probe``) on a helper thread with a bounded wait before it is used.
- TCP never checks that the local buffer is registered (RDMA does); staging is registered
  anyway so RDMA works unchanged.

Security: the engine's TCP transport has NO authentication and NO encryption. Anyone who
reaches its ports can read every registered byte of the arena and write into it (flags
included), and peers are not verified. Keep it on a private network (or host firewall) of
the deployment's own machines; the zmq backend (zmq_data.py, CURVE) is the authenticated
one and is what to use over any network you do not control.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
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
from omni.connector.shm_segment import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_PUT_TIMEOUT_S,
    PAGE,
    MiB,
)

# engine.so reads its log level once, when it loads: errors only unless the user chose
# (its info/warning lines on TCP are "no RDMA devices found" and the like).
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
from mooncake.engine import TransferEngine  # noqa: E402 (ImportError: make_connector says)

__all__ = ["DEFAULT_IO_TIMEOUT_S", "MooncakeConnector"]

log = logging.getLogger("omni.connector.mooncake")

DEFAULT_IO_TIMEOUT_S = 5.0  # first contact (probe) and "no progress" on an open session
_MIN_STAGING = 1 * MiB
_USAGE_KEYS = ("capacity_bytes", "used_bytes", "payload_bytes", "blocks_total", "blocks_in_use",
               "payloads_in_use", "owners", "reclaimed", "cleaned_up")  # health, no arena


class _Engine:
    """One transfer engine and the buffers registered with it."""

    def __init__(self, host: str, protocol: str, device: str, io_timeout_s: float) -> None:
        # Read by initialize(), process-wide: the first engine of a process sets them.
        seconds = str(max(1, math.ceil(io_timeout_s)))
        for var in ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC"):
            os.environ.setdefault(var, seconds)
        self.te = TransferEngine()
        rc = self.te.initialize(host, "P2PHANDSHAKE", protocol, device)
        if rc != 0:
            raise ConnectorError(f"Mooncake transfer engine did not start on {host!r} "
                                 f"({protocol}, rc {rc})")
        self.session = f"{host}:{self.te.get_rpc_port()}"
        self.registered: list[int] = []
        # Peers' reads of the arena run on the engine's own threads and may still be
        # copying when close() unregisters it: pinned buffers live until the engine dies.
        self._pinned: list[torch.Tensor] = []
        weakref.finalize(self.te, self._pinned.clear)

    def register(self, buf: torch.Tensor, *, pin: bool = False) -> int:
        rc = self.te.register_memory(buf.data_ptr(), buf.numel())
        if rc != 0:
            raise ConnectorError(f"Mooncake could not register {buf.numel()} bytes (rc {rc})")
        self.registered.append(buf.data_ptr())
        if pin:
            self._pinned.append(buf)
        return buf.data_ptr()

    def unregister(self, addr: int) -> None:
        self.registered.remove(addr)
        self.te.unregister_memory(addr)

    def probe(self, session: str, timeout_s: float) -> int | None:
        """send_probe on a helper thread: its rc, or None when the peer did not answer in
        time (a hung peer's handshake blocks for 60 s and cannot be cancelled)."""
        te, done, result = self.te, threading.Event(), []

        def run() -> None:
            result.append(te.send_probe(session))
            done.set()

        threading.Thread(target=run, name="omni-mooncake-probe", daemon=True).start()
        return result[0] if done.wait(timeout_s) else None

    def shutdown(self) -> None:
        for addr in list(self.registered):
            self.unregister(addr)
        self.te = None  # the engine's destructor joins its threads, then pinned are freed


class MooncakeConnector(Connector):
    """Producer arena (created on first put) + consumer staging, over one lazily started
    transfer engine listening on ``host`` (an address the other hosts reach)."""

    backend = "mooncake"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, host: str = "127.0.0.1",
                 protocol: str = "tcp", device: str = "",
                 io_timeout_s: float = DEFAULT_IO_TIMEOUT_S) -> None:
        if block_size <= 0 or block_size % 64:
            raise ConnectorError(f"block_size must be a positive multiple of 64, got {block_size}")
        if capacity_bytes <= 0:
            raise ConnectorError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if host in ("", "0.0.0.0", "::"):
            raise ConnectorError(f"mooncake host must be an address peers reach, got {host!r}")
        self.name = name
        self.capacity_bytes, self.block_size = capacity_bytes, block_size
        self.put_timeout_s, self.io_timeout_s = put_timeout_s, io_timeout_s
        self._engine_args = (host, protocol, device, io_timeout_s)
        self._lock = threading.Lock()  # producer: arena and block table
        self._read_lock = threading.Lock()  # consumer: the staging buffer
        self._start_lock = threading.Lock()
        self._engine: _Engine | None = None
        self._arena: torch.Tensor | None = None
        self._blocks: BlockTable | None = None
        self._data_offset = 0
        self._staging: torch.Tensor | None = None
        self._tags_addr = 0
        self._sessions: set[str] = set()  # peers that answered a probe
        self._counter = 0
        self._closed = False
        self._stats = dict.fromkeys(("puts", "gets", "releases", "release_failures",
                                     "full_waits", "full_errors"), 0)

    # -- engine --------------------------------------------------------------------------

    @property
    def session(self) -> str | None:
        return self._engine.session if self._engine else None

    def _started(self) -> _Engine:
        with self._start_lock:
            if self._closed:
                raise ConnectorError("connector is closed")
            if self._engine is None:
                engine = _Engine(*self._engine_args)
                tags = torch.arange(MAX_TAG + 1, dtype=torch.uint8)  # byte t holds t
                self._tags_addr = engine.register(tags, pin=True)
                self._engine = engine
            return self._engine

    def _reach(self, session: str) -> _Engine:
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
        """The payload, read from the producer: an owned tensor (or bytes), valid after
        release. ConnectorError naming the session when the producer is gone."""
        self._stats["gets"] += 1
        if ref.nbytes == 0:
            if ref.backend != "mooncake":
                raise ConnectorError(f"mooncake connector cannot read a {ref.backend!r} ref")
            return b"" if ref.dtype == BYTES_DTYPE else torch.empty(
                ref.shape, dtype=dtype_from_name(ref.dtype))
        session, base, offset, _, _ = self._place(ref)
        engine = self._reach(session)
        with self._read_lock:
            staging = self._staging_for(engine, ref.nbytes)
            rc = engine.te.transfer_sync_read(session, staging.data_ptr(), base + offset,
                                              ref.nbytes)
            if rc != 0:
                self._sessions.discard(session)  # probe again before the next use
                raise ConnectorError(f"mooncake read of {ref.key!r} ({ref.nbytes} bytes) "
                                     f"from {session} failed (rc {rc}): the producer exited, "
                                     f"is unreachable, or freed the payload")
            return _owned(staging[:ref.nbytes], ref)

    def _staging_for(self, engine: _Engine, nbytes: int) -> torch.Tensor:
        """The registered staging buffer, grown (doubling, whole MiBs) when too small:
        registering is cheap on TCP but pins memory on RDMA, so it happens once per size."""
        old = self._staging
        if old is None or old.numel() < nbytes:
            size = max(_MIN_STAGING, nbytes, 0 if old is None else 2 * old.numel())
            if old is not None:
                # Our own sync reads are done with it; no peer ever writes into staging.
                engine.unregister(old.data_ptr())
                self._staging = None
            staging = torch.empty(-(-size // MiB) * MiB, dtype=torch.uint8)
            engine.register(staging)
            self._staging = staging
        return self._staging

    def release(self, ref: PayloadRef) -> None:
        """Write the run's tag into its flag byte on the producer (a one-byte remote write).

        Releasing a ref that was never read is fine. A producer that is gone has nothing
        left to release: the failure is counted (``release_failures``) and logged, not
        raised, as for shm; a producer that is only cut off keeps the blocks until
        ``cleanup(owner)`` runs there.
        """
        if ref.nbytes == 0:
            return
        session, base, _, block, tag = self._place(ref)
        try:
            engine = self._reach(session)
            rc = engine.te.transfer_sync_write(session, self._tags_addr + tag, base + block, 1)
            why = f"rc {rc}"
        except ConnectorError as exc:  # not reachable (or closed)
            rc, why = -1, str(exc)
        if rc != 0:
            self._sessions.discard(session)
            self._stats["release_failures"] += 1
            log.warning("mooncake release of %r to %s failed (%s)", ref.key, session, why)
            return
        self._stats["releases"] += 1

    # -- both ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "backend": "mooncake", "session": self.session, "block_size": self.block_size,
                "sessions_reached": len(self._sessions),
                "staging_bytes": 0 if self._staging is None else self._staging.numel(),
                **self._stats}
            blocks = self._blocks
            if blocks is None:
                return out | dict.fromkeys(_USAGE_KEYS, 0)
            blocks.reclaim()  # first, so the counters below include it
            out.update(blocks.usage(self.block_size), reclaimed=blocks.reclaimed,
                       cleaned_up=blocks.cleaned_up)
            return out

    def close(self) -> None:
        """Unregister everything and stop the engine (its ports close; consumers' reads
        then fail at once). The arena is freed once the engine is gone. Idempotent."""
        with self._lock, self._start_lock, self._read_lock:  # put's order
            if self._closed:
                return
            self._closed = True
            engine, self._engine = self._engine, None
            self._arena = self._blocks = self._staging = None
            self._sessions.clear()
        if engine is not None:
            engine.shutdown()


def _write_bytes(view: torch.Tensor, src: memoryview) -> None:
    memoryview(view.numpy())[:] = src


def _owned(data: torch.Tensor, ref: PayloadRef) -> torch.Tensor | bytes:
    """A copy out of staging that owns its memory (staging is reused by the next get)."""
    if ref.dtype == BYTES_DTYPE:
        return data.numpy().tobytes()
    return data.view(dtype_from_name(ref.dtype)).reshape(ref.shape).clone()
