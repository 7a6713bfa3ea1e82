"""A request's stream edges: what a producer stage streams to its consumers, and the
client's own stream input, each chunk sent as an APPEND to the consumer's replica.

A producer's chunk (Orchestrator._on_stage_output) is numbered per consumer and sent at
once to a consumer already dispatched, or held until it is (Orchestrator._dispatch then
sends what was held). A request submitted with ``stream_input`` takes more input later
(`feed`, from AsyncOmni.feed and InputStream) as APPENDs from the producer "client" to
its entry stages: to them a stream edge, so no audio passes here (large values go to the
payload plane: request_media.py). A consumer that cannot be reached fails the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from omni.errors import InvalidInputError, OmniError, RequestAbortedError, StageUnavailableError
from omni.runtime.launcher import EngineGroup, ReplicaUnreachableError
from omni.runtime.request_media import RequestMedia
from omni.runtime.request_state import RequestState
from omni.runtime.routing import CLIENT
from omni.wire.protocol import Append, encode


class StreamEdges:
    """Numbers, holds and sends the stream chunks of one pipeline's requests (see the
    module doc); ``fail`` ends a request with an error (Orchestrator._finish)."""

    def __init__(self, engines: EngineGroup, media: RequestMedia,
                 control_bytes: dict[tuple[str, str], int],
                 fail: Callable[[RequestState, OmniError], None]) -> None:
        self.engines = engines
        self.media = media
        self.control_bytes = control_bytes  # the orchestrator's, per (stage, direction)
        self._fail = fail
        self.feeding: set[RequestState] = set()  # stream_input requests before their last

    def open_input(self, state: RequestState) -> None:
        """A ``stream_input`` request: its entry stages number the client's chunks from 0."""
        self.feeding.add(state)
        state.seq.update({(CLIENT, s): 0 for s in state.route.entries})

    def close_input(self, state: RequestState) -> None:
        """The request ended: it takes no more client input."""
        self.feeding.discard(state)

    def stream(self, state: RequestState, producer: str, data: dict | None,
               last: bool) -> None:
        """Number a producer's chunk for each stream consumer; hold it until dispatch."""
        for consumer in state.plan.stream_consumers[producer]:
            if consumer in state.done:
                continue
            seq = state.seq.get((producer, consumer), 0)
            state.seq[producer, consumer] = seq + 1
            message = [producer, seq, data, last]
            if consumer in state.bound:
                self.send_append(state, consumer, message)
            else:
                state.held.setdefault(consumer, []).append(message)

    def send_held(self, state: RequestState, consumer: str) -> None:
        """The consumer was just dispatched: what was held for it goes now, in order."""
        for message in state.held.pop(consumer, ()):
            if not state.finished:
                self.send_append(state, consumer, message)

    def send_append(self, state: RequestState, consumer: str, message: list) -> None:
        """Send one held or new chunk, (producer, seq, data, last), as an Append."""
        replica = state.bound[consumer]
        try:
            nbytes = self.engines.send(replica, encode(Append(state.engine_id, *message,
                                                             time.monotonic())))
        except ReplicaUnreachableError as exc:
            self._fail(state, StageUnavailableError(
                f"stage '{consumer}' replica {replica.replica_id} unreachable: {exc}"))
            return
        self.control_bytes[consumer, "out"] += nbytes

    def feed(self, state: RequestState | None, request_id: str, data: dict[str, Any],
             last: bool) -> None:
        """More input of a ``stream_input`` request (``state``: None when it is not in
        flight), for its entry stages as APPENDs from producer "client"; ``last`` ends it."""
        if state is None:
            raise RequestAbortedError(f"request {request_id} is not in flight (it finished, "
                                      "failed or was aborted): its input is not taken")
        if state not in self.feeding:
            raise InvalidInputError(f"request {request_id} " + (
                "has had its last input" if (CLIENT, state.route.entries[0]) in state.seq
                else "was not opened as a stream (AsyncOmni.open_stream)"))
        for stage in state.route.entries:
            if stage in state.done or state.finished:
                continue
            try:
                self.send_append(state, stage, [CLIENT, state.seq[CLIENT, stage], self.media
                                                .for_stage(stage, state.engine_id, data), last])
            except (TypeError, ValueError, OverflowError) as exc:  # the first: none got it
                raise InvalidInputError(f"stream input cannot be encoded: {exc}") from None
            state.seq[CLIENT, stage] += 1
        if last:
            self.feeding.discard(state)
