"""GenerationEngine over the Qwen3-Omni code2wav runner: a bad input, a stream out of order,
an abort or a runner's bug fails only its request."""

from __future__ import annotations

import pytest
import torch
from unit.code2wav_runs import NQ, code2wav, drain, random_codes

from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.models.qwen3_omni import Code2WavRunner

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def c2w(tmp_path_factory):
    return code2wav(tmp_path_factory)


def test_out_of_order_seq_fails_only_that_request(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": 4, "left_context": 2}))
    for rid in ("good", "bad", "dup"):
        engine.add(EngineRequest(rid, {"stream": ["talker"]}))
    piece = {"codes": random_codes(4, 0).tolist()}
    engine.append("good", "talker", 0, piece, False)
    engine.append("bad", "talker", 1, piece, False)  # seq 0 skipped
    engine.append("dup", "talker", 0, piece, False)
    engine.append("dup", "talker", 0, piece, False)  # duplicate
    engine.append("good", "talker", 1, piece, True)
    engine.append("bad", "talker", 2, piece, True)  # late chunks of a failed request: ignored
    outs = drain(engine)
    assert outs["bad"][0].error and "out-of-order" in outs["bad"][0].error
    assert "seq 1, expected 0" in outs["bad"][0].error and len(outs["bad"]) == 1
    assert outs["dup"][0].error and "duplicate" in outs["dup"][0].error
    good = outs["good"]
    assert all(o.error is None for o in good) and good[-1].finished
    assert sum(o.data["frames"] for o in good) == 8
    # a producer the request does not stream from
    engine.add(EngineRequest("x", {"stream": ["talker"]}))
    engine.append("x", "thinker", 0, piece, False)
    assert "unexpected stream input" in drain(engine)["x"][0].error


def test_abort_mid_stream_frees_state(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w, {"chunk_frames": 4, "left_context": 2}))
    engine.add(EngineRequest("a", {"stream": ["talker"]}))
    engine.add(EngineRequest("b", {"stream": ["talker"]}))
    engine.append("a", "talker", 0, {"codes": random_codes(6, 0).tolist()}, False)
    engine.append("b", "talker", 0, {"codes": random_codes(6, 1).tolist()}, False)
    outs = engine.step()
    assert {o.request_id for o in outs} == {"a", "b"} and not any(o.finished for o in outs)
    assert engine.stats()["buffered_frames"] > 0
    engine.abort(["a"])
    assert engine.stats()["running"] == 1
    engine.append("a", "talker", 1, {"codes": random_codes(4, 2).tolist()}, True)  # late: dropped
    engine.append("b", "talker", 1, None, True)
    outs = drain(engine)
    assert set(outs) == {"b"} and outs["b"][-1].finished
    assert engine.stats() | {"calls": 0, "requests_run": 0, "max_batch": 0} == {
        "running": 0, "calls": 0, "requests_run": 0, "max_batch": 0, "buffered_frames": 0,
        "cache_trims": 0}
    assert not engine.has_work()


def test_bad_codes_fail_only_that_request(c2w):
    engine = GenerationEngine(Code2WavRunner(c2w))
    engine.add(EngineRequest("ok", {"codes": random_codes(5, 0).tolist()}))
    engine.add(EngineRequest("range", {"codes": [[0, 1, 64]] * NQ}))
    engine.add(EngineRequest("nq", {"codes": [[0, 1]] * (NQ - 1)}))
    engine.add(EngineRequest("float", {"codes": [[0, 1.5]] * NQ}))
    engine.add(EngineRequest("empty", {}))
    engine.add(EngineRequest("s", {"stream": ["talker"]}))
    engine.append("s", "talker", 0, {"codes": [[0, -3]] * NQ}, False)
    outs = drain(engine)
    for rid in ("range", "nq", "float", "empty", "s"):
        assert len(outs[rid]) == 1 and outs[rid][0].finished and outs[rid][0].error, rid
    assert "out of range" in outs["range"][0].error
    assert outs["ok"][0].error is None and outs["ok"][0].finished
    assert engine.stats()["requests_run"] == 1


def test_a_runner_that_cannot_pack_an_output_fails_that_request_alone(c2w):
    """A runner's pack() raising (a model adapter's bug) fails its request; the engine,
    and the replica, go on serving."""
    class PackFails(Code2WavRunner):
        def pack(self, result):
            if result.numel() == 10 * 1920 - 555:  # the 10-frame request's audio
                raise ValueError("not enough values to unpack")
            return super().pack(result)
    engine = GenerationEngine(PackFails(c2w))
    engine.add(EngineRequest("bad", {"codes": random_codes(10, seed=1).tolist()}))
    engine.add(EngineRequest("good", {"codes": random_codes(20, seed=2).tolist()}))
    outs = drain(engine)
    bad, good = outs["bad"][-1], outs["good"][-1]
    assert bad.finished and "packing its output failed: ValueError" in bad.error
    assert good.finished and good.error is None and good.data["frames"] == 20
    assert engine.stats()["running"] == 0
    engine.add(EngineRequest("after", {"codes": random_codes(20, seed=3).tolist()}))
    assert drain(engine)["after"][-1].error is None
