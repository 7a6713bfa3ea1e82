"""The generation engine's runner contract (what a model adapter provides) and its
per-request frame buffer (generation.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from omni.engines.base import streamed_chunk_frames


class Runner(Protocol):
    """What a model adapter provides to the generation engine."""

    input_key: str  # the input field holding a request's frames, e.g. "codes"
    chunk_frames: int  # new frames per streamed chunk
    first_chunk_frames: int  # new frames in a stream's first chunk (fast first output)
    complete_chunk_frames: int  # new frames per chunk for complete inputs
    left_context: int  # earlier frames decoded with each chunk, output dropped

    def parse(self, value: Any) -> torch.Tensor:
        """One input value -> (rows, frames) tensor; ValueError when malformed."""

    # optional: join(values) -> one value holding every complete-input chunk's frames in
    # order (parsed once instead of per chunk), or None to parse each chunk alone
    # optional: batch_frames, the default max_batch_frames; device and
    # probe_batch(rows, frames) -> a valid input batch, with which a stage's memory budget
    # sizes max_batch_frames on a GPU (generation/memory.py)

    def run(self, batch: torch.Tensor, contexts: list[int]) -> list[torch.Tensor]:
        """(B, rows, T) -> per row the output belonging to the frames after contexts[i]."""

    def pack(self, output: torch.Tensor) -> dict[str, Any]:
        """One chunk's output as msgpack-able fields."""

    def info(self) -> dict[str, Any]:
        """Capabilities for READY (sample rate, ...)."""


@dataclass
class GenRequest:
    """One request's input frames (or items), what was output, and its playback deadline."""

    id: str
    pieces: list[torch.Tensor] = field(default_factory=list)  # (rows, t) each, in order
    base: int = 0  # absolute index of the first frame still held in pieces
    total: int = 0  # frames received
    done: int = 0  # frames already output
    index: int = 0  # chunks already output
    open: dict[str, int] = field(default_factory=dict)  # stream producer -> next seq
    complete: bool = False  # all input is in
    stream: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    units: list[Any] = field(default_factory=list)  # items mode: one opaque unit per output
    held: str = ""  # items mode, streamed text: the part whose sentence has not ended
    # [start, end) of frames that are only left context (never output), in order, and the
    # earliest frame the next chunk may take as context: a context range stands in for
    # everything before it (a voice clone's reference codes ahead of a sentence)
    contexts: list[tuple[int, int]] = field(default_factory=list)
    context_from: int = 0
    arrival: float = field(default_factory=time.monotonic)
    play_start: float | None = None  # when its first output left
    played_s: float = 0.0  # seconds of media sent so far

    def deadline(self) -> float:
        """When the client runs out of media (see module docstring)."""
        return self.arrival if self.play_start is None else self.play_start + self.played_s

    def frames(self) -> torch.Tensor:
        """Frames [base, total) as one tensor."""
        if len(self.pieces) > 1:
            self.pieces = [torch.cat(self.pieces, dim=-1)]
        return self.pieces[0]

    def pass_context(self) -> int:
        """Count the context ranges that come next as done (no output); returns where the
        frames the next chunk may take end (the next context range, else the input's end)."""
        while self.contexts and self.contexts[0][0] == self.done:
            self.context_from, self.done = self.contexts.pop(0)
        return self.contexts[0][0] if self.contexts else self.total

    def trim(self, keep_from: int) -> None:
        """Free frames before absolute index keep_from (no later chunk can use them)."""
        drop = keep_from - self.base
        if drop > 0 and self.pieces:
            self.pieces = [self.frames()[:, drop:].clone()]
            self.base = keep_from


def media_seconds(data: Mapping[str, Any]) -> float:
    """Seconds of media in one output's fields (samples / sample_rate), 0 if absent."""
    samples, rate = data.get("samples"), data.get("sample_rate")
    if isinstance(samples, int) and isinstance(rate, int) and rate > 0:
        return samples / rate
    return 0.0


def started_running_dry(reqs: Iterable[GenRequest], call_s: float | None) -> bool:
    """Earliest deadline first goes with one exception: requests not yet started wait
    while a started one is within two calls (of call_s seconds) of running dry, so over
    capacity clients queue for their first audio instead of all of them stuttering."""
    if call_s is None:
        return False
    guard = time.monotonic() + 2 * call_s
    return any(r.play_start is not None and r.deadline() < guard for r in reqs)


def next_chunk(req: GenRequest, runner: Runner) -> tuple[int, int] | None:
    """(context frames, new frames) of a request's next chunk; None when not ready. A chunk
    never crosses into a context range: the frames before one go out first, whole."""
    end = req.pass_context()
    new = end - req.done
    if req.stream:
        size = streamed_chunk_frames(runner.first_chunk_frames,
                                     getattr(runner, "chunk_growth", 1),
                                     runner.chunk_frames, req.index)
    else:
        size = runner.complete_chunk_frames
    if new >= size:
        n = size
    elif req.complete or end < req.total:
        n = new  # the rest (or the rest before a context); 0 = only the closing output
    else:
        return None
    return min(runner.left_context, req.done - req.context_from), n
