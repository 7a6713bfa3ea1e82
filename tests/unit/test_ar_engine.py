"""The continuous-batching AR engine driven in-process on the tiny fixtures (no sockets)."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineLoadError, EngineRequest, StepOutput
from omni.fixtures import build_tiny_qwen3, build_tiny_qwen3_moe

torch.set_num_threads(1)

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who",
           "One", "The quick brown fox jumps over the lazy dog and then runs far away into"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar")
    # a larger init than transformers' default, so greedy answers vary (with 0.02 they
    # repeat one token, and a test of batching or positions could not fail)
    return {"qwen3": str(build_tiny_qwen3(root / "qwen3", initializer_range=0.5)),
            "qwen3_moe": str(build_tiny_qwen3_moe(root / "qwen3_moe", initializer_range=0.5))}


@pytest.fixture(scope="module")
def engines(dirs):
    made = {name: AREngine(d) for name, d in dirs.items()}
    yield made
    for e in made.values():
        e.shutdown()


@pytest.fixture
def moe(engines):
    return engines["qwen3_moe"]


def drain(engine, max_steps: int = 500) -> dict[str, list[StepOutput]]:
    outs: dict[str, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outs
        for o in engine.step():
            assert not outs.get(o.request_id) or not outs[o.request_id][-1].finished, o
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not finish")


def tokens(outs: list[StepOutput]) -> list[int]:
    return [t for o in outs for t in o.data["token_ids"]]


def text(outs: list[StepOutput]) -> str:
    return "".join(o.data["text"] for o in outs)


def run(engine, inputs, **params) -> list[StepOutput]:
    engine.add(EngineRequest("r", inputs, params))
    return drain(engine)["r"]


_REFERENCE: dict[str, object] = {}


def hf_greedy(engine, prompt: str, n: int) -> list[int]:
    """transformers' own generate() on its own copy of the model (sdpa attention)."""
    from transformers import AutoModelForCausalLM

    model_dir = engine.lm.model_dir
    if model_dir not in _REFERENCE:
        _REFERENCE[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = engine.lm.tokenizer(prompt)["input_ids"]
    ref = _REFERENCE[model_dir].generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False, max_new_tokens=n, min_new_tokens=n, temperature=None, top_p=None,
        top_k=None)
    return ref[0, len(ids):].tolist()


def greedy_batch(engine, prompts, n=12, **params) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        engine.add(EngineRequest(f"g{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": n, "ignore_eos": True, **params}))
    outs = drain(engine)
    return {rid: tokens(o) for rid, o in outs.items()}


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


def test_max_tokens_gives_length(moe):
    outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=5, ignore_eos=True)
    assert len(outs) == 5 and len(tokens(outs)) == 5
    assert [o.data["finish_reason"] for o in outs] == [None] * 4 + ["length"]
    assert outs[-1].finished and outs[-1].data["completion_tokens"] == 5
    assert "prompt_tokens" in outs[0].data and "completion_tokens" not in outs[0].data


def test_stop_string(moe):
    full = text(run(moe, {"prompt": PROMPTS[1]}, temperature=0, max_tokens=24, ignore_eos=True))
    stop = next(full[k:k + 3] for k in range(len(full) // 2, len(full) - 3)
                if "\ufffd" not in full[k:k + 3] and full[k:k + 3].strip())
    outs = run(moe, {"prompt": PROMPTS[1]}, temperature=0, max_tokens=24, ignore_eos=True,
               stop=[stop, "zzzzqq"])
    assert outs[-1].data["finish_reason"] == "stop" and outs[-1].finished
    assert text(outs) == full[:full.find(stop)]
    assert len(tokens(outs)) < 24


def test_stop_token_ids_and_ignore_eos(moe):
    first = tokens(run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=1))[0]
    outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, stop_token_ids=[first])
    assert tokens(outs) == [first] and outs[-1].data["finish_reason"] == "stop"
    saved = moe.lm.eos_token_ids
    moe.lm.eos_token_ids = {first}  # pretend the model emits eos first
    try:
        assert len(run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=6)) == 1
        outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=6, ignore_eos=True)
        assert len(outs) == 6 and outs[-1].data["finish_reason"] == "length"
        outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=6, min_tokens=3)
        got = tokens(outs)  # eos (= the greedy first token) is masked for 3 tokens
        assert len(got) >= 3 and first not in got[:3]
        if outs[-1].data["finish_reason"] == "stop":
            assert got[-1] == first  # stopped by eos, once allowed
        else:
            assert outs[-1].data["finish_reason"] == "length" and len(got) == 6
    finally:
        moe.lm.eos_token_ids = saved


