"""GenerationEngine over the Qwen3-Omni code2wav runner: streamed inputs, chunks with left
context, context frames and the closing output."""

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
from omni.models.qwen3_omni import Code2WavRunner

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def c2w(tmp_path_factory):
    return code2wav(tmp_path_factory)


def _sizes(t, first, chunk, growth):
    """New frames per streamed chunk: first, first * growth, ... capped at chunk."""
    sizes, k = [], 0
    while sum(sizes) < t:
        sizes.append(min(first * growth**k, chunk, t - sum(sizes)))
        k += 1
    return sizes


def _reference(c2w, codes, first, chunk, ctx, growth=1):
    """Chunk/left-context arithmetic of the engine, decoded one chunk at a time: chunk k
    has min(first * growth**k, chunk) new frames."""
    t, start, k, wavs = codes.shape[-1], 0, 0, []
    while start < t:
        end = min(start + min(first * growth**k, chunk), t)
        c = min(ctx, start)
        wavs.append(c2w.decode_chunk(codes[None, :, start - c:end], c)[0])
        start, k = end, k + 1
    return wavs


@pytest.mark.parametrize(("first", "growth"), [(8, 2), (3, 1), (2, 2)])
def test_streaming_matches_chunked_decode(c2w, first, growth):
    """Chunks of first, first * growth, ... up to chunk new frames (2, 4, 8, 8, ... for the
    last case) join into the one-shot decode."""
    chunk, ctx, t = 8, 6, 45
    engine = GenerationEngine(Code2WavRunner(
        c2w, {"chunk_frames": chunk, "left_context": ctx, "first_chunk_frames": first,
              "chunk_growth": growth}))
    rng = random.Random(first)
    codes = {"a": random_codes(t, 10), "b": random_codes(t - 7, 11)}
    outs: dict = {}
    for rid in codes:
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    for rid, c in codes.items():  # interleaved feeding, random chunk sizes
        feed_stream(engine, rid, c, rng, outs)
    drain(engine, outs)
    assert engine.stats()["running"] == 0
    for rid, c in codes.items():
        got = outs[rid]
        assert [o.data["index"] for o in got] == list(range(len(got)))
        assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
        assert all(o.error is None for o in got)
        assert sum(o.data["frames"] for o in got) == c.shape[-1]
        pieces = [audio_of(o.data) for o in got if o.data["frames"]]
        ref = _reference(c2w, c, first, chunk, ctx, growth)
        assert [o.data["frames"] for o in got if o.data["frames"]] == _sizes(
            c.shape[-1], first, chunk, growth)
        scale = max(float(w.abs().max()) for w in ref)
        assert len(pieces) == len(ref)
        for p, r in zip(pieces, ref, strict=True):
            assert rel_diff(p, r, scale) < REL_TOL
        streamed = torch.cat(pieces)
        # no gap at chunk boundaries: exactly as long as decoding all codes at once
        assert streamed.numel() == c.shape[-1] * c2w.samples_per_frame - c2w.tail_samples
        if first == chunk:  # transformers' chunked_decode, with the tails it drops
            hf = c2w.module.chunked_decode(c[None], chunk_size=chunk, left_context_size=ctx)
            tails = (len(pieces) - 1) * c2w.tail_samples
            assert hf.shape[-1] == streamed.numel() - tails
    assert engine.stats()["max_batch"] >= 1


def test_streamed_vs_one_shot_with_receptive_field_context(c2w):
    """With left_context = receptive field, every streamed chunk equals the one-shot samples
    at the same position, the tail each chunk leaves for the next one included."""
    rf, chunk, t, spf = c2w.receptive_field_frames, 20, 100, c2w.samples_per_frame
    codes = random_codes(t, 3)
    full = c2w.decode(codes[None])[0]
    scale = float(full.abs().max())
    diffs = {}
    for ctx in (rf, 25):
        engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": chunk, "left_context": ctx}))
        engine.add(EngineRequest("s", {"stream": ["talker"]}))
        outs: dict = {}
        feed_stream(engine, "s", codes, random.Random(5), outs)
        drain(engine, outs)
        position, worst = 0, 0.0
        got = [o for o in outs["s"] if o.data["frames"]]
        for o in got:
            a = audio_of(o.data)
            worst = max(worst, rel_diff(a, full[position:position + a.numel()], scale))
            position += a.numel()
        assert position == full.numel() == t * spf - c2w.tail_samples
        diffs[ctx] = worst
    print(f"streamed vs one-shot, relative max abs diff by left_context: {diffs} "
          f"(scale {scale:.3g}; absolute: {[d * scale for d in diffs.values()]})")
    assert diffs[rf] < REL_TOL
    assert diffs[25] < 0.05  # approximate but close: the transformer's far context fades


