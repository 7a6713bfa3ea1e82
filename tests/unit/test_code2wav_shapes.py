"""A code2wav stage's calls padded to a few shapes (omni/models/code2wav_shapes.py, on a
GPU by default; forced on here): the shapes chosen, and the Qwen3-Omni code2wav's streamed
audio through padded calls equal to each chunk decoded alone. Qwen3-TTS's causal decoder,
whose frames are padded too: tests/http/test_qwen3_tts_gpu_paths.py."""

from __future__ import annotations

import random

import pytest
import torch
from unit.code2wav_runs import (
    REL_TOL,
    audio_of,
    code2wav,
    drain,
    feed_stream,
    random_codes,
    rel_diff,
)

from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.models.code2wav_shapes import CallShapes, stream_windows
from omni.models.qwen3_omni import Code2WavRunner

torch.set_num_threads(1)


def test_a_streams_windows_are_its_chunks_with_their_context():
    # window -> its context frames, in the order a stream meets them
    assert stream_windows(4, 2, 25, 25) == {4: 0, 12: 4, 28: 12, 50: 25}  # Qwen3-Omni's
    assert list(stream_windows(4, 2, 50, 25).items()) == [(4, 0), (12, 4), (28, 12), (57, 25),
                                                          (75, 25)]  # Qwen3-TTS's preset
    assert stream_windows(25, 2, 25, 25) == {25: 0, 50: 25}
    assert stream_windows(8, 1, 8, 0) == {8: 0}


def test_calls_are_padded_to_powers_of_two_of_rows_and_to_windows_when_causal():
    causal = CallShapes((4, 12, 28, 50), causal=True, max_rows=64, max_frames=0)
    assert causal.padded(3, 12) == (4, 12)
    assert causal.padded(5, 30) == (8, 50)  # a last chunk: a window's length
    assert causal.padded(3, 325) == (3, 325)  # longer than every window: kept whole
    looks_ahead = CallShapes((4, 12, 28, 50), causal=False, max_rows=64, max_frames=0)
    assert looks_ahead.padded(3, 28) == (4, 28)  # a window's length: rows padded
    assert looks_ahead.padded(3, 30) == (3, 30)  # frames kept (padding would change them),
    # so not a warmed shape: left as it is
    # the engine's frames per call bound the padding: 20 rows of 50 fit 1000, 32 do not
    capped = CallShapes((50,), causal=True, max_rows=64, max_frames=1000)
    assert capped.padded(17, 50) == (20, 50)
    assert capped.padded(30, 30) == (30, 30)  # 30 rows of 50 frames would not fit 1000
    assert capped.warm_shapes() == [(1, 50), (2, 50), (4, 50), (8, 50), (16, 50), (20, 50)]


def test_a_trimmed_stack_keeps_to_the_lengths_warmed_at_load():
    """The conv stack of a padded call leaves out at most what its window's stream context
    allowed when it was warmed: a last chunk of 3 frames after 25 of context pads to the
    28-frame window, warmed with 12 frames of context (skip 2, not 15)."""
    contexts = stream_windows(4, 2, 50, 25)
    shapes = CallShapes(tuple(contexts), causal=True, max_rows=64, max_frames=0,
                        contexts=contexts)
    assert shapes.stack_skip_cap(3, 28, 10) == 2
    assert shapes.stack_skip_cap(3, 40, 10) == 15  # padded to 57: warmed after 25
    assert shapes.stack_skip_cap(3, 75, 10) == 15
    assert shapes.stack_skip_cap(1, 12, 10) == 0  # 4 frames of context: nothing to leave out
    assert shapes.stack_skip_cap(3, 300, 10) is None  # no window: kept as it is


@pytest.fixture(scope="module")
def c2w(tmp_path_factory):
    return code2wav(tmp_path_factory)


def test_padded_calls_give_each_chunk_the_audio_it_has_alone(c2w, monkeypatch):
    """Three streams through an engine whose runner pads its calls: every window-length
    call's rows a power of two and its shape met at load, and each chunk's audio what
    decoding that chunk by itself gives."""
    runner = Code2WavRunner(c2w, {"chunk_frames": 8, "left_context": 6,
                                  "first_chunk_frames": 2, "fixed_shapes": True})
    shapes: list[tuple[int, int]] = []
    decode = c2w.decode
    monkeypatch.setattr(c2w, "decode", lambda codes: shapes.append(tuple(codes.shape[::2]))
                        or decode(codes))
    engine = GenerationEngine(runner, {"max_batch_size": 4})
    warmed = set(shapes)
    assert runner.shapes.windows == (2, 6, 14)
    assert warmed == {(r, f) for f in (2, 6, 14) for r in (1, 2, 4)}
    codes = {f"r{i}": random_codes(30 + 5 * i, i) for i in range(3)}
    outs: dict = {}
    for rid in codes:
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    rng = random.Random(0)
    for rid, c in codes.items():
        feed_stream(engine, rid, c, rng, outs)
    drain(engine, outs)
    served = shapes[len(warmed):]
    windowed = [s for s in served if s[1] in (2, 6, 14)]  # others: last chunks, unpadded
    assert windowed and all(rows & (rows - 1) == 0 for rows, _ in windowed), served
    assert set(windowed) <= warmed
    for rid, c in codes.items():
        pieces = [audio_of(o.data) for o in outs[rid] if o.data["frames"]]
        start = 0
        for piece, out in zip(pieces, [o for o in outs[rid] if o.data["frames"]], strict=True):
            n = out.data["frames"]
            ctx = min(6, start)
            alone = decode(c[None, :, start - ctx:start + n])[0, c2w.context_start(ctx):]
            scale = float(alone.abs().max())
            assert scale > 0  # the fixture makes sound
            assert rel_diff(piece, alone, scale) < REL_TOL
            start += n
        assert start == c.shape[-1]


def test_the_conv_stack_over_its_reach_gives_a_chunks_samples(c2w):
    """Qwen3-Omni's code2wav decoding a chunk after 25 frames of context with its conv
    stack over the last stack_context_frames of them only (trim_stack, the runner's
    default): the chunk's samples as the whole decode gives them, within float noise, and
    two frames fewer change them (the ConvNeXt layer scales set to 1, so the stack's whole
    reach shows; the fixture's 1e-6 would hide it)."""
    import copy

    wide = copy.deepcopy(c2w)
    for module in wide.module.modules():
        if hasattr(module, "gamma"):
            torch.nn.init.ones_(module.gamma)
    reach, context = wide.stack_context_frames, 25
    assert 0 < reach < context
    codes = torch.stack([random_codes(40, seed) for seed in (3, 4)])
    full = wide.decode(codes)[:, wide.context_start(context):]
    scale = float(full.abs().max())
    assert scale > 0

    def kept(stack_context: int) -> torch.Tensor:
        skip = context - stack_context
        return wide.decode(codes, skip)[:, wide.context_start(context)
                                        - skip * wide.samples_per_frame:]

    assert rel_diff(kept(reach), full, scale) < REL_TOL
    assert rel_diff(kept(reach - 2), full, scale) > 100 * REL_TOL
    runner = Code2WavRunner(wide, {"left_context": 25})
    assert runner.stack_skip([25, 30]) == 25 - reach
    assert Code2WavRunner(wide, {"trim_stack": False}).stack_skip([25, 30]) == 0
    served = runner.run(codes, [context, context])
    assert all(rel_diff(row, want, scale) < REL_TOL for row, want in zip(served, full, strict=True))
