"""Numpy arrays inside request inputs, as msgpack carries them over the control plane.

An array travels as ``[ARRAY_MARKER, dtype.str, shape, bytes]`` (a list, as a payload ref
does with its own marker): the front end packs the arrays of an observation
(`pack_tree`), the engine's adapter unpacks them (`unpack_tree`). Object, void and complex
dtypes are refused: they have no portable byte form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ARRAY_MARKER = "\x00nd"
_REFUSED_KINDS = "OVc"


def pack(array: np.ndarray) -> list:
    if array.dtype.kind in _REFUSED_KINDS:
        raise ValueError(f"arrays of dtype {array.dtype} cannot be sent")
    return [ARRAY_MARKER, array.dtype.str, list(array.shape),
            np.ascontiguousarray(array).tobytes()]


def is_packed(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 4 and value[0] == ARRAY_MARKER


def unpack(value: list) -> np.ndarray:
    """A packed array (read-only, over the message's bytes); ValueError if malformed."""
    _, dtype, shape, data = value
    try:
        dt = np.dtype(dtype)
        if dt.kind in _REFUSED_KINDS:
            raise TypeError(f"dtype {dt} is refused")
        return np.frombuffer(data, dtype=dt).reshape([int(n) for n in shape])
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed array ({dtype!r}, shape {shape!r}): {e}") from None


def pack_tree(obj: Any) -> Any:
    """Every ndarray / numpy scalar inside dicts and lists, packed or made native."""
    if isinstance(obj, np.ndarray):
        return pack(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: pack_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [pack_tree(v) for v in obj]
    return obj


def unpack_tree(obj: Any) -> Any:
    if is_packed(obj):
        return unpack(obj)
    if isinstance(obj, dict):
        return {k: unpack_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unpack_tree(v) for v in obj]
    return obj