def test_seed_reproducible_whatever_shares_the_batch(moe):
    params = {"temperature": 1.0, "seed": 7, "max_tokens": 16, "ignore_eos": True}
    alone = tokens(run(moe, {"prompt": PROMPTS[0]}, **params))
    for i, seed in enumerate([7, 8, 9]):
        moe.add(EngineRequest(f"s{i}", {"prompt": PROMPTS[0]}, {**params, "seed": seed}))
    outs = drain(moe)
    assert tokens(outs["s0"]) == alone
    assert tokens(outs["s1"]) != alone


def test_logprobs(moe):
    outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=3, logprobs=2)
    for o in outs:
        (entry,) = o.data["logprobs"]
        assert entry["token_id"] == o.data["token_ids"][0] and entry["logprob"] <= 0
        assert len(entry["top"]) == 2 and entry["top"][0]["logprob"] >= entry["top"][1]["logprob"]
        assert entry["top"][0]["token_id"] == entry["token_id"]  # greedy picks the top one


def test_abort_frees_blocks(moe):
    moe.add(EngineRequest("keep", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 8,
                                                             "ignore_eos": True}))
    moe.add(EngineRequest("drop", {"prompt": PROMPTS[1]}, {"temperature": 0, "max_tokens": 8,
                                                             "ignore_eos": True}))
    for _ in range(3):
        assert {o.request_id for o in moe.step()} == {"keep", "drop"}
    used = moe.stats()["kv_blocks_used"]
    moe.abort(["drop", "unknown-id"])
    assert moe.stats()["running"] == 1 and moe.stats()["kv_blocks_used"] < used
    rest = drain(moe)
    assert set(rest) == {"keep"} and len(rest["keep"]) == 5 and rest["keep"][-1].finished
    assert not moe.has_work() and moe.stats()["kv_blocks_used"] == 0


def test_bad_params_fail_only_that_request(moe):
    moe.add(EngineRequest("bad", {"prompt": PROMPTS[0]}, {"temperature": -1}))
    moe.add(EngineRequest("noinput", {}, {}))
    moe.add(EngineRequest("good", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 4,
                                                             "ignore_eos": True}))
    first = {o.request_id: o for o in moe.step()}
    assert first["bad"].finished and "temperature" in first["bad"].error
    assert first["noinput"].finished and "prompt" in first["noinput"].error
    assert first["good"].error is None and not first["good"].finished
    rest = drain(moe)
    assert set(rest) == {"good"} and rest["good"][-1].data["finish_reason"] == "length"


def test_failure_in_one_request_fails_only_it(moe, monkeypatch):
    params = {"max_tokens": 5, "ignore_eos": True, "seed": 0}
    moe.add(EngineRequest("boom", {"prompt": PROMPTS[0]}, params))
    moe.add(EngineRequest("fine", {"prompt": PROMPTS[1]}, params))
    detok = moe._seqs["boom"].state.detok

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(detok, "push", broken)
    outs = drain(moe)
    assert outs["boom"][-1].finished and "injected" in outs["boom"][-1].error
    assert len(outs["fine"]) == 5 and outs["fine"][-1].error is None
    assert moe.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_text_deltas_concatenate_to_decode(moe, seed):
    outs = run(moe, {"prompt": PROMPTS[seed % 2]}, temperature=1.0, seed=seed, max_tokens=24,
               ignore_eos=True)
    expected = moe.lm.tokenizer.decode(tokens(outs), skip_special_tokens=True)
    assert text(outs) == expected


def test_inputs_messages_and_token_ids(moe):
    from omni.models.hf_causal import apply_chat_template

    msgs = [{"role": "user", "content": "Tell me a story"}]
    a = run(moe, {"messages": msgs}, temperature=0, max_tokens=4)
    ids = apply_chat_template(moe.lm.tokenizer, msgs)
    assert a[0].data["prompt_tokens"] == len(ids)
    b = run(moe, {"prompt_token_ids": ids}, temperature=0, max_tokens=4)
    assert tokens(a) == tokens(b)
    bad = run(moe, {"prompt_token_ids": [1, 10**6]}, max_tokens=4)
    assert bad[-1].finished and "out of range" in bad[-1].error


def test_stream_input_waits_then_matches_a_complete_prompt(moe):
    ids = moe.lm.tokenizer(PROMPTS[3])["input_ids"]
    expected = tokens(run(moe, {"prompt_token_ids": ids}, temperature=0, max_tokens=5,
                          ignore_eos=True))
    moe.add(EngineRequest("s", {"stream": ["up"]}, {"temperature": 0, "max_tokens": 5,
                                                     "ignore_eos": True}))
    assert not moe.has_work() and moe.step() == []  # nothing to run: no placeholder tokens
    moe.append("s", "up", 0, {"token_ids": ids[:5]}, False)
    assert moe.step() == []  # the first tokens are prefilled, nothing is sampled yet
    assert moe._seqs["s"].computed == 4
    moe.append("s", "up", 1, {"token_ids": ids[5:]}, False)
    moe.step()
    moe.append("s", "up", 2, None, True)
    assert tokens(drain(moe)["s"]) == expected
    # text chunks are tokenized together once the stream ends
    moe.add(EngineRequest("t", {"stream": ["up"]}, {"temperature": 0, "max_tokens": 5,
                                                     "ignore_eos": True}))
    moe.append("t", "up", 0, {"text": PROMPTS[3][:10]}, False)
    moe.append("t", "up", 1, {"text": PROMPTS[3][10:]}, True)
    assert tokens(drain(moe)["t"]) == expected


