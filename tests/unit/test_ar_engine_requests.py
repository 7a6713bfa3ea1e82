"""The AR engine's requests, driven in-process on the tiny fixtures: sampling parameters,
stops, seeds, aborts, failures kept to their request, input forms (messages, token ids,
streamed input, embeddings) and hidden-state export."""

from __future__ import annotations

import pytest
import torch
from unit.ar_engine_runs import PROMPTS, drain, model_dirs, run, text, tokens

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return model_dirs(tmp_path_factory)


@pytest.fixture(scope="module")
def moe(dirs):
    engine = AREngine(dirs["qwen3_moe"])
    yield engine
    engine.shutdown()


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


@pytest.mark.parametrize("messages, field", [
    ([{"content": "no role"}], "messages[0]"),
    ([{"role": "user", "content": "hi"}, {"role": "user", "content": 7}], "messages[1].content"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}],
     "messages[0].content[1]"),
])
def test_a_bad_message_is_refused_naming_it(moe, messages, field):
    """A message the text model cannot render fails its request alone, the error naming
    the message or part (the 400's param), as the API's own checks do."""
    outs = run(moe, {"messages": messages}, max_tokens=4)
    assert outs[-1].finished and outs[-1].error_field == field, outs[-1]
    assert moe.stats()["kv_blocks_used"] == 0


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
