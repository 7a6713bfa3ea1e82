"""The connector contract: how heavy payloads travel between processes.

A producer publishes a tensor (or a bytes blob) with :meth:`Connector.put` and gets back a
:class:`PayloadRef`, a few dozen bytes that ride inside a control message (msgpack, via
:meth:`PayloadRef.to_wire`). The consumer turns the ref back into a tensor with
:meth:`Connector.get` and says it is done with :meth:`Connector.release`. The producer
frees everything a request still holds with :meth:`Connector.cleanup` (abort, failure).

A connector object is per process and role-agnostic: a producer uses put/cleanup on its
own storage, a consumer uses get/release on the storage of other processes.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any

import torch

from omni.wire.protocol import REF_MARKER  # first element of a wire ref

__all__ = [
    "BYTES_DTYPE", "REF_MARKER", "ArenaFullError", "Connector", "ConnectorError", "PayloadRef",
    "Payload", "dtype_from_name", "dtype_name",
]

BYTES_DTYPE = "bytes"  # PayloadRef.dtype of a bytes payload (shape == (nbytes,))
BACKENDS = ("inline", "shm", "cuda_ipc", "zmq", "mooncake")
# Types of a ref's location fields, in order (i = int, b = bytes, s = str), per backend
# whose location is a flat list (see each backend's module).
LOCATION_TYPES = {
    "shm": "siii",  # arena segment, offset, first block, tag
    "cuda_ipc": "ibiibibbiii",
    "zmq": "si",  # producer's data socket endpoint, producer instance nonce
    "mooncake": "siiii",  # producer's transfer-engine session, buffer base, offset, block, tag
}
CUDA_IPC_LOCATION = LOCATION_TYPES["cuda_ipc"]
_TYPES = {"i": int, "b": bytes, "s": str}

Payload = torch.Tensor | bytes | bytearray | memoryview

# Dtypes a ref may name: what torch.frombuffer can view and copy_ can fill. Sub-byte,
# quantized and "bits" dtypes are left out (no element-wise byte layout to rebuild).
_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.uint16, torch.uint32, torch.uint64,
        torch.float16, torch.bfloat16, torch.float32, torch.float64,
        torch.complex32, torch.complex64, torch.complex128,
    )
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if isinstance(getattr(torch, _name, None), torch.dtype):
        _DTYPES[_name] = getattr(torch, _name)


class ConnectorError(Exception):
    """A payload cannot be published or read (bad ref, too large, producer gone, ...)."""


class ArenaFullError(ConnectorError):
    """The producer's storage stayed full for the whole bounded wait (backpressure)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``; raises ConnectorError for unsupported dtypes."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConnectorError(f"dtype {dtype} cannot travel through a connector")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except (KeyError, TypeError):
        raise ConnectorError(f"unknown payload dtype {name!r}") from None


