"""Tiny random diffusers pipelines (omni/fixtures/tiny_diffusion.py): the release layout,
reload through diffusers' from_pretrained, Qwen-Image's template prefix, a 2-step run."""

from __future__ import annotations

import json

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from omni.fixtures import FIXTURE_MARKER, TINY_MODELS, ensure_tiny_model
from omni.fixtures import tiny_diffusion as td

torch.set_num_threads(1)

PIPELINES = {
    "qwen_image": ("QwenImagePipeline", ("scheduler", "text_encoder", "tokenizer",
                                         "transformer", "vae")),
    "qwen_image_edit": ("QwenImageEditPipeline", ("processor", "scheduler", "text_encoder",
                                                  "tokenizer", "transformer", "vae")),
    "wan_t2v": ("WanPipeline", ("scheduler", "text_encoder", "tokenizer", "transformer",
                                "vae")),
    "wan_i2v": ("WanImageToVideoPipeline", ("image_encoder", "image_processor", "scheduler",
                                            "text_encoder", "tokenizer", "transformer",
                                            "vae")),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    # session-wide cache dir: test_diffusion_engine.py reuses the same builds
    cache = tmp_path_factory.getbasetemp() / "models"
    return lambda name: ensure_tiny_model(name, cache_dir=cache)


def load(d):
    kw = {}
    if (d / "processor").is_dir():  # Qwen2VLProcessor needs torchvision in transformers 5
        kw["processor"] = td.load_qwen_vl_processor(d / "processor")
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(d), **kw)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name", list(PIPELINES))
def test_release_layout(models, name):
    assert name in TINY_MODELS
    d = models(name)
    cls, components = PIPELINES[name]
    index = json.loads((d / "model_index.json").read_text())
    assert index["_class_name"] == cls
    for comp in components:
        assert index[comp][0] in ("diffusers", "transformers") and (d / comp).is_dir(), comp
    marker = json.loads((d / FIXTURE_MARKER).read_text())
    assert marker["random_weights"] is True and marker["builder"] == name
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 4_000_000
    if name.startswith("qwen"):
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            assert (d / "tokenizer" / f).is_file(), f
        sched = json.loads((d / "scheduler" / "scheduler_config.json").read_text())
        assert sched["_class_name"] == "FlowMatchEulerDiscreteScheduler"
        assert {k: sched[k] for k in td.QWEN_IMAGE_SCHEDULER} == td.QWEN_IMAGE_SCHEDULER
    else:
        sched = json.loads((d / "scheduler" / "scheduler_config.json").read_text())
        assert sched["_class_name"] == "UniPCMultistepScheduler"
        assert sched["use_flow_sigmas"] and sched["prediction_type"] == "flow_prediction"
    if name == "qwen_image_edit":
        assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
        for f in ("preprocessor_config.json", "video_preprocessor_config.json",
                  "tokenizer.json", "chat_template.jinja"):
            assert (d / "processor" / f).is_file(), f
    if name == "wan_i2v":
        assert index["image_encoder"] == ["transformers", "CLIPVisionModel"]
        assert index["image_processor"] == ["transformers", "CLIPImageProcessor"]


@pytest.mark.parametrize("name", ["qwen_image", "qwen_image_edit"])
def test_qwen_template_prefix_and_special_ids(models, name):
    pipe = load(models(name))
    tok = pipe.tokenizer
    start = pipe.prompt_template_encode_start_idx
    assert start == {"qwen_image": 34, "qwen_image_edit": 64}[name]
    assert td.template_prefix_len(tok, pipe.prompt_template_encode) == start
    cfg = pipe.text_encoder.config
    ids = dict(zip(td.QWEN_VL_SPECIAL_TOKENS, tok.convert_tokens_to_ids(
        list(td.QWEN_VL_SPECIAL_TOKENS)), strict=True))
    assert cfg.image_token_id == ids["<|image_pad|>"]
    assert cfg.vision_start_token_id == ids["<|vision_start|>"]
    assert cfg.text_config.eos_token_id == ids["<|im_end|>"] < cfg.text_config.vocab_size
    if name == "qwen_image":  # only the prompt's own turn is left after the drop
        pe, _ = pipe.encode_prompt("a red cup on the table", device="cpu")
        tail = tok("a red cup on the table<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
        assert pe.shape == (1, len(tail), cfg.text_config.hidden_size)


@pytest.mark.parametrize("name", list(PIPELINES))
def test_two_step_call(models, name):
    pipe = load(models(name))
    kw = dict(num_inference_steps=2, generator=torch.Generator().manual_seed(0),
              output_type="np", height=32, width=32)
    if name.startswith("qwen"):
        if name == "qwen_image_edit":  # the pipeline works on it at ~1024x1024 regardless
            kw["image"] = Image.new("RGB", (48, 32), (200, 40, 40))
        out = np.asarray(pipe(prompt="a red cup on the table", **kw).images)
        assert out.shape == (1, 32, 32, 3)
    else:
        if name == "wan_i2v":
            kw["image"] = Image.new("RGB", (32, 32), (40, 200, 40))
        out = np.asarray(pipe(prompt="a fox runs in the snow", num_frames=5, **kw).frames)
        assert out.shape == (1, 5, 32, 32, 3)
    assert np.isfinite(out).all() and out.dtype == np.float32


@pytest.mark.parametrize("name", list(PIPELINES))
def test_same_seed_same_files(models, name, tmp_path):
    builder = getattr(td, f"build_tiny_{name}")
    first, again = models(name), builder(tmp_path / "again", seed=0)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (first / f).read_bytes() == (again / f).read_bytes(), f
    other = builder(tmp_path / "other", seed=1)
    weights = first / "transformer" / "diffusion_pytorch_model.safetensors"
    assert weights.read_bytes() != (other / weights.relative_to(first)).read_bytes()
