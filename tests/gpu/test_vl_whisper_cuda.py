"""Image chat (Qwen2.5-VL, Qwen3-VL) and Hugging Face-layout Whisper on CUDA: the tiny
random release-layout fixtures served on the GPU (float32, the AR engine's CUDA graphs on)
give the tokens / transcripts that transformers gives on the CPU for the same inputs; the
batching the CPU tests check (one vision-tower call, one generate() per group) holds too."""

from __future__ import annotations

import pytest
import torch
from unit.test_ar_vl import IMAGES, image_request, run
from unit.test_whisper_hf import CLIPS, transcribe
from unit.test_whisper_hf import reference as whisper_reference
from unit.vl_reference import GREEDY, reference

from omni.engines.ar.engine import AREngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_runner


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_image_chat_on_cuda_matches_transformers(family, tmp_path_factory):
    model_dir = str(ensure_tiny_model(family, tmp_path_factory.getbasetemp() / "models"))
    engine = AREngine(model_dir, device="cuda", dtype="float32")
    held = engine.stats()["kv_blocks_used"]  # the CUDA graphs' scratch block, for good
    got, errors = run(engine, [image_request(rid, files) for rid, files in IMAGES.items()])
    assert not errors and len(set(got["one"])) >= 4 and got["one"] != got["other"]
    assert engine._encoder.batches == [3]
    for rid, files in IMAGES.items():
        assert got[rid] == reference(model_dir, files, GREEDY["max_tokens"]), rid
    assert engine.stats()["kv_blocks_used"] == held  # on the H200: 1 before and after
    del engine
    torch.cuda.empty_cache()


def test_whisper_hf_on_cuda_matches_transformers(tmp_path_factory):
    model_dir = str(ensure_tiny_model("whisper_hf", tmp_path_factory.getbasetemp() / "models"))
    runner = build_runner("whisper", model_dir=model_dir, device="cuda", dtype="float32",
                          options={"max_new_tokens": 10})
    got, errors, stats = transcribe(runner, {rid: (clip, {}) for rid, clip in CLIPS.items()})
    assert not errors and stats["max_batch"] == 3
    texts = {rid: r["text"] for rid, r in got.items()}
    assert len(set(texts.values())) == 3
    for rid, clip in CLIPS.items():
        heard = (clip * 32767).astype("<i2") / 32768.0
        assert texts[rid] == whisper_reference(model_dir, heard).strip(), rid
