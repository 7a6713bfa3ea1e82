"""The continuous-batching AR engine driven in-process on the tiny fixtures (no sockets):
batched equals alone equals transformers, scheduling, preemption, prefix cache, load options
(per-request parameters, inputs and outputs: test_ar_engine_requests.py)."""

from __future__ import annotations

import pytest
import torch
from unit.ar_engine_runs import PROMPTS, drain, greedy_batch, hf_greedy, model_dirs, tokens

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineLoadError, EngineRequest

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return model_dirs(tmp_path_factory)


@pytest.fixture(scope="module")
def engines(dirs):
    made = {name: AREngine(d) for name, d in dirs.items()}
    yield made
    for e in made.values():
        e.shutdown()


@pytest.fixture
def moe(engines):
    return engines["qwen3_moe"]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_batched_greedy_equals_alone_and_transformers_generate(engines, name):
    engine = engines[name]
    together = greedy_batch(engine, PROMPTS)
    for i, p in enumerate(PROMPTS):
        alone = greedy_batch(engine, [p])["g0"]
        assert together[f"g{i}"] == alone == hf_greedy(engine, p, 12), p
    assert engine.stats()["running"] == 0 and engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("kernel", ["eager", "batched_mm"])
def test_moe_experts_implementation_option(engines, dirs, kernel):
    """`experts_implementation` picks transformers' MoE kernel (the default, grouped_mm,
    is what the shared engine runs): same greedy tokens; a bad name is a load error."""
    engine = AREngine(dirs["qwen3_moe"], options={"experts_implementation": kernel})
    assert engine.lm.model.get_experts_implementation() == {"": kernel}
    assert engines["qwen3_moe"].lm.model.get_experts_implementation() == {"": "grouped_mm"}
    assert greedy_batch(engine, PROMPTS[:3]) == greedy_batch(engines["qwen3_moe"], PROMPTS[:3])
    engine.shutdown()
    with pytest.raises(EngineLoadError, match="experts_implementation.*grouped_mm"):
        AREngine(dirs["qwen3_moe"], options={"experts_implementation": "fastest"})


def test_requests_join_and_leave_every_step(moe):
    moe.add(EngineRequest("a", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 6,
                                                          "ignore_eos": True}))
    first = moe.step()
    assert [o.request_id for o in first] == ["a"]
    moe.add(EngineRequest("b", {"prompt": PROMPTS[1]}, {"temperature": 0, "max_tokens": 3,
                                                          "ignore_eos": True}))
    assert {o.request_id for o in moe.step()} == {"a", "b"}  # b's prefill rides with a's decode
    outs = drain(moe)
    assert len(outs["b"]) == 2 and len(outs["a"]) == 4
    assert tokens([*first, *outs["a"]])[:1] == hf_greedy(moe, PROMPTS[0], 1)


def test_chunked_prefill_and_tiny_cache_keep_outputs_exact(dirs):
    reference = AREngine(dirs["qwen3"])
    expected = greedy_batch(reference, PROMPTS, n=20)
    # 8 tokens per step: every prompt is prefilled in chunks; 12 blocks of 4 tokens: the
    # four sequences cannot all fit, so some are preempted and recomputed later
    small = AREngine(dirs["qwen3"], options={"max_batched_tokens": 8, "block_size": 4,
                                             "kv_cache_blocks": 12})
    assert greedy_batch(small, PROMPTS, n=20) == expected
    stats = small.stats()
    assert stats["preemptions"] > 0 and stats["kv_blocks_used"] == 0


def test_prefill_beside_decodes_holds_prompt_chunks_small_while_others_decode(dirs):
    """prefill_beside_decodes: while a sequence decodes, a step carries at most that many
    prompt tokens (a real-time decoder keeps its pace); alone, a prompt takes the whole
    max_batched_tokens; the outputs are unchanged."""
    reference = AREngine(dirs["qwen3"])
    long_prompt = " ".join(["word"] * 40)
    expected = {"g0": greedy_batch(reference, ["Hi"], n=40)["g0"],
                "g1": greedy_batch(reference, [long_prompt], n=12)["g0"]}
    engine = AREngine(dirs["qwen3"], options={"max_batched_tokens": 64,
                                              "prefill_beside_decodes": 4})
    scheduled = []
    schedule = engine.scheduler.schedule

    def record():
        batch = schedule()
        scheduled.append([(s.id, n, s.computed < len(s.prompt))
                          for s, n in zip(batch.seqs, batch.counts, strict=True)])
        return batch
    engine.scheduler.schedule = record
    engine.add(EngineRequest("g0", {"prompt": "Hi"}, {"temperature": 0, "max_tokens": 40,
                                                      "ignore_eos": True}))
    first = engine.step()  # g0's prompt alone: all of it in one step
    assert scheduled[0] == [("g0", len(engine.lm.tokenizer("Hi")["input_ids"]), True)]
    engine.add(EngineRequest("g1", {"prompt": long_prompt},
                             {"temperature": 0, "max_tokens": 12, "ignore_eos": True}))
    outs = drain(engine)
    prompt_chunks = [n for step in scheduled[1:] for rid, n, prompt in step
                     if rid == "g1" and prompt]
    assert max(prompt_chunks) == 4 and len(prompt_chunks) >= 10  # 40+ tokens, 4 at a time
    assert tokens(first + outs["g0"]) == expected["g0"]
    assert tokens(outs["g1"]) == expected["g1"]
    with pytest.raises(EngineLoadError, match="prefill_beside_decodes must be a positive"):
        AREngine(dirs["qwen3"], options={"prefill_beside_decodes": 0})


