"""Shared-memory backend: one pre-faulted arena per producer, block allocation, release flags.

Layout of an arena (one POSIX shared-memory segment, ``/dev/shm/<name>-<8 hex>``)::

    0    header: magic "OMNISHM1", version, block_size, nblocks, data_offset, capacity
    64   release flags: one byte per block (only the byte of a run's FIRST block is used)
    data_offset (page aligned): nblocks * block_size bytes of payload blocks

Producer (the process that owns the arena): ``put`` takes ``ceil(nbytes / block_size)``
contiguous blocks, copies the payload in and returns a ref ``[segment, offset, block, tag]``.
Consumer (any process that received the ref): ``get`` maps the segment once (cached) and
returns a zero-copy tensor view; ``release`` writes the run's ``tag`` into the run's flag
byte, in the consumer's own mapping. No control message per release: the producer notices
the flag the next time it allocates (``put``) or reports (``health``) and frees the run.

Why a tag and not a plain "released" bit: a consumer may release a ref *after* the
producer already freed that run through ``cleanup(owner)`` (abort races) and re-used the
blocks for another payload. The producer keeps a per-start-block generation counter
(1..255) and only honours a flag byte equal to the live run's tag, so a late release of
an old run is ignored. (It could be mistaken only if the same start block was handed out
exactly a multiple of 255 times between the allocation and the late release.)
"""

from __future__ import annotations

import math
import secrets
import threading
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
    _FLAGS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_PUT_TIMEOUT_S,
    _Arena,
    _close_mapping,
    _Mapping,
    cleanup_stale,
    drop_unlinked,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE", "DEFAULT_CAPACITY", "DEFAULT_PUT_TIMEOUT_S", "ShmConnector",
    "cleanup_stale",
]

