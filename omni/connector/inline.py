"""Inline backend: the payload bytes ride inside the ref (and so inside the control message).

For small payloads (below the ``auto`` threshold, 64 KiB by default) a copy into the
message is cheaper than any shared-memory bookkeeping. Nothing is held anywhere, so
release and cleanup are no-ops.
"""

from __future__ import annotations

import math
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

__all__ = ["InlineConnector", "tensor_bytes"]


def tensor_bytes(value: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order, as bytes (one copy; any dtype incl. bf16)."""
    t = cpu_tensor(value).resolve_conj().resolve_neg().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


class InlineConnector(Connector):
    backend = "inline"

    def __init__(self, name: str = "inline") -> None:
        self.name = name
        self._counter = 0
        self._puts = self._gets = 0
        self._bytes_put = 0

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        self._counter += 1
        key = f"{owner}/{self._counter}"
        if isinstance(value, torch.Tensor):
            data = tensor_bytes(value)
            dtype, shape = dtype_name(value.dtype), tuple(value.shape)
        elif isinstance(value, bytes | bytearray | memoryview):
            data = as_bytes_view(value).tobytes()
            dtype, shape = BYTES_DTYPE, (len(data),)
        else:
            raise ConnectorError(f"cannot publish a {type(value).__name__}")
        self._puts += 1
        self._bytes_put += len(data)
        return PayloadRef("inline", key, owner, dtype, shape, len(data), data)

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        if ref.backend != "inline":
            raise ConnectorError(f"inline connector cannot read a {ref.backend!r} ref")
        self._gets += 1
        return rebuild(ref.dtype, ref.shape, ref.location)

    def release(self, ref: PayloadRef) -> None:
        pass

    def cleanup(self, owner: str) -> int:
        return 0

    def health(self) -> dict[str, Any]:
        return {"backend": "inline", "puts": self._puts, "gets": self._gets,
                "bytes_put": self._bytes_put}

    def close(self) -> None:
        pass


def rebuild(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor | bytes:
    """A writable tensor that owns its memory (one copy), or the bytes themselves."""
    if dtype == BYTES_DTYPE:
        return bytes(data)
    torch_dtype = dtype_from_name(dtype)
    count = math.prod(shape)
    if len(data) != count * torch_dtype.itemsize:
        raise ConnectorError(f"inline payload holds {len(data)} bytes, expected "
                             f"{count * torch_dtype.itemsize}")
    if count == 0:
        return torch.empty(shape, dtype=torch_dtype)
    # bytearray(): the copy, so the tensor is writable and owns (keeps alive) its memory.
    return torch.frombuffer(bytearray(data), dtype=torch_dtype, count=count).reshape(shape)