def test_a_request_larger_than_the_cache(dirs):
    engine = AREngine(dirs["qwen3"], options={"block_size": 4, "kv_cache_blocks": 6})
    long_prompt = " ".join(["word"] * 40)
    engine.add(EngineRequest("huge", {"prompt": long_prompt}, {"max_tokens": 4}))
    engine.add(EngineRequest("grows", {"prompt": "Hi"}, {"temperature": 0, "max_tokens": 64,
                                                          "ignore_eos": True}))
    outs = drain(engine)
    assert "KV cache holds 24" in outs["huge"][-1].error
    grows = outs["grows"]
    assert grows[-1].finished and grows[-1].data["finish_reason"] == "length"
    assert len(tokens(grows)) < 64  # stopped by the cache, not by max_tokens
    assert engine.stats()["kv_blocks_used"] == 0


def test_prefix_cache_reuses_blocks_and_changes_nothing(dirs):
    engine = AREngine(dirs["qwen3"], options={"block_size": 4})
    shared = "The quick brown fox jumps over the lazy dog and then runs far away into the"
    first = greedy_batch(engine, [shared + " forest"], n=8)["g0"]
    hits = engine.stats()["prefix_cache_hits"]
    engine.add(EngineRequest("again", {"prompt": shared + " forest"},
                             {"temperature": 0, "max_tokens": 8, "ignore_eos": True}))
    outs = drain(engine)["again"]
    assert tokens(outs) == first
    assert outs[0].data["cached_tokens"] > 0
    assert engine.stats()["prefix_cache_hits"] > hits
    off = AREngine(dirs["qwen3"], options={"block_size": 4, "prefix_caching": False})
    assert greedy_batch(off, [shared + " forest"], n=8)["g0"] == first
    assert greedy_batch(off, [shared + " forest"], n=8)["g0"] == first
    assert off.stats()["prefix_cache_hits"] == 0


def test_stage_memory_sizes_the_kv_cache(dirs):
    from omni.engines.ar.kv_cache import PagedKVCache
    from omni.engines.base import EngineLoadError

    probe = AREngine(dirs["qwen3"], options={"kv_cache_blocks": 2})
    weights = sum(p.numel() * p.element_size() for p in probe.lm.model.parameters())
    cfg = probe.lm.config
    per_block = PagedKVCache.bytes_per_block(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                             cfg.head_dim, 16, torch.float32)
    engine = AREngine(dirs["qwen3"], memory_bytes=weights + 40 * per_block + 7)
    assert engine.info()["kv_blocks"] == 40
    with pytest.raises(EngineLoadError, match="leaves no room for a KV cache"):
        AREngine(dirs["qwen3"], memory_bytes=weights)
    # a budget past what the sequences could ever fill is not allocated
    roomy = AREngine(dirs["qwen3"], memory_bytes=weights + 10**6 * per_block,
                     options={"max_num_seqs": 3})
    assert roomy.info()["kv_blocks"] == 3 * -(-roomy.lm.max_positions // 16)


def test_an_unknown_option_fails_the_load_and_names_the_valid_ones(dirs):
    with pytest.raises(EngineLoadError, match="unknown ar engine option.*max_num_seq\\b.*"
                                             "the options are .*max_num_seqs"):
        AREngine(dirs["qwen3"], options={"max_num_seq": 8})  # a typo of max_num_seqs
    engine = AREngine(dirs["qwen3"], options={"nice": 0, "overlap_steps": False})  # proc's
    engine.shutdown()


def test_a_dropped_engine_is_freed_at_once_without_a_gc_pass(dirs):
    """A reference cycle through the engine (its step runner held it strongly once) keeps
    a dropped engine, and on a GPU its weights and KV cache, alive until the next GC
    pass: a second engine built in the same process then sized its cache from what was
    left, and CUDA graph capture ran out of memory (tests/gpu/test_omni_cuda.py, H100)."""
    import gc
    import weakref

    engine = AREngine(dirs["qwen3"])
    engine.add(EngineRequest("r", {"prompt": PROMPTS[0]}, {"max_tokens": 3}))
    drain(engine)
    gc.collect()
    gc.disable()
    try:
        dropped = weakref.ref(engine)
        del engine
        assert dropped() is None, gc.get_referrers(dropped())
    finally:
        gc.enable()
