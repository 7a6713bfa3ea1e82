"""GenerationEngine over the Qwen3-Omni code2wav runner: batching, streaming, failures."""

from __future__ import annotations

import random
import time

import pytest
import torch

from omni.engines.base import EngineLoadError, EngineRequest
from omni.engines.generation.build import build_generation_engine
from omni.engines.generation.engine import GenerationEngine
from omni.fixtures import ensure_tiny_model
from omni.models.qwen3_omni import Code2WavRunner, load_code2wav

torch.set_num_threads(1)
NQ, CB = 4, 64
REL_TOL = 1e-5  # relative to the signal's max |x| (random weights: max |x| ~ 5e-7)


@pytest.fixture(scope="module")
def c2w(tmp_path_factory):
    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    return load_code2wav(str(d))


def _codes(t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CB, (NQ, t), generator=torch.Generator().manual_seed(seed))


def _audio(data) -> torch.Tensor:
    return data["audio"]  # the engine hands out a float32 tensor (published by the process)


def _drain(engine, outs=None, limit=1000):
    outs = {} if outs is None else outs
    for _ in range(limit):
        if not engine.has_work():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    return outs


def _close(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def test_complete_inputs_batched_in_one_call(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w))
    codes = {f"r{i}": _codes(20, seed=i) for i in range(3)}
    for rid, c in codes.items():
        engine.add(EngineRequest(rid, {"codes": c.tolist()}))
    outs = engine.step()
    assert not engine.has_work()
    st = engine.stats()
    assert (st["calls"], st["requests_run"], st["max_batch"]) == (1, 3, 3)
    assert st["running"] == 0
    assert {o.request_id for o in outs} == set(codes)
    for o in outs:
        assert o.finished and o.error is None
        ref = c2w.decode(codes[o.request_id][None])[0]
        got = _audio(o.data)
        assert o.data["sample_rate"] == 24000 and o.data["frames"] == 20 and o.data["index"] == 0
        assert o.data["samples"] == got.numel() == 20 * 1920 - 555
        assert _close(got, ref, float(ref.abs().max())) < REL_TOL
    info = engine.info()
    assert info["sample_rate"] == 24000 and info["engine"] == "generation"


def test_frames_per_call_are_capped(c2w):
    """max_batch_frames splits a batch (rows x frames) into calls; the audio is the same.
    Code2WavRunner sets a CPU default (a big batch is slower per frame there)."""
    assert Code2WavRunner(c2w).batch_frames == 64  # CPU
    engine = GenerationEngine(Code2WavRunner(c2w), {"max_batch_frames": 40})
    codes = {f"r{i}": _codes(20, seed=i) for i in range(3)}
    for rid, c in codes.items():
        engine.add(EngineRequest(rid, {"codes": c.tolist()}))
    outs = _drain(engine)
    st = engine.stats()
    assert (st["calls"], st["requests_run"], st["max_batch"]) == (2, 3, 2)
    for rid, c in codes.items():
        ref = c2w.decode(c[None])[0]
        assert _close(_audio(outs[rid][0].data), ref, float(ref.abs().max())) < REL_TOL
    with pytest.raises(EngineLoadError, match="max_batch_frames"):
        GenerationEngine(Code2WavRunner(c2w), {"max_batch_frames": -1})


def test_a_memory_budget_sizes_calls_on_a_gpu_only(c2w):
    """On CPU a budget leaves the runner's frames per call (nothing to measure there); an
    explicit max_batch_frames wins over a budget; the arithmetic on a GPU's numbers: the
    budget less the weights and a call's fixed part, 90% of it, over the bytes a frame."""
    from omni.engines.generation.memory import frames_for_budget

    engine = GenerationEngine(Code2WavRunner(c2w), memory_bytes=1 << 30)
    assert engine.max_batch_frames == 64 and engine.memory_bytes == 1 << 30
    assert engine.info()["max_batch_frames"] == 64
    assert GenerationEngine(Code2WavRunner(c2w), {"max_batch_frames": 7},
                            memory_bytes=1 << 30).max_batch_frames == 7
    mib = 1 << 20
    assert frames_for_budget(1000 * mib, 100 * mib, 80 * mib, 2 * mib) == 369  # 738 MiB
    assert frames_for_budget(100 * mib, 100 * mib, 80 * mib, 2 * mib) == 0
    runner = Code2WavRunner(c2w, {"complete_chunk_frames": 40, "left_context": 8})
    assert GenerationEngine(runner).longest_row == 48
    batch = runner.probe_batch(2, 48)
    assert batch.shape == (2, NQ, 48) and runner.run(batch, [0, 0])[1].numel() == 48 * 1920 - 555


