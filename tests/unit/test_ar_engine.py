"""AREngine driven in-process on the tiny fixtures (no sockets)."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar import AREngine, _Request, validate_sampling_params
from omni.engines.base import EngineRequest, StepOutput
from omni.fixtures import build_tiny_qwen3, build_tiny_qwen3_moe

torch.set_num_threads(1)

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar")
    q = AREngine(str(build_tiny_qwen3(root / "qwen3")))
    m = AREngine(str(build_tiny_qwen3_moe(root / "qwen3_moe")))
    yield {"qwen3": q, "qwen3_moe": m}
    q.shutdown()
    m.shutdown()


@pytest.fixture
def moe(engines):
    return engines["qwen3_moe"]


def drain(engine, max_steps: int = 200) -> dict[str, list[StepOutput]]:
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


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_greedy_matches_generate_with_concurrent_requests(engines, name):
    engine = engines[name]
    for i, p in enumerate(PROMPTS):
        engine.add(EngineRequest(f"g{i}", {"prompt": p}, {"temperature": 0, "max_tokens": 12}))
    outs = drain(engine)
    tok, model = engine.lm.tokenizer, engine.lm.model
    for i, p in enumerate(PROMPTS):
        ids = tok(p)["input_ids"]
        ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=12, temperature=None, top_p=None,
                             top_k=None)
        assert tokens(outs[f"g{i}"]) == ref[0, len(ids):].tolist()
        assert outs[f"g{i}"][0].data["prompt_tokens"] == len(ids)
        assert [o.finished for o in outs[f"g{i}"]] == [False] * 11 + [True]
    assert engine.stats() == {"running": 0}


def test_max_tokens_gives_length(moe):
    outs = run(moe, {"prompt": PROMPTS[0]}, temperature=0, max_tokens=5)
    assert len(outs) == 5 and len(tokens(outs)) == 5
    assert [o.data["finish_reason"] for o in outs] == [None] * 4 + ["length"]
    assert outs[-1].finished and outs[-1].data["completion_tokens"] == 5
    assert "prompt_tokens" in outs[0].data and "completion_tokens" not in outs[0].data
    assert len(run(moe, {"prompt": PROMPTS[0]}, temperature=0)) == 16  # the default


def test_stop_string(moe):
    full = text(run(moe, {"prompt": PROMPTS[1]}, temperature=0, max_tokens=24))
    stop = next(full[k:k + 3] for k in range(len(full) // 2, len(full) - 3)
                if "\ufffd" not in full[k:k + 3] and full[k:k + 3].strip())
    outs = run(moe, {"prompt": PROMPTS[1]}, temperature=0, max_tokens=24, stop=[stop, "zzzzqq"])
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
    finally:
        moe.lm.eos_token_ids = saved


def test_seed_reproducible(moe):
    for i, seed in enumerate([7, 7, 8]):
        moe.add(EngineRequest(f"s{i}", {"prompt": PROMPTS[0]},
                              {"temperature": 1.0, "seed": seed, "max_tokens": 16, "ignore_eos": True}))
    outs = drain(moe)
    assert tokens(outs["s0"]) == tokens(outs["s1"])
    assert tokens(outs["s0"]) != tokens(outs["s2"])
    a = run(moe, {"prompt": PROMPTS[0]}, temperature=0.8, top_k=5, top_p=0.9, seed=3)
    b = run(moe, {"prompt": PROMPTS[0]}, temperature=0.8, top_k=5, top_p=0.9, seed=3)
    assert tokens(a) == tokens(b)


def test_abort_mid_generation(moe):
    moe.add(EngineRequest("keep", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 8}))
    moe.add(EngineRequest("drop", {"prompt": PROMPTS[1]}, {"temperature": 0, "max_tokens": 8}))
    for _ in range(3):
        assert {o.request_id for o in moe.step()} == {"keep", "drop"}
    assert moe.stats() == {"running": 2}
    moe.abort(["drop", "unknown-id"])
    assert moe.stats() == {"running": 1}
    rest = drain(moe)
    assert set(rest) == {"keep"} and len(rest["keep"]) == 5 and rest["keep"][-1].finished
    assert not moe.has_work()


def test_bad_params_fail_only_that_request(moe):
    moe.add(EngineRequest("bad", {"prompt": PROMPTS[0]}, {"temperature": -1}))
    moe.add(EngineRequest("noinput", {}, {}))
    moe.add(EngineRequest("good", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 4}))
    assert moe.has_work()
    first = {o.request_id: o for o in moe.step()}
    assert first["bad"].finished and "temperature must be >= 0, got -1" in first["bad"].error
    assert first["noinput"].finished and "prompt" in first["noinput"].error
    assert first["good"].error is None and not first["good"].finished
    rest = drain(moe)
    assert set(rest) == {"good"} and rest["good"][-1].data["finish_reason"] == "length"


def test_exception_in_one_request_fails_only_it(moe, monkeypatch):
    real = moe._advance

    def flaky(req):
        if req.id == "boom" and req.output_ids:
            raise RuntimeError("injected")
        return real(req)

    monkeypatch.setattr(moe, "_advance", flaky)
    params = {"max_tokens": 5, "ignore_eos": True, "seed": 0}
    moe.add(EngineRequest("boom", {"prompt": PROMPTS[0]}, params))
    moe.add(EngineRequest("fine", {"prompt": PROMPTS[1]}, params))
    outs = drain(moe)
    assert outs["boom"][-1].finished and "injected" in outs["boom"][-1].error
    assert len(outs["boom"]) == 2
    assert len(outs["fine"]) == 5 and outs["fine"][-1].error is None


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_text_deltas_concatenate_to_decode(moe, seed):
    outs = run(moe, {"prompt": PROMPTS[seed % 2]}, temperature=1.0, seed=seed, max_tokens=24,
               ignore_eos=True)
    expected = moe.lm.tokenizer.decode(tokens(outs), skip_special_tokens=True)
    assert text(outs) == expected
    assert not any(o.data["text"].endswith("\ufffd") for o in outs[:-1])


def test_multibyte_deltas(moe):
    tok = moe.lm.tokenizer
    s = "café 日本語 🙂 naïve"
    ids = tok.encode(s)
    assert any("\ufffd" in tok.decode([t]) for t in ids)  # characters split across tokens
    req = _Request("x", [0], validate_sampling_params({}), None)
    deltas = []
    for i, t in enumerate(ids):
        req.output_ids.append(t)
        before = len(req.text)
        moe._detokenize(req, final=i == len(ids) - 1)
        deltas.append(req.text[before:])
    assert "".join(deltas) == s
    assert not any("\ufffd" in d for d in deltas)


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


def test_validate_sampling_params():
    p = validate_sampling_params({})
    assert p["max_tokens"] == 16 and p["temperature"] == 1.0 and p["stop"] == []
    assert validate_sampling_params({"stop": "x", "top_k": -1})["stop"] == ["x"]
    for bad, field in [({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"),
                       ({"temperature": "hot"}, "temperature"), ({"top_p": 0}, "top_p"),
                       ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"), ({"seed": "x"}, "seed"),
                       ({"stop": [""]}, "stop"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
                       ({"ignore_eos": "yes"}, "ignore_eos")]:
        with pytest.raises(ValueError, match=field):
            validate_sampling_params(bad)


def test_info(engines):
    info = engines["qwen3"].info()
    assert info["random_weights"] is True and info["dtype"] == "float32"
    assert info["device"] == "cpu" and info["vocab_size"] == 1024
    assert info["model_dir"].endswith("qwen3")
