"""Budgets users can reason about (issue #44): an AR stage says how many sequences of its
full context its KV cache holds, warns when a memory budget leaves room for fewer than
max_num_seqs (naming the budget that would fit them), and max_model_len trades context
for concurrency."""

from __future__ import annotations

import pytest
import torch

from omni.config.memory import memory_note
from omni.engines.ar.engine import AREngine
from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("qwen3"))
    probe = AREngine(str(model_dir), options={"kv_cache_blocks": 2})
    weights = sum(p.numel() * p.element_size() for p in probe.lm.model.parameters())
    cfg = probe.lm.config
    per_block = PagedKVCache.bytes_per_block(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                             cfg.head_dim, 16, torch.float32)
    return str(model_dir), weights, per_block, probe.lm.max_positions


def test_a_short_budget_says_how_many_fit_and_what_to_raise(model):
    model_dir, weights, per_block, context = model
    engine = AREngine(model_dir, memory_bytes=weights + 40 * per_block,
                      options={"max_num_seqs": 8})
    info = engine.info()
    per_seq = -(-context // 16)
    assert info["kv_tokens"] == 40 * 16 and info["max_context"] == context
    assert info["full_context_sequences"] == 40 // per_seq < 8
    [warning] = engine.load_warnings()
    missing = (8 * per_seq - 40) * per_block / 2**30
    assert f"holds {40 // per_seq} sequences of the full {context}-token context" in warning
    assert f"raise the stage's memory by {missing:.2f} GiB" in warning
    assert "max_model_len (~80 tokens would fit)" in warning
    assert f"{40 // per_seq} sequences of the full {context}-token context" in memory_note(info)


def test_max_model_len_fits_them_all_and_bounds_prompts(model):
    model_dir, weights, per_block, context = model
    engine = AREngine(model_dir, memory_bytes=weights + 40 * per_block,
                      options={"max_num_seqs": 4, "max_model_len": 160})
    info = engine.info()
    assert info["max_context"] == 160 < context and info["full_context_sequences"] == 4
    assert engine.load_warnings() == []
    engine.add(EngineRequest("long", {"prompt_token_ids": list(range(3, 203))},
                                     {"max_tokens": 4}))
    outs = []
    for _ in range(5):
        outs += engine.step()
    assert outs and "limit is 160" in (outs[-1].error or "")


def test_without_a_budget_the_cache_size_is_the_operators_choice(model):
    model_dir, *_ = model
    engine = AREngine(model_dir, options={"kv_cache_blocks": 4, "max_num_seqs": 64})
    assert engine.info()["full_context_sequences"] < 64
    assert engine.load_warnings() == []  # READY's line still says how many fit