def test_stream_input_errors_fail_only_that_request(moe):
    moe.add(EngineRequest("gap", {"stream": ["up"]}, {"max_tokens": 2}))
    moe.add(EngineRequest("who", {"stream": ["up"]}, {"max_tokens": 2}))
    moe.add(EngineRequest("empty", {"stream": ["up"]}, {"max_tokens": 2}))
    moe.append("gap", "up", 1, {"token_ids": [1]}, False)
    moe.append("who", "other", 0, {"token_ids": [1]}, False)
    moe.append("empty", "up", 0, None, True)
    errors = {o.request_id: o.error for o in moe.step()}
    assert "expected 0" in errors["gap"] and "unexpected" in errors["who"]
    assert "without any prompt" in errors["empty"]
    assert not moe.has_work() and moe.stats()["kv_blocks_used"] == 0


def test_hidden_state_export_survives_preemption(dirs):
    """A preempted sequence is recomputed from its first position; the rows it already
    exported are not sent again, so each fed position's rows arrive once, as without
    preemption."""
    def rows(options):
        engine = AREngine(dirs["qwen3"], options={"export_hidden_layers": [0, -1], **options})
        for i, p in enumerate(PROMPTS):
            engine.add(EngineRequest(f"g{i}", {"prompt": p}, {"temperature": 0, "max_tokens": 20,
                                                              "ignore_eos": True}))
        outs = drain(engine)
        got = {rid: torch.cat([o.data["hidden_states"] for o in o_ if "hidden_states" in o.data])
               for rid, o_ in outs.items()}
        return got, engine

    roomy, _ = rows({})
    tight, engine = rows({"max_batched_tokens": 8, "block_size": 4, "kv_cache_blocks": 12})
    assert engine.stats()["preemptions"] > 0
    for i, p in enumerate(PROMPTS):
        fed = len(engine.lm.tokenizer(p)["input_ids"]) + 20 - 1  # the last token is not fed
        assert tight[f"g{i}"].shape[0] == roomy[f"g{i}"].shape[0] == fed, p
        torch.testing.assert_close(tight[f"g{i}"], roomy[f"g{i}"], rtol=1e-4, atol=1e-4)


def test_hidden_state_export(dirs):
    from transformers import AutoModelForCausalLM

    engine = AREngine(dirs["qwen3"], options={"export_hidden_layers": [0, -1],
                                              "max_batched_tokens": 6})
    ids = engine.lm.tokenizer(PROMPTS[3])["input_ids"]  # prefilled in chunks of 6
    engine.add(EngineRequest("h", {"prompt_token_ids": ids},
                             {"temperature": 0, "max_tokens": 4, "ignore_eos": True}))
    outs = drain(engine)["h"]
    hidden = engine.lm.config.hidden_size
    shapes = [tuple(o.data["hidden_states"].shape) for o in outs]
    assert shapes == [(len(ids), 2, hidden)] + [(1, 2, hidden)] * 3
    seen = ids + tokens(outs)[:-1]  # the last sampled token is never fed
    ref = AutoModelForCausalLM.from_pretrained(dirs["qwen3"], dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([seen]), output_hidden_states=True).hidden_states
    got = torch.cat([o.data["hidden_states"] for o in outs])
    torch.testing.assert_close(got[:, 0], want[0][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[:, 1], want[-1][0], atol=1e-4, rtol=1e-3)


def test_prompt_embeddings_instead_of_token_ids(moe):
    ids = moe.lm.tokenizer(PROMPTS[3])["input_ids"]
    params = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    expected = tokens(run(moe, {"prompt_token_ids": ids}, **params))
    with torch.no_grad():
        embeds = moe.lm.model.get_input_embeddings()(torch.tensor(ids)).clone()
    for _ in range(2):  # the second run finds nothing in the prefix cache for embeddings
        outs = run(moe, {"prompt_embeds": embeds}, **params)
        assert tokens(outs) == expected and outs[0].data["cached_tokens"] == 0
    # mixed in one step with a token-id prompt
    moe.add(EngineRequest("e", {"prompt_embeds": embeds}, params))
    moe.add(EngineRequest("i", {"prompt_token_ids": ids}, params))
    both = drain(moe)
    assert tokens(both["e"]) == tokens(both["i"]) == expected
    bad = run(moe, {"prompt_embeds": embeds[:, :3]}, **params)
    assert "prompt_embeds must be a" in bad[-1].error


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
