"""Time a request spends in our hops: sockets, message handling and queues between stages.

Every message carries its sender's `time.monotonic()` (one clock for all processes of a
host). An engine process times each ADD/APPEND it handles in two parts:

  hop   from the later of (sent, the end of the engine step that was running) to handled:
        socket, decoding, payload mapping, the engine loop picking it up;
  wait  how long it sat behind a step already running when it was sent (step-level
        batching: a message that arrives mid-step is taken after the step).

It reports both per request with its next outputs; the orchestrator adds the hop of
every OUTPUTS message (engine publish -> orchestrator handled). The sums are per request,
over all its messages, so they bound from above what the hops add to its latency: many
of them overlap with compute on another stage.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


class InboundTimes:
    """Engine side: per-request [hop, wait, count] of the messages it handled."""

    def __init__(self) -> None:
        self.step_ended = 0.0
        self._pending: dict[str, list[float]] = {}

    def step_done(self) -> None:
        self.step_ended = time.monotonic()

    def received(self, request_id: str, sent_at: float) -> None:
        now = time.monotonic()
        start = max(sent_at, self.step_ended)
        times = self._pending.setdefault(request_id, [0.0, 0.0, 0])
        times[0] += max(0.0, now - start)
        times[1] += max(0.0, self.step_ended - sent_at)
        times[2] += 1

    def take(self, request_ids: Iterable[str]) -> dict[str, list[float]]:
        """The times not yet reported for these requests (for the next OUTPUTS)."""
        pending = self._pending
        return {rid: pending.pop(rid) for rid in request_ids if rid in pending}

    def drop(self, request_id: str) -> None:
        self._pending.pop(request_id, None)


class RequestTransit:
    """Orchestrator side: one request's sums, in seconds."""

    __slots__ = ("hop_s", "wait_s", "messages")

    def __init__(self) -> None:
        self.hop_s = 0.0
        self.wait_s = 0.0
        self.messages = 0

    def add_output(self, sent_at: float | None, now: float) -> None:
        if sent_at is not None:
            self.hop_s += max(0.0, now - sent_at)
            self.messages += 1

    def add_inbound(self, times: list | None) -> None:
        if times:
            self.hop_s += times[0]
            self.wait_s += times[1]
            self.messages += times[2]

    def summary(self) -> dict[str, float | int]:
        return {"hop_s": round(self.hop_s, 6), "step_wait_s": round(self.wait_s, 6),
                "messages": self.messages}
