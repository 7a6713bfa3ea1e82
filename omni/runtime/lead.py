"""Lead control on stream edges: a producer runs at most ``max_lead`` outputs ahead of its
consumer, per request (the edge option ``max_lead``; off unless set).

Why: stages that share one GPU time-slice it, and a producer far ahead of its consumer
takes GPU time the consumer needs now. A thinker writes text much faster than its talker
speaks it (at c=32 on one H200 it wrote ~50 tokens/s per answer against the talker's 12.5
frames/s, and the talker stepped 3.5x slower while the thinker decoded beside it:
bench/results/omni-h200-summary.md); at c=1 the thinker's decode steps overlap the
talker's prefill, which is on the first packet's critical path. With a lead the producer
stops at ``consumer outputs + max_lead`` and goes on as the consumer advances: the same
tokens, made later, when the consumer can use them. A request whose route has no such
consumer (text only) is never held, and the limit is lifted once the consumer finishes.

The unit is one consumer output per producer output: a talker that speaks one codec frame
per text token. A consumer that needs more than ``max_lead`` producer outputs before it
makes one would wait forever, so keep the lead above what the consumer takes before its
first output (the talker takes one token).

Mechanics: the orchestrator counts the consumer's outputs and sends the producer's replica
Limit messages (omni/wire/protocol.py) with the most outputs the request may have made so far;
updates gathered while handling one Outputs message go out as one Limit per replica. An
engine that cannot hold a request ignores them (Engine.limit; the AR engine holds it out of
its steps).
"""

from __future__ import annotations

from collections.abc import Callable

from omni.config.pipeline import PipelineConfig
from omni.runtime.pool import Replica
from omni.runtime.request_state import RequestState
from omni.wire.protocol import Limit, encode


class LeadControl:
    """The orchestrator's side of ``max_lead`` (see the module doc)."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.consumers: dict[str, list[tuple[str, int]]] = {}  # producer -> (consumer, lead)
        self.producers: dict[str, list[str]] = {}  # consumer -> its producers with a lead
        for edge in pipeline.edges:
            if edge.max_lead is not None:
                self.consumers.setdefault(edge.src, []).append((edge.dst, edge.max_lead))
                self.producers.setdefault(edge.dst, []).append(edge.src)
        self._pending: dict[Replica, dict[str, int | None]] = {}
        self.updates_sent = 0  # LIMIT entries sent (tests, and a sanity check on traffic)

    def __bool__(self) -> bool:
        return bool(self.consumers)

    def dispatched(self, state: RequestState, stage: str) -> None:
        """A stage was just sent its request: hold it from the start if it leads."""
        if stage in self.consumers:
            self._update(state, stage)

    def consumer_output(self, state: RequestState, stage: str, made: bool,
                        finished: bool) -> None:
        """A stage's output arrived: move the limits of the producers that lead it."""
        if stage not in self.producers:
            return
        if made:
            state.lead_outputs[stage] = state.lead_outputs.get(stage, 0) + 1
        for producer in self.producers[stage]:
            self._update(state, producer, finished_consumer=stage if finished else None)

    def _update(self, state: RequestState, producer: str,
                finished_consumer: str | None = None) -> None:
        replica = state.bound.get(producer)
        if replica is None or producer in state.done:
            return
        limit = self.limit(state, producer, finished_consumer)
        if producer not in state.lead_limits and limit is None:
            return  # never held: nothing to lift
        if state.lead_limits.get(producer, -1) != limit:
            state.lead_limits[producer] = limit
            self._pending.setdefault(replica, {})[state.engine_id] = limit

    def limit(self, state: RequestState, producer: str,
              finished_consumer: str | None = None) -> int | None:
        """The most outputs `producer` may have made now: the tightest lead over its
        consumers still running on this request's route; None when there is none."""
        route, tightest = state.route.stages, None
        for consumer, lead in self.consumers[producer]:
            if (consumer not in route or consumer in state.done
                    or consumer == finished_consumer):
                continue
            most = state.lead_outputs.get(consumer, 0) + lead
            tightest = most if tightest is None else min(tightest, most)
        return tightest

    def flush(self, send: Callable[[Replica, bytes], bool]) -> None:
        """Send the gathered updates, one Limit per replica."""
        pending, self._pending = self._pending, {}
        for replica, limits in pending.items():
            if send(replica, encode(Limit(limits))):
                self.updates_sent += len(limits)
