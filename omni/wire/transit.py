"""Time a request spends in our hops: sockets, message handling and queues between stages.

Every message carries its sender's `time.monotonic()` (one clock for all processes of a
host; omni/wire/protocol.py). An engine process times each Add/Append it handles in two parts:

  hop   from the later of (sent, the end of the engine step that was running) to handled:
        socket, decoding, payload mapping, the engine loop picking it up;
  wait  how long it sat behind a step already running when it was sent (step-level
        batching: a message that arrives mid-step is taken after the step).

It reports them per request with its next outputs (Outputs.inbound); the orchestrator
times every Outputs message (engine publish -> orchestrator handled) and keeps, per request:

  hop_s / step_wait_s   sums over all the request's messages. Most of them overlap with
                        compute elsewhere, so these overstate what the hops cost it.
  chain_hop_s           per stage, the hop of its last input and of its last output,
  chain_step_wait_s     summed over stages: the messages on the path that ends the request
                        (a stage finishes after its last input; the request after the last
                        output of its last stage).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

MAX_STEP_TIMES = 256  # step durations kept between two reports (the rest are dropped)


class InboundTimes:
    """Engine side: per request [hop sum, wait sum, count, last hop, last wait]; and the
    durations of the engine's steps, so that a long wait can be told from a long step."""

    def __init__(self) -> None:
        self.step_ended = 0.0
        self._pending: dict[str, list] = {}
        self._steps: list[float] = []

    def step_done(self, started: float | None = None) -> None:
        self.step_ended = time.monotonic()
        if started is not None and len(self._steps) < MAX_STEP_TIMES:
            self._steps.append(round(self.step_ended - started, 6))

    def take_steps(self) -> list[float]:
        """Step durations (s) since the last call."""
        steps, self._steps = self._steps, []
        return steps

    def received(self, request_id: str, sent_at: float) -> None:
        if not is_time(sent_at):
            return  # a malformed stamp costs its timing, never the request
        now = time.monotonic()
        hop = max(0.0, now - max(sent_at, self.step_ended))
        wait = max(0.0, self.step_ended - sent_at)
        times = self._pending.setdefault(request_id, [0.0, 0.0, 0, 0.0, 0.0])
        times[0] += hop
        times[1] += wait
        times[2] += 1
        times[3], times[4] = hop, wait

    def take(self, request_ids: Iterable[str]) -> dict[str, list]:
        """The times not yet reported for these requests (for the next Outputs)."""
        pending = self._pending
        return {rid: pending.pop(rid) for rid in request_ids if rid in pending}

    def drop(self, request_id: str) -> None:
        self._pending.pop(request_id, None)


def is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
