"""Data plane: connectors move heavy payloads between processes; refs ride in messages.

``make_connector(kind, ...)`` builds the per-process connector of one backend:

- ``inline``: bytes inside the ref (small payloads);
- ``shm``: one pre-faulted shared-memory arena per producer (see shm.py);
- ``cuda_ipc``: CUDA tensors through one exported device pool per producer (cuda_ipc.py);
- ``auto``: inline below ``inline_threshold`` bytes (CUDA tensors too), then cuda_ipc for
  CUDA tensors and shm for the rest. Its get/release read refs of every backend, so a
  consumer can hold one ``auto`` connector for all edges. Small CUDA tensors go inline
  because a consumer holds what it received until its request ends: one hidden-state row
  per generated token, each in its own 256 KiB pool block, filled the 1 GiB pool at 8
  concurrent 900-token answers on an H200 (the producer then blocked on backpressure).
"""

from __future__ import annotations

from typing import Any

import torch

from omni.connector.base import (
    ArenaFullError,
    Connector,
    ConnectorError,
    Payload,
    PayloadRef,
)
from omni.connector.cuda_ipc import CudaIpcConnector
from omni.connector.inline import InlineConnector
from omni.connector.shm import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_PUT_TIMEOUT_S,
    ShmConnector,
    cleanup_stale,
)

__all__ = [
    "DEFAULT_INLINE_THRESHOLD", "ArenaFullError", "AutoConnector", "Connector",
    "ConnectorError", "CudaIpcConnector", "InlineConnector", "PayloadRef", "ShmConnector",
    "cleanup_stale", "make_connector",
]

DEFAULT_INLINE_THRESHOLD = 64 * 1024
KINDS = ("auto", "inline", "shm", "cuda_ipc")  # config.CONNECTORS also names tcp (later)


def _nbytes(value: Payload) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return memoryview(value).nbytes


class AutoConnector(Connector):
    """Inline below the threshold; at or above it, cuda_ipc for CUDA tensors, else shm;
    reads refs of every backend."""

    backend = "auto"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S) -> None:
        self.inline_threshold = inline_threshold
        self.inline = InlineConnector(name)
        self.shm = ShmConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                                put_timeout_s=put_timeout_s)
        self.cuda_ipc = CudaIpcConnector(name, put_timeout_s=put_timeout_s)  # pool on 1st put

    def _for(self, ref: PayloadRef) -> Connector:
        if ref.backend == "inline":
            return self.inline
        if ref.backend == "shm":
            return self.shm
        if ref.backend == "cuda_ipc":
            return self.cuda_ipc
        raise ConnectorError(f"no connector for backend {ref.backend!r}")

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        if _nbytes(value) < self.inline_threshold:
            target = self.inline
        elif isinstance(value, torch.Tensor) and value.is_cuda:
            target = self.cuda_ipc
        else:
            target = self.shm
        return target.put(value, owner=owner, timeout_s=timeout_s)

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        return self._for(ref).get(ref)

    def release(self, ref: PayloadRef) -> None:
        self._for(ref).release(ref)

    def cleanup(self, owner: str) -> int:
        return self.shm.cleanup(owner) + self.cuda_ipc.cleanup(owner)

    def detach(self, prefix: str) -> int:
        return self.shm.detach(prefix)

    def health(self) -> dict[str, Any]:
        return {"backend": "auto", "inline_threshold": self.inline_threshold,
                "inline": self.inline.health(), "shm": self.shm.health(),
                "cuda_ipc": self.cuda_ipc.health()}

    def close(self) -> None:
        self.shm.close()
        self.cuda_ipc.close()
        self.inline.close()


def make_connector(kind: str, *, name: str, capacity_bytes: int = DEFAULT_CAPACITY,
                   inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
                   block_size: int = DEFAULT_BLOCK_SIZE,
                   put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S) -> Connector:
    """The connector of backend ``kind`` for this process; ``name`` prefixes its shm arena
    (e.g. ``f"omni-{launch_id}-{replica}"``). Creating it allocates nothing: the producer
    arena is created on the first shm put (or ``ShmConnector.open_arena()``)."""
    if kind == "inline":
        return InlineConnector(name)
    if kind == "shm":
        return ShmConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                            put_timeout_s=put_timeout_s)
    if kind == "auto":
        return AutoConnector(name, capacity_bytes=capacity_bytes,
                             inline_threshold=inline_threshold, block_size=block_size,
                             put_timeout_s=put_timeout_s)
    if kind == "cuda_ipc":
        return CudaIpcConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                                put_timeout_s=put_timeout_s)
    if kind == "tcp":
        raise ConnectorError(f"connector backend {kind!r} is not implemented yet")
    raise ConnectorError(f"unknown connector kind {kind!r} (known: {', '.join(KINDS)})")
