"""CUDA IPC backend: GPU tensors handed between processes of one host, no host copy.

Producer: ONE pooled device buffer (``torch.empty(capacity, uint8, device)``), created on
the first put/reserve, cut into blocks exactly like the shm arena (first fit over a
byte-per-block map, runs, per-start-block generation tags). Its CUDA IPC handle is exported
ONCE (``UntypedStorage._share_cuda_()``, what torch.multiprocessing's reduce_tensor calls)
and copied into every ref, so a ref is plain msgpack (bytes and ints), never a pickle.

Consumer: ``get`` opens the pool once per producer (``UntypedStorage._new_shared_cuda``,
what rebuild_cuda_tensor calls; cached by handle) and returns a zero-copy device view at
the ref's offset. ``release`` first synchronizes the consumer's current stream (its
kernels reading the view must be done before the producer may overwrite the blocks), then
writes the run's tag into a one-byte-per-block flag region: a small POSIX shared-memory
segment per producer (``<name>-cuda-<8 hex>``: ``cleanup_stale(name)`` finds it), same
protocol and memory-ordering argument as shm.py's flags. No control message per release.

Visibility of the payload before the ref leaves (``sync``):
- ``"event"`` (default): put copies on a private producer stream (after waiting for the
  caller's current stream, which in turn waits for the copy, so the caller may overwrite
  or free the source right away) and records ONE interprocess event per producer; the
  consumer's ``get`` makes its current stream wait on that event (opened once). Use the
  view on that stream, or synchronize. One event suffices: every record is on the same
  private stream, so the latest record (what cudaStreamWaitEvent waits for) comes after
  every earlier copy. The producer never blocks.
- ``"stream"``: put copies on the caller's current stream and synchronizes it, so the ref
  points at finished data whatever stream the consumer uses.
Why event is the default (bench/results/cuda_ipc.md, H200, put -> consumer kernel read
done, p50/p99): the copy overlaps the ref's trip through the pipe and the consumer's
wake-up instead of preceding them. 1 GiB: event 818/886 us vs stream 920/1206 us (stream
misses the 1 ms target at p99); 1-256 MiB: event 361-384 us p50 vs stream 431-540 us.

Device numbering: the consumer opens the pool on the device with the ref's index in ITS
numbering, so producer and consumer must see the same devices (CUDA_VISIBLE_DEVICES).
Lifetime: the producer owns the pool; ``close`` hands it back to its caching allocator
(see _Pool.close), so consumers release their views before the producer closes, as with
shm. Consumers keep the mapping (one cudaIpcOpenMemHandle) until their own close.
"""

from __future__ import annotations

import math
import secrets
import threading
from typing import Any

import torch

from omni.connector.base import (
    Connector,
    ConnectorError,
    Payload,
    PayloadRef,
    dtype_from_name,
    dtype_name,
)
from omni.connector.blocks import MAX_TAG, BlockTable, Run, allocate_waiting
from omni.connector.cuda_pool import (
    _FLAGS,
    BLOCK,
    DEVICE,
    FLAGS_NAME,
    HANDLE,
    OFFSET,
    POOL_OFFSET,
    TAG,
    _cuda_device,
    _Pool,
    _Remote,
)

