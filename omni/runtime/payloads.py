"""The front side of the data plane: final outputs' refs become owned tensors."""

from __future__ import annotations

from typing import Any

from omni.payloads import PayloadPlane, has_ref
from omni.protocol import REF_MARKER


class ClientPayloads:
    """The API side of final outputs: copy each payload out, release it at once.

    The front end needs the bytes anyway (to encode audio, images), so it owns a copy and
    the producer's block goes back immediately; nothing here outlives the output.
    """

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        self.plane = PayloadPlane(name, options)

    def take(self, data: dict[str, Any] | None) -> dict[str, Any] | None:
        if data is None or not has_ref(data):
            return data
        return {key: self.plane.take(value)
                if isinstance(value, list) and value and value[0] == REF_MARKER else value
                for key, value in data.items()}

    def discard(self, data: dict[str, Any] | None) -> None:
        """An output nobody will read: give its payloads back unread."""
        if data is not None and has_ref(data):
            from omni.connector import PayloadRef

            for value in data.values():
                if isinstance(value, list) and value and value[0] == REF_MARKER:
                    self.plane.connector.release(PayloadRef.from_wire(value))

    def close(self) -> None:
        self.plane.close()
