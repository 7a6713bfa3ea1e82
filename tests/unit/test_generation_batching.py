"""GenerationEngine over the Qwen3-Omni code2wav runner: complete inputs, batching into
calls, frames per call, options and the build."""

from __future__ import annotations

import time

import pytest
import torch
from unit.code2wav_runs import (
    NQ,
    REL_TOL,
    audio_of,
    code2wav,
    drain,
    model_dir,
    random_codes,
    rel_diff,
)

from omni.engines.base import EngineLoadError, EngineRequest
from omni.engines.generation.build import build_generation_engine
from omni.engines.generation.engine import GenerationEngine
from omni.models.qwen3_omni import Code2WavRunner

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def c2w(tmp_path_factory):
    return code2wav(tmp_path_factory)


def test_complete_inputs_batched_in_one_call(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w))
    codes = {f"r{i}": random_codes(20, seed=i) for i in range(3)}
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
        got = audio_of(o.data)
        assert o.data["sample_rate"] == 24000 and o.data["frames"] == 20 and o.data["index"] == 0
        assert o.data["samples"] == got.numel() == 20 * 1920 - 555
        assert rel_diff(got, ref, float(ref.abs().max())) < REL_TOL
    info = engine.info()
    assert info["sample_rate"] == 24000 and info["engine"] == "generation"


def test_gather_ms_holds_an_idle_engine_for_the_rest_of_a_burst(c2w):
    """Option gather_ms (omni/engines/gather/): requests that find the engine idle wait
    until none has come for that long (the process loop waits on its socket); a caller
    that steps the engine itself runs them at once, in one call."""
    with pytest.raises(EngineLoadError, match="gather_ms"):
        GenerationEngine(Code2WavRunner(c2w), {"gather_ms": -1})
    codes = random_codes(20, seed=0).tolist()
    plain = GenerationEngine(Code2WavRunner(c2w))
    plain.add(EngineRequest("a", {"codes": codes}))
    assert plain.gather_s() == 0  # off by default
    engine = GenerationEngine(Code2WavRunner(c2w), {"gather_ms": 60_000})
    engine.add(EngineRequest("a", {"codes": codes}))
    assert 59 < engine.gather_s() <= 60
    engine.abort(["a"])
    assert engine.gather_s() == 0  # nothing left to gather
    for rid in "bc":
        engine.add(EngineRequest(rid, {"codes": codes}))
        assert engine.gather_s() > 59  # counted from the latest arrival
    assert {o.request_id for o in engine.step()} == {"b", "c"}
    assert engine.stats()["calls"] == 1 and engine.gather_s() == 0


def test_frames_per_call_are_capped(c2w):
    """max_batch_frames splits a batch (rows x frames) into calls; the audio is the same.
    Code2WavRunner sets a CPU default (a big batch is slower per frame there)."""
    assert Code2WavRunner(c2w).batch_frames == 64  # CPU
    engine = GenerationEngine(Code2WavRunner(c2w), {"max_batch_frames": 40})
    codes = {f"r{i}": random_codes(20, seed=i) for i in range(3)}
    for rid, c in codes.items():
        engine.add(EngineRequest(rid, {"codes": c.tolist()}))
    outs = drain(engine)
    st = engine.stats()
    assert (st["calls"], st["requests_run"], st["max_batch"]) == (2, 3, 2)
    for rid, c in codes.items():
        ref = c2w.decode(c[None])[0]
        assert rel_diff(audio_of(outs[rid][0].data), ref, float(ref.abs().max())) < REL_TOL
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
    d = model_dir(tmp_path_factory)
    with pytest.raises(EngineLoadError, match=r"unknown generation engine \(qwen3_omni_code2wav"
                       r"\) option\(s\) first_chunk_frame; the options are .*"
                       r"first_chunk_frames.*max_batch_size.*nice"):
        build_generation_engine("qwen3_omni_code2wav", model_dir=str(d), device="cpu",
                                dtype="float32", options={"first_chunk_frame": 4, "nice": 5})
    engine = build_generation_engine(
        "qwen3_omni_code2wav", model_dir=str(d), device="cpu", dtype="float32",
        options={"first_chunk_frames": 4, "max_batch_size": 8, "nice": 5})
    assert engine.runner.first_chunk_frames == 4 and engine.max_batch_size == 8


def test_full_delivery_inputs_and_build(c2w, tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "models" / "qwen3_omni"
    t0 = time.perf_counter()
    engine = build_generation_engine("qwen3_omni_code2wav", model_dir=str(d), device="cpu",
                                     dtype="auto", options={"chunk_frames": 4, "max_batch_size": 2})
    load_s = time.perf_counter() - t0
    c = random_codes(9, 4)
    chunks = [{"codes": c[:, :5].tolist()}, {"codes": c[:, 5:].tolist()}]
    engine.add(EngineRequest("f", {"talker": chunks}))
    outs = drain(engine)["f"]
    assert len(outs) == 1 and outs[0].finished and outs[0].data["frames"] == 9
    ref = c2w.decode(c[None])[0]
    assert rel_diff(audio_of(outs[0].data), ref, float(ref.abs().max())) < REL_TOL
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
    c = random_codes(30, 7)
    engine.add(EngineRequest("f", {"talker": [{"codes": c[:, i:i + 1].tolist()}
                                              for i in range(30)]}))
    assert len(parsed) == 1
    out = drain(engine)["f"]
    ref = c2w.decode(c[None])[0]
    assert rel_diff(torch.cat([audio_of(o.data) for o in out]), ref, float(ref.abs().max())) < REL_TOL
    parsed.clear()
    mixed = [{"codes": c[:, :1]}] + [{"codes": c[:, i:i + 1].tolist()} for i in range(1, 30)]
    engine.add(EngineRequest("m", {"talker": mixed}))
    assert len(parsed) == 30
    drain(engine)
    bad = [{"codes": c[:, :1].tolist()}, {"codes": [[1]] * (NQ - 1)}]
    engine.add(EngineRequest("b", {"talker": bad}))
    out = drain(engine)["b"]
    assert out[0].error and f"list of {NQ} lists" in out[0].error