def test_a_closing_chunk_without_frames_ends_the_stream(c2w):
    """A talker that stops on its end code sends a last output with no codes (only its
    token and finish reason): the stream ends there, with the frames it had (or none);
    a chunk without codes that is not the last is still an error."""
    engine = GenerationEngine(Code2WavRunner(c2w, {"first_chunk_frames": 4, "chunk_frames": 4,
                                                   "left_context": 2}))
    closing = {"token_ids": [66], "finish_reason": "stop"}
    for rid in ("some", "none", "bad"):
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    engine.append("some", "talker", 0, {"codes": random_codes(2, 0).tolist()}, False)
    engine.append("some", "talker", 1, closing, True)
    engine.append("none", "talker", 0, closing, True)
    engine.append("bad", "talker", 0, closing, False)
    outs = drain(engine)
    assert outs["some"][-1].finished and outs["some"][-1].error is None
    samples = sum(audio_of(o.data).shape[-1] for o in outs["some"] if o.data)
    assert samples == len(c2w.decode_chunk(random_codes(2, 0)[None], 0)[0])  # both frames
    assert outs["none"][-1].finished and outs["none"][-1].error is None
    assert "needs 'codes'" in outs["bad"][-1].error
    assert not engine.has_work() and engine.stats()["running"] == 0


def test_context_frames_stand_in_for_earlier_ones_and_are_never_output(c2w):
    """A chunk carrying "context" (a voice clone's reference codes ahead of a sentence):
    the frames before it go out first, whole; the context is decoded as the left context of
    the frames after it, in place of the earlier ones, and makes no output of its own."""
    chunk, ctx = 6, 4
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": chunk, "left_context": ctx}))
    a, ref, b = random_codes(9, 20), random_codes(5, 21), random_codes(8, 22)
    engine.add(EngineRequest("s", {"stream": ["talker"]}))
    engine.append("s", "talker", 0, {"codes": a.tolist()}, False)
    outs = drain(engine)  # one chunk of 6; 3 frames wait for more
    engine.append("s", "talker", 1, {"codes": b.tolist(), "context": ref.tolist()}, True)
    got = [o for o in drain(engine, outs)["s"] if o.data["frames"]]
    assert [o.data["frames"] for o in got] == [6, 3, 6, 2]  # a's rest flushed before b
    assert got[-1].finished and not engine.has_work()
    expected = [c2w.decode_chunk(a[None, :, :6], 0)[0],
                c2w.decode_chunk(a[None, :, 2:9], 4)[0],  # a's own context
                c2w.decode_chunk(torch.cat([ref[:, -4:], b[:, :6]], -1)[None], 4)[0],
                c2w.decode_chunk(b[None, :, 2:8], 4)[0]]
    scale = max(float(w.abs().max()) for w in expected)
    for o, want in zip(got, expected, strict=True):
        assert rel_diff(audio_of(o.data), want, scale) < REL_TOL
    # the context changes b's first chunk (it is not decoded after a's frames)
    after_a = c2w.decode_chunk(torch.cat([a[:, -4:], b[:, :6]], -1)[None], 4)[0]
    assert rel_diff(after_a, expected[2], scale) > 100 * REL_TOL


def test_the_closing_output_is_the_engine_s_own(c2w):
    """A stream that ends after its last chunk went out closes with an output the engine
    builds itself: frames 0 and the next index, no audio fields (the runner's pack() is not
    asked to pack an output that does not exist; audio consumers skip it)."""
    engine = GenerationEngine(Code2WavRunner(c2w, {"first_chunk_frames": 4, "chunk_frames": 4,
                                                   "left_context": 2}))
    engine.add(EngineRequest("s", {"stream": ["talker"]}))
    engine.append("s", "talker", 0, {"codes": random_codes(4, 0).tolist()}, False)
    first, = engine.step()
    assert first.data["frames"] == 4 and not first.finished
    assert float(audio_of(first.data).abs().max()) > 0  # the fixture makes sound
    engine.append("s", "talker", 1, {"token_ids": [66], "finish_reason": "stop"}, True)
    closing, = drain(engine)["s"]
    assert closing.finished and closing.error is None
    assert closing.data == {"frames": 0, "index": 1}
