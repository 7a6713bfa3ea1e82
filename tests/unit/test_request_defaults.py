"""Request defaults: generation_config.json < the pipeline (a stage's params, then the
pipeline's `defaults:` for the modalities asked for) < the request. The AR engine runs
on a tiny Qwen3 whose generation_config.json each test writes; the pipeline layer is
merged by the orchestrator's own functions (plan_route, stage_params)."""

from __future__ import annotations

import json
import pickle
import shutil
from types import SimpleNamespace

import pytest
import torch

from omni.config.pipeline import ConfigError, load_pipeline_file, parse_pipeline
from omni.config.presets import preset_path
from omni.engines.ar.defaults import with_system_prompt
from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineLoadError, EngineRequest
from omni.fixtures import build_tiny_qwen3
from omni.models.causal_lm import sampling_defaults
from omni.runtime.pipeline_sessions import stage_params
from omni.runtime.routing import plan_route

torch.set_num_threads(1)

CHAT = [{"role": "user", "content": "Tell me a story about a robot who"}]
PIPELINE = {
    "name": "p",
    "stages": [{"name": "llm", "engine": "echo", "final_output": "text",
                "params": {"max_tokens": 4, "top_k": 7}},
               {"name": "tts", "engine": "echo", "final_output": "audio"}],
    "edges": [{"from": "llm", "to": "tts"}],
    "defaults": {"audio": {"llm": {"max_tokens": 5, "system_prompt": "Be brief."}}},
    "views": {"chat": {"stages": ["llm"]}},
}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    # a larger init than transformers' default, so sampled answers vary
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "qwen3", initializer_range=0.5)


