"""A session's KV held between turns on CUDA, with the engine's GPU defaults (decode
graphs, overlapped and chained steps) and without graphs: the next turn reuses the whole
conversation and answers exactly as a fresh engine does; releasing gives the blocks back."""

from __future__ import annotations

import pytest

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3

GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
PROMPT = [(3 * j) % 97 + 2 for j in range(41)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("cuda-sessions") / "qwen3",
                                initializer_range=0.5))


def run(engine, rid, ids, **params):
    engine.add(EngineRequest(rid, {"prompt_token_ids": ids}, {**GREEDY, **params}))
    outs = []
    while engine.has_work():
        outs += [o for o in engine.step() if o.request_id == rid]
    assert outs and outs[-1].finished and outs[-1].error is None
    return [t for o in outs for t in o.data["token_ids"]], outs[0].data["cached_tokens"]


@pytest.mark.parametrize("options", [{}, {"cuda_graphs": False, "overlap_steps": False}],
                         ids=["gpu-defaults", "eager"])
def test_session_turns_on_cuda(model_dir, options):
    options = {"block_size": 16, "kv_cache_blocks": 64, **options}
    engine = AREngine(model_dir, device="cuda", dtype="float32", options=options)
    fresh = AREngine(model_dir, device="cuda", dtype="float32", options=options)
    base = engine.cache.pool.used  # the graphs' scratch block, if any
    answer, cached = run(engine, "t1", PROMPT, session="s")
    assert cached == 0 and len(set(answer)) > 2
    follow = PROMPT + answer + [11, 12, 13]
    second, cached = run(engine, "t2", follow, session="s")
    assert cached == len(PROMPT) + len(answer) - 1
    assert run(fresh, "f", follow)[0] == second
    assert engine.end_session("s", "close") and engine.stats()["session_bytes"] == {}
    assert engine.cache.pool.used == base
