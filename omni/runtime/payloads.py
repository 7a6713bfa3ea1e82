"""The front side of the data plane: final outputs' refs become owned tensors."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from omni.payloads import PayloadPlane, has_ref
from omni.protocol import REF_MARKER

# backends whose get is a network round trip (a fetch from another host), not a memcpy
REMOTE_BACKENDS = ("zmq", "mooncake")


class ClientPayloads:
    """The API side of final outputs: copy each payload out, release it at once.

    The front end needs the bytes anyway (to encode audio, images), so it owns a copy and
    the producer's block goes back immediately; nothing here outlives the output.

    Outputs of a replica on another host are fetched on one worker thread (`take_async`):
    a 64 MiB fetch takes tens of milliseconds, which on the event loop would stall every
    other request's streaming. One thread, because the remote connectors' sockets are
    not thread-safe: every get and release of a remote ref runs there. Such an output
    holds only remote and inline refs (a remote replica puts nothing in shared memory).
    """

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        self.plane = PayloadPlane(name, options)
        self._remote_worker: ThreadPoolExecutor | None = None

    def _worker(self) -> ThreadPoolExecutor:
        if self._remote_worker is None:
            self._remote_worker = ThreadPoolExecutor(1, thread_name_prefix="omni-fetch")
        return self._remote_worker

    async def take_async(self, data: dict[str, Any] | None) -> dict[str, Any] | None:
        """`take`, off the event loop when a payload must come from another host."""
        if not _has_remote_ref(data):
            return self.take(data)
        return await asyncio.get_running_loop().run_in_executor(self._worker(), self.take, data)

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

            release = self.plane.connector.release
            for value in _refs(data):
                ref = PayloadRef.from_wire(value)
                if ref.backend in REMOTE_BACKENDS:
                    self._worker().submit(release, ref)
                else:
                    release(ref)

    def close(self) -> None:
        if self._remote_worker is not None:
            self._remote_worker.shutdown(wait=True)  # its releases go out first
        self.plane.close()


def _refs(data: dict[str, Any]) -> list[list]:
    return [value for value in data.values()
            if isinstance(value, list) and value and value[0] == REF_MARKER]


def _has_remote_ref(data: dict[str, Any] | None) -> bool:
    # a wire ref is [REF_MARKER, backend, ...] (omni/connector/base.py PayloadRef.to_wire)
    return data is not None and has_ref(data) \
        and any(len(value) > 1 and value[1] in REMOTE_BACKENDS for value in _refs(data))
