"""Prefill warm-up at load (AR option warm_prefill, on by default on CUDA): two eager
steps of zero inputs on borrowed KV blocks. On a CPU these tests check that it runs
through the real forward, for ids and for embeddings, and leaves nothing behind."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.ar.warm import SHORT_PROMPT, warm_prefill
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3, ensure_tiny_model

torch.set_num_threads(1)

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("warm") / "qwen3",
                                initializer_range=0.5))


def _greedy(engine: AREngine) -> dict[str, list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add(EngineRequest(f"r{i}", {"prompt": prompt},
                                 {"temperature": 0, "max_tokens": 12, "ignore_eos": True}))
    tokens: dict[str, list[int]] = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            tokens.setdefault(out.request_id, []).extend(out.data["token_ids"])
    return tokens


def _untouched(engine: AREngine) -> None:
    pool = engine.cache.pool
    assert pool.available == pool.num_blocks  # every borrowed block given back
    assert pool.hits == 0 and not pool._block_of  # nothing published for prefix caching
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_warmed_engine_answers_as_a_cold_one(model_dir):
    warmed = AREngine(model_dir, options={"warm_prefill": True})
    _untouched(warmed)
    assert _greedy(warmed) == _greedy(AREngine(model_dir))  # CPU default: no warm-up


def test_both_steps_run_and_a_small_cache_skips_the_full_one(model_dir):
    engine = AREngine(model_dir)
    inputs = engine._warm_inputs
    assert warm_prefill(engine.lm, engine.cache, 512, inputs) == [SHORT_PROMPT, 512]
    _untouched(engine)
    small = AREngine(model_dir, options={"kv_cache_blocks": 8, "block_size": 16})
    assert warm_prefill(small.lm, small.cache, 512, small._warm_inputs) == [SHORT_PROMPT]
    _untouched(small)


def test_a_model_fed_embeddings_warms_with_embeddings(tmp_path_factory):
    omni_dir = str(ensure_tiny_model("qwen3_omni",
                                     cache_dir=tmp_path_factory.getbasetemp() / "models"))
    talker = FeedbackAREngine("qwen3_omni_talker", omni_dir, options={"warm_prefill": True})
    assert set(talker._warm_inputs(3)) == {"inputs_embeds"}
    _untouched(talker)
