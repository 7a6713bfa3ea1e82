"""Image and audio prompts in bfloat16, the dtype releases serve in (tiny release-layout
fixtures, real loaders, on the CPU): the vision and audio towers' features meet a bf16
language model, where a tensor left in float32 fails or silently upcasts. The equality
tests (test_ar_vl.py, test_ar_thinker.py, test_omni25_thinker.py, test_whisper_hf.py) run
float32, as does tests/gpu/test_vl_whisper_cuda.py. Each also with fp8 decoder layers."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_runner

torch.set_num_threads(1)


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (56, 84, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


IMAGE = {"type": "image", "image": {"data": _png(1)}}
AUDIO = {"type": "input_audio", "input_audio": {"pcm_f32le": _clip(1.3, 440.0).tobytes(),
                                                "sample_rate": 16000}}
CASES = [("qwen2_5_vl", [IMAGE]), ("qwen3_vl", [IMAGE]), ("qwen3_omni", [IMAGE, AUDIO]),
         ("qwen2_5_omni", [IMAGE, AUDIO])]


@pytest.mark.parametrize("quantization", ["none", "fp8"])
@pytest.mark.parametrize("fixture,parts", CASES, ids=[c[0] for c in CASES])
def test_media_prompts_answer_in_bfloat16(tmp_path_factory, fixture, parts, quantization):
    model_dir = ensure_tiny_model(fixture, tmp_path_factory.getbasetemp() / "models")
    engine = AREngine(str(model_dir), dtype="bfloat16",
                      options={"quantization": quantization})
    assert engine.info()["dtype"] == "bfloat16"
    # fp8: the decoder layers' weights converted, the towers kept (pipeline.md)
    assert (engine.info().get("quantized_weights", 0) > 0) == (quantization == "fp8")
    content = [*parts, {"type": "text", "text": "What is this?"}]
    for rid in ("a", "b"):  # two prompts: one encoder batch, one prefill
        engine.add(EngineRequest(rid, {"messages": [{"role": "user", "content": content}]},
                                 {"temperature": 0, "max_tokens": 6, "ignore_eos": True}))
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            tokens[out.request_id] += list((out.data or {}).get("token_ids") or ())
    assert len(tokens["a"]) == 6 and tokens["a"] == tokens["b"]  # same prompt, greedy


def test_whisper_hf_transcribes_in_bfloat16(tmp_path_factory):
    model_dir = ensure_tiny_model("whisper_hf", tmp_path_factory.getbasetemp() / "models")
    runner = build_runner("whisper_hf", model_dir=str(model_dir), device="cpu",
                          dtype="bfloat16", options={"max_new_tokens": 8})
    engine = GenerationEngine(runner)
    for rid, hz in (("a", 440.0), ("b", 220.0)):
        pcm = (_clip(1.5, hz) * 32767).astype("<i2")
        engine.add(EngineRequest(rid, {"audio": {"pcm_s16le": pcm.tobytes(),
                                                 "sample_rate": 16000}}, {}))
    texts = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            if out.data:
                texts[out.request_id] = out.data["text"]
    assert set(texts) == {"a", "b"} and engine.stats()["max_batch"] == 2