def _item_size(dtype: str) -> int:
    return 1 if dtype == BYTES_DTYPE else dtype_from_name(dtype).itemsize


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """A handle to one published payload; small enough to ride in a control message.

    ``location`` depends on the backend:
      - ``inline``: the payload bytes themselves;
      - ``shm``: ``[segment_name, offset, block_index, tag]``: the producer's arena, the
        byte offset of the payload in it, the first block of its run and the run's
        generation tag (1..255) that ``release`` writes back (see shm.py).
      - ``cuda_ipc``: the producer's CUDA pool (IPC handle and the fields torch needs to
        open it, flag segment name) + ``offset, block_index, tag`` (see cuda_ipc.py).
      - ``zmq``: ``[endpoint, nonce]``: the producer's data socket (tcp://HOST:PORT) and
        the producer instance it belongs to; the payload is fetched by ``key`` (zmq_data.py).
      - ``mooncake``: ``[session, base, offset, block_index, tag]``: the producer's
        transfer-engine session (HOST:PORT), its registered arena's address, and the
        payload's place in it, as for shm (mooncake.py).
    """

    backend: str
    key: str
    owner: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    location: Any

    def to_wire(self) -> list:
        """A msgpack-able list: ``[REF_MARKER, backend, key, owner, dtype, shape, nbytes,
        location]``."""
        return [REF_MARKER, self.backend, self.key, self.owner, self.dtype, list(self.shape),
                self.nbytes, self.location]

    @staticmethod
    def is_ref(obj: Any) -> bool:
        """Is this wire value (a decoded msgpack value) a PayloadRef list?"""
        return isinstance(obj, list | tuple) and len(obj) == 8 and obj[0] == REF_MARKER

    @classmethod
    def from_wire(cls, data: Any) -> PayloadRef:
        """Rebuild a ref from :meth:`to_wire`'s list; ValueError on anything malformed.

        Checks everything a consumer relies on before touching memory: the backend, the
        dtype, a shape of non-negative ints whose size matches ``nbytes``, and the shape of
        ``location`` for the backend (the shm backend checks bounds against the arena).
        """
        if not cls.is_ref(data):
            raise ValueError(f"not a payload ref: {_short(data)}")
        _, backend, key, owner, dtype, shape, nbytes, location = data
        if backend not in BACKENDS:
            raise ValueError(f"payload ref: unknown backend {_short(backend)}")
        if not isinstance(key, str) or not isinstance(owner, str):
            raise ValueError("payload ref: key and owner must be strings")
        if not isinstance(dtype, str) or (dtype != BYTES_DTYPE and dtype not in _DTYPES):
            raise ValueError(f"payload ref: unknown dtype {_short(dtype)}")
        if not isinstance(shape, list | tuple) or not all(
                type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"payload ref: bad shape {_short(shape)}")
        shape = tuple(shape)
        if type(nbytes) is not int or nbytes != math.prod(shape) * _item_size(dtype):
            raise ValueError(f"payload ref: nbytes {_short(nbytes)} does not match "
                             f"shape {shape} of {dtype}")
        if dtype == BYTES_DTYPE and len(shape) != 1:
            raise ValueError("payload ref: a bytes payload has a 1-d shape")
        if backend == "inline":
            if not isinstance(location, bytes) or len(location) != nbytes:
                raise ValueError("payload ref: inline location must hold nbytes bytes")
        else:
            types = LOCATION_TYPES[backend]
            if not (isinstance(location, list | tuple) and len(location) == len(types)
                    and all(type(v) is _TYPES[t]
                            for v, t in zip(location, types, strict=True))):
                raise ValueError(f"payload ref: bad {backend} location {_short(location)}")
            location = list(location)
        return cls(backend, key, owner, dtype, shape, nbytes, location)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class Connector(abc.ABC):
    """Publishes payloads (producer side) and reads them back (consumer side)."""

    backend: str = ""

    @abc.abstractmethod
    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        """Publish ``value`` for request ``owner``. Tensors keep dtype and shape (made
        contiguous, moved to CPU); bytes-like values come back as ``bytes``. May block up to
        ``timeout_s`` when the storage is full (backpressure), then raise ArenaFullError."""

    @abc.abstractmethod
    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        """Consumer side: the payload. A tensor may be a view valid only until
        :meth:`release` or :meth:`forget` of the ref: for shm a zero-copy view of the
        producer's arena (after release the producer may reuse it), for mooncake a view of
        a receive buffer (after release the next get may reuse it). Copy what must
        outlive the release."""

    @abc.abstractmethod
    def release(self, ref: PayloadRef) -> None:
        """Consumer side: done with the payload; the producer may reuse its memory."""

    def forget(self, ref: PayloadRef) -> None:
        """Consumer side: done with the payload, which is NOT released (an abort: its
        producer frees it with :meth:`cleanup`); local memory the get lent goes back.
        Backends whose gets lend none (all but mooncake) have nothing to do."""
        return None

    @abc.abstractmethod
    def cleanup(self, owner: str) -> int:
        """Producer side: free every payload of request ``owner`` (released or not);
        returns how many were freed."""

    @abc.abstractmethod
    def health(self) -> dict[str, Any]:
        """Capacity, bytes and blocks in use, counters."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free what this process owns (producer storage) and drop attachments."""

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_bytes_view(value: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of a bytes-like value (no copy)."""
    view = memoryview(value)
    if not view.c_contiguous:
        raise ConnectorError("a memoryview payload must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def cpu_tensor(value: torch.Tensor) -> torch.Tensor:
    """Detached CPU tensor of a supported dtype (not necessarily contiguous)."""
    dtype_name(value.dtype)
    if value.is_sparse or value.layout != torch.strided:
        raise ConnectorError(f"only strided tensors can travel (got {value.layout})")
    return value.detach().cpu() if value.device.type != "cpu" else value.detach()
