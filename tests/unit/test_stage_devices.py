"""Where stages run by default: a model stage on `auto` (a GPU when one is visible), an
echo stage on the CPU; and no built-in pipeline leaves a model stage on the CPU when
`auto` resolves to a GPU (here torch is made to see one; tests/gpu/test_preset_devices_cuda.py
checks the same with the real torch)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from omni.config.devices import default_devices
from omni.config.pipeline import ConfigError, parse_pipeline
from omni.config.presets import (
    DEFAULT_PIPELINES,
    PRESET_BY_MODEL_TYPE,
    PRESET_BY_PIPELINE_CLASS,
    PRESET_DIR,
    load_pipeline,
)
from omni.config.stages import StageConfig
from omni.engines.base import resolve_device
from omni.engines.kinds import ENGINE_KINDS, KINDS

PRESET_NAMES = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
CPU_ENGINES = {name for name, kind in KINDS.items() if kind.default_device == "cpu"}


def builtin_pipelines(tmp_path: Path) -> list[tuple[str, object]]:
    """Every built-in pipeline as the server builds it: each preset by name (what
    --pipeline NAME and the default's DEFAULT_PIPELINES load) and each preset picked for
    a model directory (--model DIR, and the default's tiny text models)."""
    pipelines = [(name, load_pipeline(name)) for name in PRESET_NAMES]
    for file, key, presets in (("config.json", "model_type", PRESET_BY_MODEL_TYPE),
                               ("model_index.json", "_class_name", PRESET_BY_PIPELINE_CLASS)):
        for value in presets:
            model_dir = tmp_path / value
            model_dir.mkdir()
            (model_dir / file).write_text(json.dumps({key: value}))
            pipelines.append((f"{key}={value}", load_pipeline(model_dir)))
    return pipelines


def model_stages_on_cpu(pipelines: list[tuple[str, object]]) -> list[str]:
    """'pipeline/stage[i]: device -> resolved' for every model stage placed on the CPU."""
    return [f"{label}/{stage.name}[{i}]: {device} -> {resolve_device(device)}"
            for label, pipeline in pipelines for stage in pipeline.stages
            if stage.engine not in CPU_ENGINES
            for i, device in enumerate(stage.devices)
            if not resolve_device(device).startswith("cuda")]


@pytest.fixture
def gpu_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_no_builtin_pipeline_leaves_a_model_stage_on_the_cpu(tmp_path, gpu_visible,
                                                             preset_envs):
    pipelines = builtin_pipelines(tmp_path)
    model_stages = [s for _, p in pipelines for s in p.stages if s.engine not in CPU_ENGINES]
    # every preset file, the model-directory presets and the default's pipelines are here
    assert {"qwen_image", "wan", "piper", "piper_split", "qwen3", "qwen3_omni"} <= {
        label for label, _ in pipelines}
    assert set(DEFAULT_PIPELINES) <= set(PRESET_NAMES)
    assert len(model_stages) >= 10
    assert model_stages_on_cpu(pipelines) == []


def test_the_check_fails_for_a_model_stage_left_on_the_cpu(tmp_path, gpu_visible):
    pinned = parse_pipeline({"stages": [{"name": "tts", "engine": "generation", "model": "piper",
                                         "devices": ["cpu"], "final_output": "audio"}]})
    assert model_stages_on_cpu([("pinned", pinned)]) == ["pinned/tts[0]: cpu -> cpu"]


def test_echo_presets_stay_on_the_cpu(gpu_visible):
    for name in ("echo", "echo_chain"):
        assert {s.devices for s in load_pipeline(name).stages} == {("cpu",)}


def test_auto_is_the_cpu_when_no_gpu_is_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("engine", ENGINE_KINDS)
def test_default_devices_by_engine_kind(engine):
    expected = ("cpu",) if engine == "echo" else ("auto",)
    parsed = parse_pipeline({"stages": [{"name": "s", "engine": engine, "final_output": "x"}]})
    empty = parse_pipeline({"stages": [{"name": "s", "engine": engine, "devices": None,
                                        "final_output": "x"}]})  # `devices:` with no value
    built = StageConfig(name="s", engine=engine)
    assert parsed.stage("s").devices == empty.stage("s").devices == expected
    assert built.devices == default_devices(engine) == expected
    assert pickle.loads(pickle.dumps(built)) == built


def test_replicas_of_an_auto_stage_all_get_auto():
    cfg = parse_pipeline({"stages": [{"name": "s", "engine": "ar", "model_dir": "/m",
                                      "replicas": 3, "final_output": "text"}]})
    stage = cfg.stage("s")
    assert [stage.devices[i % len(stage.devices)] for i in range(3)] == ["auto"] * 3


def test_memory_shares_of_default_device_stages_count_on_the_first_gpu():
    def stage(name: str, engine: str, share: str) -> dict:
        return {"name": name, "engine": engine, "memory": share, "final_output": name}

    # model stages default to auto = cuda:0: their shares add up there
    parse_pipeline({"stages": [stage("a", "ar", "60%"), stage("b", "generation", "40%")]})
    with pytest.raises(ConfigError, match=r"cuda:0.*110%.*a, b"):
        parse_pipeline({"stages": [stage("a", "ar", "60%"), stage("b", "diffusion", "50%")]})
    # an echo stage defaults to the CPU, where a share is ignored
    parse_pipeline({"stages": [stage("a", "ar", "60%"), stage("b", "echo", "50%")]})