def _with_config(base_dir, tmp_path, config: dict):
    model_dir = tmp_path / "model"
    shutil.copytree(base_dir, model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    return model_dir


@pytest.fixture(scope="module")
def engine(base_dir, tmp_path_factory):
    """Its generation_config.json: greedy, 3 new tokens; do_sample is not read."""
    model_dir = _with_config(base_dir, tmp_path_factory.mktemp("cfg"), {
        "eos_token_id": [0], "do_sample": True, "temperature": 0.0, "max_new_tokens": 3,
        "top_k": None})
    made = AREngine(str(model_dir))
    yield made
    made.shutdown()


def _generate(engine, params, rid="r", inputs=None) -> list[int]:
    engine.add(EngineRequest(rid, inputs or {"messages": CHAT}, {"ignore_eos": True, **params}))
    ids = []
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            ids += out.data["token_ids"]
    return ids


def _pipeline_params(config, modalities, request_params, view=None):
    """The llm stage's params as the orchestrator sends them (plan, then stage_params)."""
    source = config if view is None else config.views[view]
    plan = plan_route(source, source.route(modalities))
    state = SimpleNamespace(params=request_params, session=None)
    return stage_params(plan.params["llm"], state, "llm", set())


def test_generation_config_fields_become_engine_defaults(engine):
    assert engine.defaults == {"temperature": 0.0, "max_tokens": 3}
    assert engine.info()["sampling_defaults"] == engine.defaults
    first = _generate(engine, {})
    assert len(first) == 3
    assert _generate(engine, {}) == first  # greedy, from the file: the same again


def test_the_request_overrides_the_model(engine):
    sampled = {tuple(_generate(engine, {"temperature": 1.0, "seed": s, "max_tokens": 6}))
               for s in range(4)}
    assert {len(s) for s in sampled} == {6}
    assert len(sampled) > 1  # the request's temperature, not the file's greedy


def test_model_then_pipeline_then_request(engine):
    config = parse_pipeline(PIPELINE)
    text_only = _pipeline_params(config, ["text"], {})
    assert text_only == {"max_tokens": 4, "top_k": 7}  # the stage's params
    assert len(_generate(engine, text_only)) == 4  # over the model's 3
    spoken = _pipeline_params(config, ["text", "audio"], {})
    assert spoken == {"max_tokens": 5, "top_k": 7, "system_prompt": "Be brief."}
    assert len(_generate(engine, spoken)) == 5  # defaults.audio over the stage's params
    asked = _pipeline_params(config, ["text", "audio"], {"llm": {"max_tokens": 2}})
    assert asked["max_tokens"] == 2 and len(_generate(engine, asked)) == 2  # the request
    assert _pipeline_params(config, ["text"], {}, view="chat") == text_only  # views: own only


def test_the_system_prompt_changes_the_prompt_unless_the_chat_has_one(engine):
    plain = _generate(engine, {"max_tokens": 6})
    prompted = _generate(engine, {"max_tokens": 6, "system_prompt": "You are a cat."})
    other = _generate(engine, {"max_tokens": 6, "system_prompt": "Answer in French only."})
    assert len({tuple(plain), tuple(prompted), tuple(other)}) > 1  # the prompt is read
    own = [{"role": "system", "content": "You are a cat."}, *CHAT]
    assert _generate(engine, {"max_tokens": 6}, inputs={"messages": own}) == prompted
    assert _generate(engine, {"max_tokens": 6, "system_prompt": "Answer in French only."},
                     inputs={"messages": own}) == prompted  # the client's one wins


def test_a_bad_system_prompt_fails_only_its_request(engine):
    engine.add(EngineRequest("bad", {"messages": CHAT}, {"system_prompt": 3}))
    outs = [o for _ in range(3) for o in engine.step()]
    assert outs[0].error is not None and "system_prompt must be a string" in outs[0].error


def test_with_system_prompt():
    chat = {"messages": CHAT}
    assert with_system_prompt(chat, {}) is chat
    assert with_system_prompt({"prompt": "hi"}, {"system_prompt": "x"}) == {"prompt": "hi"}
    added = with_system_prompt(chat, {"system_prompt": "x"})["messages"]
    assert added == [{"role": "system", "content": "x"}, *CHAT] and chat["messages"] == CHAT
    own = {"messages": [{"role": "developer", "content": "y"}, *CHAT]}
    assert with_system_prompt(own, {"system_prompt": "x"}) is own


def test_sampling_defaults_read_only_what_the_file_sets(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": None,
        "repetition_penalty": 1.05, "max_new_tokens": 100, "eos_token_id": 2}))
    assert sampling_defaults(tmp_path) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                           "repetition_penalty": 1.05, "max_tokens": 100}
    (tmp_path / "generation_config.json").write_text("[1]")
    with pytest.raises(EngineLoadError, match="not a JSON object"):
        sampling_defaults(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    assert sampling_defaults(tmp_path) == {}


def test_a_bad_generation_config_value_fails_the_load(base_dir, tmp_path):
    model_dir = _with_config(base_dir, tmp_path, {"top_p": 0})
    with pytest.raises(EngineLoadError, match=r"generation_config.json: top_p must be"):
        AREngine(str(model_dir))


def test_defaults_block_is_checked():
    def bad(defaults, match):
        with pytest.raises(ConfigError, match=match):
            parse_pipeline({**PIPELINE, "defaults": defaults})
    bad({"video": {"llm": {}}}, "not an output modality")
    bad({"audio": {"lmm": {}}}, "Did you mean 'llm'")
    bad({"audio": {"llm": [1]}}, "expected a mapping")
    bad([1], "expected a mapping")


def test_the_assistant_preset_speaks_briefly_and_pickles():
    config = load_pipeline_file(preset_path("assistant"))
    spoken = _pipeline_params(config, ["text", "audio"], {})
    assert spoken["max_tokens"] < 512 and "sentences" in spoken["system_prompt"]
    assert spoken["system_prompt"] == _pipeline_params(config, ["text"], {})["system_prompt"]
    assert _pipeline_params(config, ["audio"], {}) == spoken
    assert _pipeline_params(config, ["text"], {}, view="smollm2") == {"max_tokens": 512}
    assert pickle.loads(pickle.dumps(config)).defaults == config.defaults
