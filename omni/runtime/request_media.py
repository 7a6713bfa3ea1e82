"""Request media through the payload plane: the front end as a producer.

Decoded audio (``pcm_s16le`` / ``pcm_f32le``), image and video files, and the arrays of a
robot's observation reach this process as bytes inside a request's inputs. Sent as they
are, they rode inside ADD messages: up to 9.6 MB per transcription through the control
socket, which is for small structs (DESIGN.md §4). Here each bytes value of at least
``PUBLISH_FROM`` bytes is put into this process's shared-memory arena, owned by the
request, and the message carries its PayloadRef; the engine's PayloadPlane.resolve turns
it back into bytes (a copy) before the engine sees it, so engines read what they read
before.

Lifetime: the consumer releases each ref when the request finishes there (before its last
OUTPUTS is sent), and `free` frees whatever the request still owns once every replica
that could read it has let go: at the end of a request, or after the answers to its
ABORT (omni/runtime/aborts.py). A stage on another host cannot map this arena: its
inputs keep their bytes inline.
"""

from __future__ import annotations

from typing import Any

from omni.errors import AdmissionError
from omni.wire.payloads import PayloadPlane, is_wire_ref

PUBLISH_FROM = 16 * 1024  # bytes: smaller values ride inline (a ref is ~100 bytes)


class RequestMedia:
    """Publishes large bytes of request inputs; frees them per request."""

    def __init__(self, name: str, local_stages: set[str]) -> None:
        self.plane = PayloadPlane(name, {"put": "shm"})
        self.local_stages = local_stages  # stages whose replicas can map this arena
        self._owners: set[str] = set()

    def for_stage(self, stage: str, owner: str, value: Any) -> Any:
        """`publish` for a stage on this host; the value as it is for one elsewhere."""
        return self.publish(owner, value) if stage in self.local_stages else value

    def publish(self, owner: str, value: Any) -> Any:
        """``value`` with each large bytes value (at any depth) replaced by a wire ref owned
        by ``owner``; refs already in it (upstream outputs) are left alone."""
        if isinstance(value, bytes | bytearray):
            if len(value) < PUBLISH_FROM:
                return value
            self._owners.add(owner)
            return self._put(owner, value)
        if isinstance(value, dict):
            return {k: self.publish(owner, v) for k, v in value.items()}
        if isinstance(value, list | tuple) and not is_wire_ref(value):
            return [self.publish(owner, v) for v in value]
        return value

    def _put(self, owner: str, value: bytes | bytearray) -> list:
        from omni.connector import ConnectorError

        try:  # never waits for room: this runs on the event loop
            return self.plane.connector.shm.put(value, owner=owner, timeout_s=0).to_wire()
        except ConnectorError as exc:  # full (or, at shutdown, closed)
            raise AdmissionError(f"the server's buffer for request media is full ({exc}); "
                                 "retry shortly") from None

    def free(self, owner: str) -> None:
        """No replica reads ``owner``'s media any more: free its blocks."""
        if owner in self._owners:
            self._owners.discard(owner)
            self.plane.free(owner)

    def held(self) -> int:
        """Requests whose media are still in the arena (tests and health)."""
        return len(self._owners)

    def stats(self) -> dict[str, Any]:
        return self.plane.stats()

    def close(self) -> None:
        self._owners.clear()
        self.plane.close()
