"""What a listener experiences: time to first text and first audio, real-time factor,
and underrun, from the times outputs reach the client."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class PlaybackClock:
    """A real-time player that starts at the first audio packet and plays on.

    underrun: the worst deficit it would hit, i.e. the largest (time played so far -
    audio received so far) seen as packets arrive (0 when every packet came in time). It
    does not model a player that pauses to rebuffer: each deficit is measured against the
    schedule set by the first packet.
    """

    start: float = field(default_factory=time.monotonic)
    first_text: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    audio_s: float = 0.0
    underrun_s: float = 0.0

    def text(self, now: float | None = None) -> None:
        if self.first_text is None:
            self.first_text = time.monotonic() if now is None else now

    def audio(self, seconds: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.first_audio is None:
            self.first_audio = now
        else:
            self.underrun_s = max(self.underrun_s, (now - self.first_audio) - self.audio_s)
        self.audio_s += seconds
        self.last_audio = now

    def summary(self, now: float | None = None) -> dict[str, float | None]:
        """ttft / ttfp / e2el in seconds from the start; rtf = time to the last audio /
        seconds of audio (below 1 is faster than real time)."""
        now = time.monotonic() if now is None else now

        def since(t: float | None) -> float | None:
            return None if t is None else t - self.start
        rtf = (since(self.last_audio) / self.audio_s
               if self.audio_s > 0 and self.last_audio is not None else None)
        return {"ttft_s": since(self.first_text), "ttfp_s": since(self.first_audio),
                "e2el_s": now - self.start, "rtf": rtf, "underrun_s": self.underrun_s}
