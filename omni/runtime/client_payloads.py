"""The front side of the data plane: final outputs' refs become owned tensors."""

from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from omni.wire.payloads import PayloadPlane, has_ref, is_wire_ref

# backends whose get is a network round trip (a fetch from another host), not a memcpy
REMOTE_BACKENDS = ("zmq", "mooncake")
# producers with a fetcher of their own; more share them (a fetcher is a thread and a
# connector: a ZeroMQ context with its I/O thread, a receive pool)
MAX_FETCHERS = 32


class ClientPayloads:
    """The API side of final outputs: copy each payload out, release it at once.

    The front end needs the bytes anyway (to encode audio, images), so it owns a copy and
    the producer's block goes back immediately; nothing here outlives the output.

    Outputs of a replica on another host are fetched off the event loop (`take_async`): a
    64 MiB fetch takes tens of milliseconds, which on the loop would stall every other
    request's streaming. Each producer gets a fetcher: a thread with a connector of its
    own. Why not one shared thread: a fetch from a producer whose host died waits for the
    connector's timeout (10 s) and would hold up every other host's outputs behind it.
    Why not a pool over one connector: its consumer sockets are for one thread at a time.
    An output of a remote replica holds only remote and inline refs (it puts nothing in
    this host's shared memory), all from that one producer.
    """

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        self.name, self.options = name, options
        self.plane = PayloadPlane(name, options)
        self._fetchers: dict[str, _Fetcher] = {}

    async def take_async(self, data: dict[str, Any] | None) -> dict[str, Any] | None:
        """`take`, on the producer's fetcher when a payload must come from another host."""
        producer = _remote_producer(data)
        if producer is None:
            return self.take(data)
        fetcher = self._fetcher(producer)
        return await asyncio.get_running_loop().run_in_executor(
            fetcher.thread, _take, fetcher.plane, data)

    def take(self, data: dict[str, Any] | None) -> dict[str, Any] | None:
        return _take(self.plane, data)

    def discard(self, data: dict[str, Any] | None) -> None:
        """An output nobody will read: give its payloads back unread."""
        if data is None or not has_ref(data):
            return
        from omni.connector import PayloadRef

        producer = _remote_producer(data)
        fetcher = self._fetcher(producer) if producer is not None else None
        for value in _refs(data):
            ref = PayloadRef.from_wire(value)
            if fetcher is not None and ref.backend in REMOTE_BACKENDS:
                fetcher.thread.submit(fetcher.plane.connector.release, ref)
            else:
                self.plane.connector.release(ref)

    def _fetcher(self, producer: str) -> _Fetcher:
        fetcher = self._fetchers.get(producer)
        if fetcher is None:
            if len(self._fetchers) >= MAX_FETCHERS:  # share one, the same one every time
                shared = sorted(self._fetchers)[zlib.crc32(producer.encode()) % MAX_FETCHERS]
                return self._fetchers[shared]
            fetcher = _Fetcher(f"{self.name}-fetch{len(self._fetchers)}", self.options)
            self._fetchers[producer] = fetcher
        return fetcher

    def close(self) -> None:
        for fetcher in self._fetchers.values():
            fetcher.close()  # its releases go out first
        self._fetchers.clear()
        self.plane.close()


class _Fetcher:
    """One thread and the connector only it uses."""

    def __init__(self, name: str, options: dict[str, Any] | None) -> None:
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="omni-fetch")
        self.plane = PayloadPlane(name, options)

    def close(self) -> None:
        self.thread.shutdown(wait=True)
        self.plane.close()


def _take(plane: PayloadPlane, data: dict[str, Any] | None) -> dict[str, Any] | None:
    if data is None or not has_ref(data):
        return data
    return {key: plane.take(value) if is_wire_ref(value) else value
            for key, value in data.items()}


def _refs(data: dict[str, Any]) -> list[list]:
    return [value for value in data.values() if is_wire_ref(value)]


def _remote_producer(data: dict[str, Any] | None) -> str | None:
    """"backend:where" of the first remote ref's producer (zmq: its data socket; mooncake:
    its transfer engine's session), None for an output with no remote ref."""
    if data is None or not has_ref(data):
        return None
    for value in _refs(data):
        # a wire ref is [REF_MARKER, backend, key, owner, dtype, shape, nbytes, location]
        # (omni/connector/base.py PayloadRef.to_wire); both remote locations start with it
        if len(value) == 8 and value[1] in REMOTE_BACKENDS \
                and isinstance(value[7], list | tuple) and value[7]:
            return f"{value[1]}:{value[7][0]}"
    return None