def test_an_unknown_option_fails_the_load_and_names_the_valid_ones(tmp_path_factory):
    """A typo in a stage's options (here of the runner's first_chunk_frames) is a load
    error listing the engine's, the runner's and the process's options."""
    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    with pytest.raises(EngineLoadError, match=r"unknown generation engine \(qwen3_omni_code2wav"
                       r"\) option\(s\) first_chunk_frame; the options are .*"
                       r"first_chunk_frames.*max_batch_size.*nice"):
        build_generation_engine("qwen3_omni_code2wav", model_dir=str(d), device="cpu",
                                dtype="float32", options={"first_chunk_frame": 4, "nice": 5})
    engine = build_generation_engine(
        "qwen3_omni_code2wav", model_dir=str(d), device="cpu", dtype="float32",
        options={"first_chunk_frames": 4, "max_batch_size": 8, "nice": 5})
    assert engine.runner.first_chunk_frames == 4 and engine.max_batch_size == 8


def _stream(engine, rid, codes, rng, outs, producer="talker"):
    """Feed codes in random-size appends, stepping in between."""
    t, seq = codes.shape[-1], 0
    pos = 0
    while pos < t:
        n = rng.randint(1, 7)
        piece = codes[:, pos:pos + n]
        pos += piece.shape[-1]
        engine.append(rid, producer, seq, {"codes": piece.tolist()}, pos >= t)
        seq += 1
        if rng.random() < 0.5:
            for o in engine.step():
                outs.setdefault(o.request_id, []).append(o)


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
    codes = {"a": _codes(t, 10), "b": _codes(t - 7, 11)}
    outs: dict = {}
    for rid in codes:
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    for rid, c in codes.items():  # interleaved feeding, random chunk sizes
        _stream(engine, rid, c, rng, outs)
    _drain(engine, outs)
    assert engine.stats()["running"] == 0
    for rid, c in codes.items():
        got = outs[rid]
        assert [o.data["index"] for o in got] == list(range(len(got)))
        assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
        assert all(o.error is None for o in got)
        assert sum(o.data["frames"] for o in got) == c.shape[-1]
        pieces = [_audio(o.data) for o in got if o.data["frames"]]
        ref = _reference(c2w, c, first, chunk, ctx, growth)
        assert [o.data["frames"] for o in got if o.data["frames"]] == _sizes(
            c.shape[-1], first, chunk, growth)
        scale = max(float(w.abs().max()) for w in ref)
        assert len(pieces) == len(ref)
        for p, r in zip(pieces, ref, strict=True):
            assert _close(p, r, scale) < REL_TOL
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
    codes = _codes(t, 3)
    full = c2w.decode(codes[None])[0]
    scale = float(full.abs().max())
    diffs = {}
    for ctx in (rf, 25):
        engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": chunk, "left_context": ctx}))
        engine.add(EngineRequest("s", {"stream": ["talker"]}))
        outs: dict = {}
        _stream(engine, "s", codes, random.Random(5), outs)
        _drain(engine, outs)
        position, worst = 0, 0.0
        got = [o for o in outs["s"] if o.data["frames"]]
        for o in got:
            a = _audio(o.data)
            worst = max(worst, _close(a, full[position:position + a.numel()], scale))
            position += a.numel()
        assert position == full.numel() == t * spf - c2w.tail_samples
        diffs[ctx] = worst
    print(f"streamed vs one-shot, relative max abs diff by left_context: {diffs} "
          f"(scale {scale:.3g}; absolute: {[d * scale for d in diffs.values()]})")
    assert diffs[rf] < REL_TOL
    assert diffs[25] < 0.05  # approximate but close: the transformer's far context fades