__all__ = ["DEFAULT_CUDA_BLOCK_SIZE", "DEFAULT_CUDA_CAPACITY", "CudaIpcConnector"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_CUDA_BLOCK_SIZE = 256 * KiB
DEFAULT_CUDA_CAPACITY = 1 * GiB
DEFAULT_PUT_TIMEOUT_S = 5.0
SYNC_MODES = ("stream", "event")



class CudaIpcConnector(Connector):
    """Producer pool (created on first put/reserve) + consumer pool mappings.

    ``name`` prefixes the flag segment (``f"{name}-cuda-{8 hex}"``). ``device`` fixes the
    pool's device; by default it is the device of the first tensor put (or the current
    device for a first reserve). Only CUDA tensors travel: host tensors and bytes raise
    ConnectorError (use the shm or auto connector for those).
    """

    backend = "cuda_ipc"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CUDA_CAPACITY,
                 block_size: int = DEFAULT_CUDA_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, sync: str = "event",
                 device: torch.device | str | int | None = None) -> None:
        if not name or "/" in name or len(name) > 200:
            raise ConnectorError(f"bad shared-memory name prefix {name!r}")
        if block_size <= 0 or block_size % 512:
            raise ConnectorError(f"block_size must be a positive multiple of 512, got "
                                 f"{block_size}")
        if capacity_bytes <= 0:
            raise ConnectorError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if sync not in SYNC_MODES:
            raise ConnectorError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.block_size = block_size
        self.put_timeout_s = put_timeout_s
        self.sync = sync
        self.device = None if device is None else _cuda_device(device)
        self._lock = threading.Lock()
        self._pool: _Pool | None = None
        self._blocks: BlockTable | None = None  # the pool's runs (producer only)
        self._remotes: dict[tuple[bytes, int, bytes], _Remote] = {}
        self._counter = 0
        self._closed = False
        self._stats = dict.fromkeys(
            ("puts", "gets", "releases", "full_waits", "full_errors"), 0)

    # -- producer ------------------------------------------------------------------------

    def _pool_locked(self, device: torch.device | None) -> _Pool:
        if self._closed:
            raise ConnectorError("connector is closed")
        if self._pool is None:
            dev = self.device or device or _cuda_device(None)
            self._pool = _Pool(f"{self.name}-cuda-{secrets.token_hex(4)}", dev,
                               self.capacity_bytes, self.block_size, self.sync)
            # consumers' release flags live in the pool's host flag segment; writing one
            # after synchronizing the stream that read the payload orders the GPU side too
            self._blocks = BlockTable(self._pool.nblocks, self._pool.flags.buf, _FLAGS)
        elif device is not None and device != self._pool.device:
            raise ConnectorError(f"this producer's CUDA pool is on {self._pool.device}, got a "
                                 f"tensor on {device}; use one connector per device")
        return self._pool

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        if not isinstance(value, torch.Tensor) or value.device.type != "cuda":
            where = (f"a {value.device.type} tensor" if isinstance(value, torch.Tensor)
                     else f"a {type(value).__name__}")
            raise ConnectorError(f"the cuda_ipc connector carries CUDA tensors only, got "
                                 f"{where}; publish host data with the shm (or auto) connector")
        if value.is_sparse or value.layout != torch.strided:
            raise ConnectorError(f"only strided tensors can travel (got {value.layout})")
        src = value.detach()
        ref = self._allocate(dtype_name(src.dtype), tuple(src.shape),
                             src.numel() * src.element_size(), owner, timeout_s, src.device)
        if ref.nbytes:
            pool = self._pool
            try:
                if pool.stream is None:
                    # copy_ gathers a non-contiguous source straight into the slice (D2D).
                    self._view(ref).copy_(src)
                    # Visible before the ref leaves: the copy is done when this returns.
                    torch.cuda.current_stream(pool.device).synchronize()
                else:
                    current = torch.cuda.current_stream(pool.device)
                    pool.stream.wait_stream(current)  # src is written on the caller's stream
                    with torch.cuda.stream(pool.stream):
                        self._view(ref).copy_(src)
                    pool.ready.record(pool.stream)
                    # The caller may overwrite or free src right after put: its later work
                    # on the current stream is ordered after the copy (GPU-side, no block).
                    current.wait_stream(pool.stream)
            except BaseException:
                self._free_ref(ref)
                raise
        self._stats["puts"] += 1
        return ref

    def reserve(self, shape: tuple[int, ...] | list[int], dtype: torch.dtype, *, owner: str,
                timeout_s: float | None = None,
                device: torch.device | str | int | None = None,
                ) -> tuple[PayloadRef, torch.Tensor]:
        """Allocate a payload and return ``(ref, writable device view into the pool)``:
        the producer writes in place (zero copy), calls :meth:`ready`, then sends the ref."""
        shape = tuple(int(d) for d in shape)
        name = dtype_name(dtype)
        dev = None if device is None else _cuda_device(device)
        ref = self._allocate(name, shape, math.prod(shape) * dtype.itemsize, owner,
                             timeout_s, dev)
        self._stats["puts"] += 1
        if not ref.nbytes:
            return ref, torch.empty(shape, dtype=dtype, device=self._pool.device)
        return ref, self._view(ref)

    def ready(self) -> None:
        """After writing reserved views on the current stream, before sending their refs:
        ``stream`` mode synchronizes the current stream, ``event`` mode records the ready
        event behind it (consumers' get() waits for it)."""
        pool = self._pool
        if pool is None:
            return
        current = torch.cuda.current_stream(pool.device)
        if pool.stream is None:
            current.synchronize()
        else:
            pool.stream.wait_stream(current)
            pool.ready.record(pool.stream)

    def _view(self, ref: PayloadRef) -> torch.Tensor:
        offset = ref.location[OFFSET]
        return (self._pool.tensor[offset:offset + ref.nbytes]
                .view(dtype_from_name(ref.dtype)).view(ref.shape))

    def _allocate(self, dtype: str, shape: tuple[int, ...], nbytes: int, owner: str,
                  timeout_s: float | None, device: torch.device | None) -> PayloadRef:
        with self._lock:
            pool = self._pool_locked(device)
            self._counter += 1
            key = f"{owner}/{self._counter}"
            if nbytes == 0:
                return PayloadRef("cuda_ipc", key, owner, dtype, shape, 0,
                                  [*pool.wire, 0, -1, 0])
            need = -(-nbytes // pool.block_size)
            if need > pool.nblocks:
                raise ConnectorError(
                    f"payload of {nbytes} bytes for {owner!r} is larger than the whole CUDA "
                    f"pool ({pool.capacity} bytes); raise the connector capacity")
            run = self._blocks.find(need, owner, nbytes)
        if run is None:
            run = self._wait_for_room(need, nbytes, owner, timeout_s)
        return PayloadRef("cuda_ipc", key, owner, dtype, shape, nbytes,
                          [*pool.wire, run.start * pool.block_size, run.start, run.tag])

    def _wait_for_room(self, need: int, nbytes: int, owner: str,
                       timeout_s: float | None) -> Run:
        timeout = self.put_timeout_s if timeout_s is None else timeout_s
        return allocate_waiting(self._lock, self._blocks, need, owner, nbytes, timeout,
                                self._stats, f"CUDA pool {self._pool.name!r}",
                                self._pool.block_size)

    def _free_ref(self, ref: PayloadRef) -> None:
        with self._lock:
            if self._blocks is not None:
                self._blocks.free_start(ref.location[BLOCK])

    def cleanup(self, owner: str) -> int:
        with self._lock:
            return self._blocks.cleanup(owner) if self._blocks is not None else 0

    # -- consumer ------------------------------------------------------------------------

    def _remote(self, loc: list) -> _Remote:
        key = (loc[HANDLE], loc[POOL_OFFSET], loc[FLAGS_NAME])
        remote = self._remotes.get(key)
        if remote is None:
            with self._lock:
                if self._closed:
                    raise ConnectorError("connector is closed")
                remote = self._remotes.get(key)
                if remote is None:
                    remote = self._remotes[key] = _Remote(loc)
        return remote

    def _locate(self, ref: PayloadRef) -> tuple[_Remote, int, int]:
        if ref.backend != "cuda_ipc":
            raise ConnectorError(f"cuda_ipc connector cannot read a {ref.backend!r} ref")
        loc = ref.location
        remote = self._remote(loc)
        offset, block, tag = loc[OFFSET], loc[BLOCK], loc[TAG]
        if not (0 <= block < remote.nblocks and 1 <= tag <= MAX_TAG
                and offset == block * remote.block_size
                and offset + ref.nbytes <= remote.capacity):
            raise ConnectorError(f"payload ref {ref.key!r} points outside its CUDA pool "
                                 f"(block {block}, offset {offset}, {ref.nbytes} bytes)")
        return remote, offset, block

    def get(self, ref: PayloadRef) -> torch.Tensor:
        """A zero-copy device view into the producer's pool, valid until release(ref).
        Treat it as read-only. In ``event`` mode the current stream is made to wait for the
        producer's copy; use the view on that stream (or synchronize)."""
        self._stats["gets"] += 1
        if ref.nbytes == 0:
            if ref.backend != "cuda_ipc":
                raise ConnectorError(f"cuda_ipc connector cannot read a {ref.backend!r} ref")
            return torch.empty(ref.shape, dtype=dtype_from_name(ref.dtype),
                               device=torch.device("cuda", ref.location[DEVICE]))
        remote, offset, _ = self._locate(ref)
        if remote.ready is not None:
            torch.cuda.current_stream(remote.device).wait_event(remote.ready)
        return (remote.pool[offset:offset + ref.nbytes]
                .view(dtype_from_name(ref.dtype)).view(ref.shape))

    def release(self, ref: PayloadRef) -> None:
        """Synchronize the current stream (reads of the view done), then write the run's
        tag into its flag byte. Work on other streams must be synchronized by the caller."""
        if ref.nbytes == 0:
            return
        try:
            remote, _, block = self._locate(ref)
        except ConnectorError:
            key = (ref.location[HANDLE], ref.location[POOL_OFFSET], ref.location[FLAGS_NAME])
            if ref.backend == "cuda_ipc" and key not in self._remotes:
                return  # producer gone before we ever opened it: nothing to release
            raise
        torch.cuda.current_stream(remote.device).synchronize()
        remote.flags.buf[_FLAGS + block] = ref.location[TAG]
        self._stats["releases"] += 1

    # -- both ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            pool, blocks = self._pool, self._blocks
            out: dict[str, Any] = {"backend": "cuda_ipc", "sync": self.sync,
                                   "segment": pool.name if pool else None,
                                   "device": str(pool.device) if pool else None,
                                   "block_size": self.block_size,
                                   "attached_pools": len(self._remotes), **self._stats}
            if pool is None or blocks is None:
                out.update(capacity_bytes=0, used_bytes=0, payload_bytes=0, blocks_total=0,
                           blocks_in_use=0, payloads_in_use=0, owners=0, reclaimed=0,
                           cleaned_up=0)
                return out
            blocks.reclaim()
            out.update(blocks.usage(pool.block_size), reclaimed=blocks.reclaimed,
                       cleaned_up=blocks.cleaned_up)
            return out

    def close(self) -> None:
        """Producer: free the pool and unlink its flag segment. Consumer: drop every opened
        pool (views already handed out keep their storage alive). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            remotes, self._remotes = list(self._remotes.values()), {}
            pool, self._pool = self._pool, None
            self._blocks = None
        for remote in remotes:
            remote.close()
        if pool is not None:
            pool.close()


