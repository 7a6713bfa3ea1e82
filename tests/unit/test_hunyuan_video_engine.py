"""HunyuanVideo 1.5 (T2V, I2V) in the diffusion engine: tiny random pipelines in the
release layout, loaded by the real adapter, batched across requests at different steps,
against diffusers' own ``__call__`` for the same seed."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from unit import diffusion_runs
from unit.diffusion_runs import png

from omni.engines.base import EngineRequest


def engine(models, name, **options):
    return diffusion_runs.engine(models, "hunyuan_video", name, **options)


def reference(pipe, inputs, params, image=None):
    """diffusers' own call; a request's guidance_scale as diffusers documents it (a new
    guider from the release's config)."""
    extra = {}
    if image is not None:
        extra["image"] = Image.open(io.BytesIO(image)).convert("RGB")
    else:
        width, height = (int(v) for v in params["size"].split("x"))
        extra.update(height=height, width=width)
    saved = pipe.guider
    if "guidance_scale" in params:
        pipe.guider = pipe.guider.new(guidance_scale=params["guidance_scale"])
    try:
        return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                    num_frames=params["frames"], num_inference_steps=params["steps"],
                    output_type="np", generator=torch.Generator().manual_seed(params["seed"]),
                    **extra).frames[0]
    finally:
        pipe.guider = saved


def close_to(ours, ref):
    """uint8 frames vs diffusers' float output: at most one level apart (rounding of
    ~1e-6 differences between batched and single calls), after checking the video
    varies (a fixture that paints one colour would pass anything)."""
    assert ours.shape == ref.shape
    assert len(np.unique(ours.numpy())) > 20
    assert not torch.equal(ours[0], ours[-1])  # frames differ
    assert np.abs(ours.numpy().astype(float) - (ref * 255).round()).max() <= 1


@pytest.mark.parametrize("name, cls", [("hunyuan_video_t2v", "HunyuanVideo15Pipeline"),
                                       ("hunyuan_video_i2v",
                                        "HunyuanVideo15ImageToVideoPipeline")])
def test_release_layout(models, name, cls):
    from omni.config.presets import PRESET_BY_PIPELINE_CLASS

    index = json.loads(open(f"{models(name)}/model_index.json").read())
    assert index["_class_name"] == cls and PRESET_BY_PIPELINE_CLASS[cls] == "hunyuan_video.yaml"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLTextModel"]
    assert index["tokenizer_2"] == ["transformers", "ByT5Tokenizer"]
    assert index["guider"] == ["diffusers", "ClassifierFreeGuidance"]
    if cls.endswith("ImageToVideoPipeline"):
        assert index["image_encoder"] == ["transformers", "SiglipVisionModel"]


def test_t2v_requests_at_different_steps_equal_diffusers(models):
    eng = engine(models, "hunyuan_video_t2v")
    assert eng.info()["default_size"] == "80x48"  # the 16:9 bucket of the tiny target_size
    requests = [
        ("a", {"prompt": "a red fox runs"}, {"size": "48x32", "frames": 5, "steps": 4,
                                            "seed": 1}),
        ("b", {"prompt": 'a sign that says "hi"', "negative_prompt": "blurry"},
         {"size": "48x32", "frames": 5, "steps": 3, "seed": 2, "guidance_scale": 3.0}),
        ("c", {"prompt": "waves"}, {"size": "48x32", "frames": 5, "steps": 3, "seed": 3,
                                    "guidance_scale": 1.0})]  # unguided: one row
    results = diffusion_runs.run_clean(eng, requests, join_after=1)
    assert eng.stats()["max_rows"] == 5  # a and b guided (2 rows each), c one row
    for rid, inputs, params in requests:
        close_to(results[rid]["video"], reference(eng.denoiser.pipe, inputs, params))
        assert results[rid]["fps"] == 24


def test_i2v_equals_diffusers_and_takes_the_images_bucket(models):
    eng = engine(models, "hunyuan_video_i2v")
    image = png(64, 40)  # 16:10 -> the 64x48 bucket, centre-cropped
    requests = [("i1", {"prompt": "it moves", "images": [image]},
                 {"frames": 5, "steps": 3, "seed": 4}),
                ("i2", {"prompt": "it spins", "images": [png(64, 40, seed=1)]},
                 {"size": "64x48", "frames": 5, "steps": 3, "seed": 5})]
    results = diffusion_runs.run_clean(eng, requests, join_after=1)
    assert eng.stats()["max_rows"] == 4
    for (rid, inputs, params), seed in zip(requests, (0, 1), strict=True):
        assert results[rid]["video"].shape == (5, 48, 64, 3)
        close_to(results[rid]["video"], reference(eng.denoiser.pipe, inputs, params,
                                                  image=png(64, 40, seed)))


def test_bad_requests_fail_alone_with_the_field_named(models):
    t2v, i2v = engine(models, "hunyuan_video_t2v"), engine(models, "hunyuan_video_i2v")
    bad = [(t2v, {"prompt": "x"}, {"frames": 6}, "'frames' must be 4k+1"),
           (t2v, {"prompt": "x", "images": [png(32, 32)]}, {}, "input_reference"),
           (t2v, {"prompt": "x"}, {"size": "40x40"}, "multiples of 16"),
           (i2v, {"prompt": "x"}, {}, "input_reference"),
           (i2v, {"prompt": "x", "images": [png(64, 40)]}, {"size": "48x48"}, "64x48")]
    for i, (eng, inputs, params, words) in enumerate(bad):
        eng.add(EngineRequest(f"r{i}", inputs, params))
        errors = {o.request_id: o.error for o in eng.step()}
        assert words in errors[f"r{i}"], errors
