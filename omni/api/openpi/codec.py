"""openpi-client's wire encoding: msgpack with its numpy convention (protocols.md §7.3).

An ndarray is a map with ``bin`` keys {b"__ndarray__": True, b"data": bytes, b"dtype":
str, b"shape": [...]}; a numpy scalar {b"__npgeneric__": True, b"data": value, b"dtype":
str}. Written here (about 40 lines) rather than imported: openpi-client pins numpy<2.
Decoding checks what the client's own decoder does not (the byte count against the
shape) so a malformed frame is a clear error, never a crash.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

_REFUSED_KINDS = "VOc"  # void, object, complex: openpi refuses them too


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in _REFUSED_KINDS:
        raise ValueError(f"unsupported dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(),
                b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def _array(obj: dict) -> np.ndarray:
    data, dtype, shape = obj.get(b"data"), obj.get(b"dtype"), obj.get(b"shape")
    if not isinstance(data, bytes) or not isinstance(dtype, str) or not isinstance(
            shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError("an __ndarray__ needs bin data, a str dtype and a list shape")
    dt = _dtype(dtype)
    count = math.prod(shape)  # Python ints: a huge declared shape cannot wrap around
    if count * dt.itemsize != len(data):
        raise ValueError(f"array of shape {shape} and dtype {dtype} needs "
                         f"{count * dt.itemsize} bytes, got {len(data)}")
    return np.ndarray(buffer=data, dtype=dt, shape=shape)


def _dtype(name: Any) -> np.dtype:
    """A dtype a client may send: numeric or text, of a nonzero item size (a zero-size
    item would let any shape pass the byte count)."""
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError) as e:
        raise ValueError(f"unknown dtype {name!r}: {e}") from None
    if dt.kind in _REFUSED_KINDS or dt.itemsize == 0:
        raise ValueError(f"unsupported dtype {dt}")
    return dt


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return _array(obj)
    if b"__npgeneric__" in obj:
        dt = _dtype(obj.get(b"dtype"))
        try:
            return dt.type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"a {dt} scalar cannot hold {obj.get(b'data')!r}: {e}") from None
    return obj


def unpackb(frame: bytes) -> Any:
    """One client frame -> Python objects with ndarrays; ValueError when malformed."""
    try:
        return msgpack.unpackb(frame, object_hook=_unpack_hook, raw=False)
    except ValueError:
        raise
    except (TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ValueError(f"not a msgpack observation: {e}") from None