class ShmConnector(Connector):
    """Producer arena (created on first put, or by :meth:`open_arena`) + consumer mappings.

    ``name`` is the segment prefix (e.g. ``f"omni-{launch_id}-{replica}"``); the segment is
    ``f"{name}-{8 hex}"`` so a restarted replica never collides with (or is confused with) a
    predecessor's segment that is still mapped somewhere, and ``cleanup_stale(name)`` finds it.
    """

    backend = "shm"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S,
                 prefault_attach: bool = True) -> None:
        if not name or "/" in name or len(name) > 200:
            raise ConnectorError(f"bad shared-memory name prefix {name!r}")
        if block_size <= 0 or block_size % 64:
            raise ConnectorError(f"block_size must be a positive multiple of 64, got "
                                 f"{block_size}")
        if capacity_bytes <= 0:
            raise ConnectorError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.block_size = block_size
        self.put_timeout_s = put_timeout_s
        self.prefault_attach = prefault_attach
        self._lock = threading.Lock()
        self._arena: _Arena | None = None
        self._blocks: BlockTable | None = None  # the arena's runs (producer only)
        self._mappings: dict[str, _Mapping] = {}
        self._counter = 0
        self._closed = False
        self._stats = dict.fromkeys(
            ("puts", "gets", "releases", "full_waits", "full_errors"), 0)

    # -- producer ------------------------------------------------------------------------

    @property
    def segment_name(self) -> str | None:
        return self._arena.name if self._arena else None

    def open_arena(self) -> str:
        """Create (and pre-fault) this producer's arena now; returns the segment name."""
        with self._lock:
            return self._open_arena_locked().name

    def _open_arena_locked(self) -> _Arena:
        if self._closed:
            raise ConnectorError("connector is closed")
        if self._arena is None:
            arena = _Arena(f"{self.name}-{secrets.token_hex(4)}", self.capacity_bytes,
                           self.block_size)
            self._blocks = BlockTable(arena.nblocks, arena.buf, _FLAGS)
            self._arena = arena
        return self._arena

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        if isinstance(value, torch.Tensor):
            src = cpu_tensor(value)
            ref = self._allocate(dtype_name(src.dtype), tuple(src.shape),
                                 src.numel() * src.element_size(), owner, timeout_s)
            if ref.nbytes:
                try:
                    # One pass: copy_ gathers a non-contiguous source (transposed, stepped
                    # slices, conj/neg views) straight into the contiguous destination.
                    self._view(ref).copy_(src)
                except BaseException:
                    self._free_ref(ref)
                    raise
        elif isinstance(value, bytes | bytearray | memoryview):
            src_bytes = as_bytes_view(value)
            ref = self._allocate(BYTES_DTYPE, (src_bytes.nbytes,), src_bytes.nbytes, owner,
                                 timeout_s)
            if ref.nbytes:
                offset = ref.location[1]
                self._arena.buf[offset:offset + ref.nbytes] = src_bytes
        else:
            raise ConnectorError(f"cannot publish a {type(value).__name__}")
        self._stats["puts"] += 1
        return ref

    def reserve(self, shape: tuple[int, ...] | list[int], dtype: torch.dtype, *, owner: str,
                timeout_s: float | None = None) -> tuple[PayloadRef, torch.Tensor]:
        """Allocate a payload and return ``(ref, writable view)``: the producer writes the
        tensor in place (no copy into the arena), then sends the ref. Freed like a put."""
        shape = tuple(int(d) for d in shape)
        name = dtype_name(dtype)
        ref = self._allocate(name, shape, math.prod(shape) * dtype.itemsize, owner, timeout_s)
        self._stats["puts"] += 1
        if not ref.nbytes:
            return ref, torch.empty(shape, dtype=dtype)
        return ref, self._view(ref)

    def _view(self, ref: PayloadRef) -> torch.Tensor:
        dtype = dtype_from_name(ref.dtype)
        return torch.frombuffer(self._arena.buf, dtype=dtype, count=math.prod(ref.shape),
                                offset=ref.location[1]).view(ref.shape)

    def _allocate(self, dtype: str, shape: tuple[int, ...], nbytes: int, owner: str,
                  timeout_s: float | None) -> PayloadRef:
        with self._lock:
            arena = self._open_arena_locked()
            self._counter += 1
            key = f"{owner}/{self._counter}"
            if nbytes == 0:  # nothing to hold: no blocks, nothing to release
                return PayloadRef("shm", key, owner, dtype, shape, 0,
                                  [arena.name, arena.data_offset, -1, 0])
            need = -(-nbytes // arena.block_size)
            if need > arena.nblocks:
                raise ConnectorError(
                    f"payload of {nbytes} bytes for {owner!r} is larger than the whole shm "
                    f"arena {arena.name!r} ({arena.nblocks * arena.block_size} bytes); raise "
                    f"the connector capacity")
            run = self._blocks.find(need, owner, nbytes)
        if run is None:
            run = self._wait_for_room(need, nbytes, owner, timeout_s)
        return PayloadRef("shm", key, owner, dtype, shape, nbytes,
                          [arena.name, arena.data_offset + run.start * arena.block_size,
                           run.start, run.tag])

    def _wait_for_room(self, need: int, nbytes: int, owner: str,
                       timeout_s: float | None) -> Run:
        timeout = self.put_timeout_s if timeout_s is None else timeout_s
        return allocate_waiting(self._lock, self._blocks, need, owner, nbytes, timeout,
                                self._stats, f"shm arena {self._arena.name!r}",
                                self.block_size)

    def _free_ref(self, ref: PayloadRef) -> None:
        with self._lock:
            if self._blocks is not None:
                self._blocks.free_start(ref.location[2])

    def cleanup(self, owner: str) -> int:
        with self._lock:
            return self._blocks.cleanup(owner) if self._blocks is not None else 0

    # -- consumer ------------------------------------------------------------------------

    def _mapping(self, segment: str) -> _Mapping:
        mapping = self._mappings.get(segment)
        if mapping is None:
            with self._lock:
                if self._closed:
                    raise ConnectorError("connector is closed")
                mapping = self._mappings.get(segment)
                if mapping is None:
                    drop_unlinked(self._mappings)  # e.g. a restarted producer's old arena
                    mapping = self._mappings[segment] = _Mapping(segment, self.prefault_attach)
        return mapping

    def _locate(self, ref: PayloadRef) -> tuple[_Mapping, int, int]:
        if ref.backend != "shm":
            raise ConnectorError(f"shm connector cannot read a {ref.backend!r} ref")
        segment, offset, block, tag = ref.location
        mapping = self._mapping(segment)
        if not (0 <= block < mapping.nblocks and 1 <= tag <= MAX_TAG
                and offset == mapping.data_offset + block * mapping.block_size
                and offset + ref.nbytes <= mapping.size):
            raise ConnectorError(f"payload ref {ref.key!r} points outside arena {segment!r} "
                                 f"(block {block}, offset {offset}, {ref.nbytes} bytes)")
        return mapping, offset, block

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        """A zero-copy tensor view into the producer's arena, valid until release(ref).

        Treat it as read-only. Bytes payloads come back as ``bytes`` (one copy): they are
        small blobs (encoded audio/images, JSON) that callers keep or hand on after release,
        and a memoryview would pin the mapping and silently change when the blocks are reused.
        """
        self._stats["gets"] += 1
        if ref.nbytes == 0:
            if ref.backend != "shm":
                raise ConnectorError(f"shm connector cannot read a {ref.backend!r} ref")
            if ref.dtype == BYTES_DTYPE:
                return b""
            return torch.empty(ref.shape, dtype=dtype_from_name(ref.dtype))
        mapping, offset, _ = self._locate(ref)
        if ref.dtype == BYTES_DTYPE:
            return bytes(mapping.buf[offset:offset + ref.nbytes])
        return torch.frombuffer(mapping.buf, dtype=dtype_from_name(ref.dtype),
                                count=math.prod(ref.shape), offset=offset).view(ref.shape)

    def release(self, ref: PayloadRef) -> None:
        """Write the run's tag into its flag byte (one byte store; see BlockTable.reclaim).

        Releasing a ref that was never read is fine (the consumer dropped it); releasing
        after the producer is gone is a no-op.
        """
        if ref.nbytes == 0:
            return
        try:
            mapping, _, block = self._locate(ref)
        except ConnectorError:
            if ref.backend == "shm" and ref.location[0] not in self._mappings:
                return  # the arena is gone: nothing left to release
            raise
        mapping.buf[_FLAGS + block] = ref.location[3]
        self._stats["releases"] += 1

    def detach(self, prefix: str) -> int:
        """Drop cached mappings of segments whose name starts with ``prefix`` (a producer
        that died or was replaced: its memory is freed only once nobody maps it)."""
        with self._lock:
            names = [n for n in self._mappings if n.startswith(prefix)]
            for name in names:
                _close_mapping(self._mappings.pop(name).shm)
        return len(names)

    # -- both ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._lock:
            blocks = self._blocks
            out: dict[str, Any] = {"backend": "shm", "segment": self.segment_name,
                                   "block_size": self.block_size,
                                   "attached_segments": len(self._mappings), **self._stats}
            if blocks is None:
                out.update(capacity_bytes=0, used_bytes=0, payload_bytes=0, blocks_total=0,
                           blocks_in_use=0, payloads_in_use=0, owners=0, reclaimed=0,
                           cleaned_up=0)
                return out
            blocks.reclaim()  # first, so the counters below include it
            out.update(blocks.usage(self.block_size), reclaimed=blocks.reclaimed,
                       cleaned_up=blocks.cleaned_up)
            return out

    def close(self) -> None:
        """Producer: unlink the arena (consumers' existing mappings stay valid until they
        close them). Consumer: unmap every attached arena. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            mappings, self._mappings = list(self._mappings.values()), {}
            arena, self._arena = self._arena, None
            self._blocks = None
        for mapping in mappings:
            _close_mapping(mapping.shm)
        if arena is not None:
            arena.close(unlink=True)