def test_out_of_order_seq_fails_only_that_request(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": 4, "left_context": 2}))
    for rid in ("good", "bad", "dup"):
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    piece = {"codes": _codes(4, 0).tolist()}
    engine.append("good", "talker", 0, piece, False)
    engine.append("bad", "talker", 1, piece, False)  # seq 0 skipped
    engine.append("dup", "talker", 0, piece, False)
    engine.append("dup", "talker", 0, piece, False)  # duplicate
    engine.append("good", "talker", 1, piece, True)
    engine.append("bad", "talker", 2, piece, True)  # late chunks of a failed request: ignored
    outs = _drain(engine)
    assert outs["bad"][0].error and "out-of-order" in outs["bad"][0].error
    assert "seq 1, expected 0" in outs["bad"][0].error and len(outs["bad"]) == 1
    assert outs["dup"][0].error and "duplicate" in outs["dup"][0].error
    good = outs["good"]
    assert all(o.error is None for o in good) and good[-1].finished
    assert sum(o.data["frames"] for o in good) == 8
    # a producer the request does not stream from
    engine.add(EngineRequest("x", {"stream": ["talker"]}))
    engine.append("x", "thinker", 0, piece, False)
    assert "unexpected stream input" in _drain(engine)["x"][0].error


def test_abort_mid_stream_frees_state(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": 4, "left_context": 2}))
    engine.add(EngineRequest("a", {"stream": ["talker"]}))
    engine.add(EngineRequest("b", {"stream": ["talker"]}))
    engine.append("a", "talker", 0, {"codes": _codes(6, 0).tolist()}, False)
    engine.append("b", "talker", 0, {"codes": _codes(6, 1).tolist()}, False)
    outs = engine.step()
    assert {o.request_id for o in outs} == {"a", "b"} and not any(o.finished for o in outs)
    assert engine.stats()["buffered_frames"] > 0
    engine.abort(["a"])
    assert engine.stats()["running"] == 1
    engine.append("a", "talker", 1, {"codes": _codes(4, 2).tolist()}, True)  # late: dropped
    engine.append("b", "talker", 1, None, True)
    outs = _drain(engine)
    assert set(outs) == {"b"} and outs["b"][-1].finished
    assert engine.stats() | {"calls": 0, "requests_run": 0, "max_batch": 0} == {
        "running": 0, "calls": 0, "requests_run": 0, "max_batch": 0, "buffered_frames": 0,
        "cache_trims": 0}
    assert not engine.has_work()


def test_a_closing_chunk_without_frames_ends_the_stream(c2w):
    """A talker that stops on its end code sends a last output with no codes (only its
    token and finish reason): the stream ends there, with the frames it had (or none);
    a chunk without codes that is not the last is still an error."""
    engine = GenerationEngine(Code2WavRunner(c2w, {"first_chunk_frames": 4, "chunk_frames": 4,
                                                   "left_context": 2}))
    closing = {"token_ids": [66], "finish_reason": "stop"}
    for rid in ("some", "none", "bad"):
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    engine.append("some", "talker", 0, {"codes": _codes(2, 0).tolist()}, False)
    engine.append("some", "talker", 1, closing, True)
    engine.append("none", "talker", 0, closing, True)
    engine.append("bad", "talker", 0, closing, False)
    outs = _drain(engine)
    assert outs["some"][-1].finished and outs["some"][-1].error is None
    samples = sum(_audio(o.data).shape[-1] for o in outs["some"] if o.data)
    assert samples == len(c2w.decode_chunk(_codes(2, 0)[None], 0)[0])  # both frames
    assert outs["none"][-1].finished and outs["none"][-1].error is None
    assert "needs 'codes'" in outs["bad"][-1].error
    assert not engine.has_work() and engine.stats()["running"] == 0


def test_bad_codes_fail_only_that_request(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w))
    engine.add(EngineRequest("ok", {"codes": _codes(5, 0).tolist()}))
    engine.add(EngineRequest("range", {"codes": [[0, 1, 64]] * NQ}))
    engine.add(EngineRequest("nq", {"codes": [[0, 1]] * (NQ - 1)}))
    engine.add(EngineRequest("float", {"codes": [[0, 1.5]] * NQ}))
    engine.add(EngineRequest("empty", {}))
    engine.add(EngineRequest("s", {"stream": ["talker"]}))
    engine.append("s", "talker", 0, {"codes": [[0, -3]] * NQ}, False)
    outs = _drain(engine)
    for rid in ("range", "nq", "float", "empty", "s"):
        assert len(outs[rid]) == 1 and outs[rid][0].finished and outs[rid][0].error, rid
    assert "out of range" in outs["range"][0].error
    assert outs["ok"][0].error is None and outs["ok"][0].finished
    assert engine.stats()["requests_run"] == 1


def test_full_delivery_inputs_and_build(c2w, tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "models" / "qwen3_omni"
    t0 = time.perf_counter()
    engine = build_generation_engine("qwen3_omni_code2wav", model_dir=str(d), device="cpu",
                                     dtype="auto", options={"chunk_frames": 4, "max_batch_size": 2})
    load_s = time.perf_counter() - t0
    c = _codes(9, 4)
    chunks = [{"codes": c[:, :5].tolist()}, {"codes": c[:, 5:].tolist()}]
    engine.add(EngineRequest("f", {"talker": chunks}))
    outs = _drain(engine)["f"]
    assert len(outs) == 1 and outs[0].finished and outs[0].data["frames"] == 9
    ref = c2w.decode(c[None])[0]
    assert _close(_audio(outs[0].data), ref, float(ref.abs().max())) < REL_TOL
    assert engine.info()["chunk_frames"] == 4 and engine.info()["max_batch_size"] == 2
    print(f"build_generation_engine load: {load_s:.2f}s")


def test_full_delivery_of_one_frame_chunks_is_parsed_once(c2w, monkeypatch):
    """A complete input of many chunks (the talker sends one frame each) is joined and
    parsed once; the audio equals the one-shot decode. A chunk of another form (a tensor)
    makes every chunk parse alone, and a bad one still names itself."""
    runner = Code2WavRunner(c2w)
    parsed = []
    parse = runner.parse
    monkeypatch.setattr(runner, "parse", lambda v: parsed.append(v) or parse(v))
    engine = GenerationEngine(runner)
    c = _codes(30, 7)
    engine.add(EngineRequest("f", {"talker": [{"codes": c[:, i:i + 1].tolist()}
                                              for i in range(30)]}))
    assert len(parsed) == 1
    out = _drain(engine)["f"]
    ref = c2w.decode(c[None])[0]
    assert _close(torch.cat([_audio(o.data) for o in out]), ref, float(ref.abs().max())) < REL_TOL
    parsed.clear()
    mixed = [{"codes": c[:, :1]}] + [{"codes": c[:, i:i + 1].tolist()} for i in range(1, 30)]
    engine.add(EngineRequest("m", {"talker": mixed}))
    assert len(parsed) == 30
    _drain(engine)
    bad = [{"codes": c[:, :1].tolist()}, {"codes": [[1]] * (NQ - 1)}]
    engine.add(EngineRequest("b", {"talker": bad}))
    out = _drain(engine)["b"]
    assert out[0].error and f"list of {NQ} lists" in out[0].error


def test_context_frames_stand_in_for_earlier_ones_and_are_never_output(c2w):
    """A chunk carrying "context" (a voice clone's reference codes ahead of a sentence):
    the frames before it go out first, whole; the context is decoded as the left context of
    the frames after it, in place of the earlier ones, and makes no output of its own."""
    chunk, ctx = 6, 4
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": chunk, "left_context": ctx}))
    a, ref, b = _codes(9, 20), _codes(5, 21), _codes(8, 22)
    engine.add(EngineRequest("s", {"stream": ["talker"]}))
    engine.append("s", "talker", 0, {"codes": a.tolist()}, False)
    outs = _drain(engine)  # one chunk of 6; 3 frames wait for more
    engine.append("s", "talker", 1, {"codes": b.tolist(), "context": ref.tolist()}, True)
    got = [o for o in _drain(engine, outs)["s"] if o.data["frames"]]
    assert [o.data["frames"] for o in got] == [6, 3, 6, 2]  # a's rest flushed before b
    assert got[-1].finished and not engine.has_work()
    expected = [c2w.decode_chunk(a[None, :, :6], 0)[0],
                c2w.decode_chunk(a[None, :, 2:9], 4)[0],  # a's own context
                c2w.decode_chunk(torch.cat([ref[:, -4:], b[:, :6]], -1)[None], 4)[0],
                c2w.decode_chunk(b[None, :, 2:8], 4)[0]]
    scale = max(float(w.abs().max()) for w in expected)
    for o, want in zip(got, expected, strict=True):
        assert _close(_audio(o.data), want, scale) < REL_TOL
    # the context changes b's first chunk (it is not decoded after a's frames)
    after_a = c2w.decode_chunk(torch.cat([a[:, -4:], b[:, :6]], -1)[None], 4)[0]
    assert _close(after_a, expected[2], scale) > 100 * REL_TOL


def test_a_runner_that_cannot_pack_an_output_fails_that_request_alone(c2w):
    """A runner's pack() raising (a model adapter's bug, e.g. Qwen3-TTS on the engine's
    closing output) fails its request; the engine, and the replica, go on serving."""
    class PackFails(Code2WavRunner):
        def pack(self, result):
            if result.numel() == 10 * 1920 - 555:  # the 10-frame request's audio
                raise ValueError("not enough values to unpack")
            return super().pack(result)
    engine = GenerationEngine(PackFails(c2w))
    engine.add(EngineRequest("bad", {"codes": _codes(10, seed=1).tolist()}))
    engine.add(EngineRequest("good", {"codes": _codes(20, seed=2).tolist()}))
    outs = _drain(engine)
    bad, good = outs["bad"][-1], outs["good"][-1]
    assert bad.finished and "packing its output failed: ValueError" in bad.error
    assert good.finished and good.error is None and good.data["frames"] == 20
    assert engine.stats()["running"] == 0
    engine.add(EngineRequest("after", {"codes": _codes(20, seed=3).tolist()}))
    assert _drain(engine)["after"][-1].error is None
