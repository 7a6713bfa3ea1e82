"""The orchestrator's transit accounting per request (the stamps: omni/wire/transit.py)."""

from __future__ import annotations

from omni.wire.transit import is_time


class RequestTransit:
    """Orchestrator side: one request's sums, in seconds (see the module doc)."""

    __slots__ = ("hop_s", "wait_s", "messages", "_last")

    def __init__(self) -> None:
        self.hop_s = 0.0
        self.wait_s = 0.0
        self.messages = 0
        self._last: dict[str, list[float]] = {}  # stage -> [in hop, in wait, out hop]

    def add_output(self, stage: str, sent_at: float | None, now: float) -> None:
        if is_time(sent_at):
            hop = max(0.0, now - sent_at)
            self.hop_s += hop
            self.messages += 1
            self._last.setdefault(stage, [0.0, 0.0, 0.0])[2] = hop

    def add_inbound(self, stage: str, times: tuple | list | None) -> None:
        """An engine's times of what it received for this request (Outputs.inbound)."""
        if isinstance(times, (tuple, list)) and len(times) == 5 and all(map(is_time, times)):
            self.hop_s += times[0]
            self.wait_s += times[1]
            self.messages += times[2]
            self._last.setdefault(stage, [0.0, 0.0, 0.0])[:2] = times[3:5]

    @property
    def chain_hop_s(self) -> float:
        return sum(last[0] + last[2] for last in self._last.values())

    @property
    def chain_wait_s(self) -> float:
        return sum(last[1] for last in self._last.values())

    def chain_hop_by_stage(self) -> dict[str, tuple[float, float]]:
        """Per stage: the hops of its last input and of its last output."""
        return {stage: (last[0], last[2]) for stage, last in self._last.items()}

    def chain_wait_by_stage(self) -> dict[str, float]:
        """Per stage: how long its last input waited behind a step already running."""
        return {stage: last[1] for stage, last in self._last.items()}

    def summary(self) -> dict[str, float | int]:
        return {"hop_s": round(self.hop_s, 6), "step_wait_s": round(self.wait_s, 6),
                "messages": self.messages, "chain_hop_s": round(self.chain_hop_s, 6),
                "chain_step_wait_s": round(self.chain_wait_s, 6)}
