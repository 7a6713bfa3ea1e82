"""A code2wav stage's decode calls held to a few shapes, each decoded once at load.

On a GPU the first call of each new (rows, frames) shape costs far more than the next ones
(cuDNN picks its convolutions' plans per shape, the caching allocator cuts new blocks), and
a streamed code2wav stage meets a new shape at nearly every call: its rows are however many
chunks were ready, and a request's last chunk has any length. Qwen3-TTS's one-stage layout
went from 3.37 to 5.08 audio-s/s at c=8 on an H100 once its chunk decodes were padded so
(omni/models/qwen3_tts_stream.py, bench/results/qwen3-tts-gpu.md); this gives the split
layouts' Code2Wav stage (Qwen3-TTS, Qwen3-Omni) the same:

- rows are padded to a power of two (rows of code 0, their audio dropped): the decoders
  are per row (convolutions and attention within a row, no batch statistics); only calls
  of a warmed length (a window): a longer call (codes that came complete) keeps its rows;
- for a causal decoder (no look-ahead: ``tail_samples == 0``), frames are padded on the
  right to the next window a stream's chunks take (first chunk, its growth, the full chunk
  with its left context); a frame's samples do not depend on later frames, so the padding's
  samples are cut. A decoder with look-ahead keeps its frames: padding would change the
  last frames' samples;
- a padded call never holds more frames than the engine allows one call (its memory budget).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.engines.base import streamed_chunk_frames

log = logging.getLogger(__name__)


def stream_windows(first: int, growth: int, chunk: int, left_context: int) -> dict[int, int]:
    """The frames (context + new) of a streamed request's chunks, in order, until they
    repeat, each with its context frames: e.g. first 4, growth 2, chunk 25, context 25 ->
    {4: 0, 12: 4, 28: 12, 50: 25}."""
    windows: dict[int, int] = {}
    done, index = 0, 0
    while True:
        size = streamed_chunk_frames(first, growth, chunk, index)
        context = min(left_context, done)
        if context + size in windows:
            return windows
        windows[context + size] = context
        done, index = done + size, index + 1


def pow2(n: int) -> int:
    """The least power of two >= n (>= 1)."""
    return 1 << (max(n, 1) - 1).bit_length()


@dataclass(frozen=True)
class CallShapes:
    """Which shape a (rows, frames) call is padded to. windows: the frame counts calls are
    padded up to (causal decoders only); max_rows / max_frames: the engine's limits per
    call (max_frames 0: none); contexts: each window's context frames as a stream meets it
    (the conv stack's trimmed length it was warmed at)."""

    windows: tuple[int, ...]
    causal: bool
    max_rows: int
    max_frames: int
    contexts: Mapping[int, int] = field(default_factory=dict)

    def stack_skip_cap(self, rows: int, frames: int, reach: int) -> int | None:
        """The most frames a (rows, frames) call's conv stack may leave out and still meet
        the length it was warmed at: its window's context less the stack's reach (a last
        chunk of 1-3 frames after a full context pads to a window warmed with less
        context); None: a window with no warmed context (no cap)."""
        context = self.contexts.get(self.padded(rows, frames)[1])
        return None if context is None else max(0, context - reach)

    def padded(self, rows: int, frames: int) -> tuple[int, int]:
        """The shape of a call of (rows, frames); never more frames in all than the
        engine's limit, when the call itself keeps within it."""
        if self.causal:
            window = next((w for w in sorted(self.windows) if w >= frames), frames)
            if not self.max_frames or rows * window <= self.max_frames:
                frames = window
        if frames not in self.windows:  # a shape never warmed: padding it would only cost
            return rows, frames
        padded_rows, limit = pow2(rows), self._row_limit(frames)
        if limit and padded_rows > limit:
            padded_rows = max(rows, limit)
        return padded_rows, frames

    def _row_limit(self, frames: int) -> int:
        return self.max_frames // frames if self.max_frames else 0

    def warm_shapes(self) -> list[tuple[int, int]]:
        """Every padded shape of a streamed chunk call: rows 1, 2, 4, ... (and the most
        the engine gives one call) at each window."""
        shapes = set()
        for frames in self.windows:
            most = min(self.max_rows, self._row_limit(frames) or self.max_rows)
            rows = 1
            while rows < most:
                shapes.add(self.padded(rows, frames))
                rows *= 2
            shapes.add(self.padded(most, frames))
        return sorted(shapes)


def decode_padded(decode: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor,
                  shapes: CallShapes, samples: Callable[[int], int]) -> torch.Tensor:
    """decode(batch) through a padded call: (B, NQ, T) -> (B, samples(T))."""
    rows, _, frames = batch.shape
    padded_rows, padded_frames = shapes.padded(rows, frames)
    padded = torch.nn.functional.pad(batch, (0, padded_frames - frames, 0, 0,
                                             0, padded_rows - rows))
    return decode(padded)[:rows, :samples(frames)]


def warm(decode: Callable[[torch.Tensor, list[int]], Any], shapes: CallShapes,
         quantizers: int, contexts: dict[int, int]) -> int:
    """One call of each of ``shapes.warm_shapes()``, each row with its window's context
    frames (the shapes a decoder's trimmed conv stack meets too); returns how many."""
    calls = shapes.warm_shapes()
    for rows, frames in calls:
        decode(torch.zeros(rows, quantizers, frames, dtype=torch.long),
               [contexts.get(frames, 0)] * rows)
    return len(calls)


def prepare_shapes(runner: Any, max_rows: int, max_frames: int) -> CallShapes:
    """The CallShapes of a Code2WavRunner (omni/models/qwen3_omni.py) within the engine's
    limits per call, every streamed shape decoded once."""
    c2w = runner.c2w
    contexts = stream_windows(runner.first_chunk_frames, runner.chunk_growth,
                              runner.chunk_frames, runner.left_context)
    shapes = CallShapes(tuple(contexts), causal=c2w.tail_samples == 0, max_rows=max_rows,
                        max_frames=max_frames, contexts=contexts)
    started = time.monotonic()
    calls = warm(lambda batch, ctx: runner.decode_rows(batch, ctx, None), shapes,
                 c2w.num_quantizers, contexts)
    log.info("code2wav: calls padded to %d shapes (windows %s frames%s), each decoded once "
             "in %.1f s", calls, list(shapes.windows),
             "" if shapes.causal else ", rows only: the decoder looks ahead",
             time.monotonic() - started)
    return shapes
