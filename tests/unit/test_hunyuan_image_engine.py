"""HunyuanImage 2.1 in the diffusion engine: tiny random pipelines in the release layout
(base with its APG guiders, and distilled), loaded by the real adapter, batched across
requests at different steps, against diffusers' own ``__call__`` for the same seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from unit import diffusion_runs
from unit.diffusion_runs import run

from omni.engines.base import EngineRequest
from omni.fixtures import FIXTURE_MARKER
from omni.fixtures.tiny_hunyuan import HUNYUAN_IMAGE_SCHEDULER


def engine(models, name, **options):
    return diffusion_runs.engine(models, "hunyuan_image", name, **options)


def reference(pipe, inputs, params):
    """diffusers' own pipeline call for one request (a request's guidance_scale is set
    the way diffusers documents: a new guider from the release's config)."""
    width, height = (int(v) for v in params["size"].split("x"))
    saved = pipe.guider, pipe.ocr_guider
    extra = {}
    if "guidance_scale" in params:
        if pipe.guider is None:
            extra["distilled_guidance_scale"] = params["guidance_scale"]
        else:
            pipe.guider = pipe.guider.new(guidance_scale=params["guidance_scale"])
            pipe.ocr_guider = pipe.ocr_guider.new(guidance_scale=params["guidance_scale"])
    try:
        return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                    height=height, width=width, num_inference_steps=params["steps"],
                    num_images_per_prompt=params.get("n", 1), output_type="np",
                    generator=torch.Generator().manual_seed(params["seed"]),
                    **extra).images
    finally:
        pipe.guider, pipe.ocr_guider = saved


def close_to(ours, ref):
    """uint8 pixels vs diffusers' float output: at most one level apart (the rounding of
    ~1e-6 differences between batched and single calls), after checking the picture is
    not flat (a fixture that paints one colour would pass anything)."""
    assert ours.shape == ref.shape
    assert len(np.unique(ours.numpy())) > 20
    assert np.abs(ours.numpy().astype(float) - (ref * 255).round()).max() <= 1


@pytest.mark.parametrize("name", ["hunyuan_image", "hunyuan_image_distilled"])
def test_release_layout(models, name):
    from omni.config.presets import PRESET_BY_PIPELINE_CLASS

    d = models(name)
    index = json.loads(open(f"{d}/model_index.json").read())
    assert index["_class_name"] == "HunyuanImagePipeline"
    assert PRESET_BY_PIPELINE_CLASS["HunyuanImagePipeline"] == "hunyuan_image.yaml"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert index["text_encoder_2"] == ["transformers", "T5EncoderModel"]
    assert index["tokenizer_2"] == ["transformers", "ByT5Tokenizer"]
    guided = name == "hunyuan_image"
    assert (index["guider"] == ["diffusers", "AdaptiveProjectedMixGuidance"]) == guided
    assert json.loads(open(f"{d}/{FIXTURE_MARKER}").read())["random_weights"] is True
    sched = json.loads(open(f"{d}/scheduler/scheduler_config.json").read())
    assert {k: sched[k] for k in HUNYUAN_IMAGE_SCHEDULER} == HUNYUAN_IMAGE_SCHEDULER


def test_guided_requests_at_different_steps_equal_diffusers(models):
    """CFG, then APG with per-request momentum (the fixture's guiders start it at step 2,
    the OCR one at 3), the OCR guider for quoted text, a request's own guidance_scale;
    a and b share the guider's config and calls at different steps."""
    eng = engine(models, "hunyuan_image")
    requests = [
        ("a", {"prompt": "a red fox in the snow"}, {"size": "32x32", "steps": 5, "seed": 1}),
        ("b", {"prompt": "the quick brown dog", "negative_prompt": "blurry"},
         {"size": "32x32", "steps": 4, "seed": 2, "n": 2}),
        ("c", {"prompt": 'a sign that says "hello"'},
         {"size": "32x32", "steps": 5, "seed": 3, "guidance_scale": 6.0}),
        ("wide", {"prompt": "hello"}, {"size": "64x32", "steps": 2, "seed": 4})]
    results, errors = run(eng, requests)
    assert not errors
    stats = eng.stats()  # a, b (2 images), c: 4 images x 2 guided rows in one call
    assert stats["max_rows"] == 8 and stats["transformer_calls"] < 5 + 4 + 5 + 2
    for rid, inputs, params in requests:
        close_to(results[rid]["images"], reference(eng.denoiser.pipe, inputs, params))
    assert not torch.equal(results["b"]["images"][0], results["b"]["images"][1])
    assert not torch.equal(results["a"]["images"], results["c"]["images"])


def test_distilled_meanflow_equals_diffusers(models):
    eng = engine(models, "hunyuan_image_distilled")
    assert eng.info()["default_steps"] == 8
    requests = [("d1", {"prompt": "a cat"}, {"size": "32x32", "steps": 4, "seed": 5}),
                ("d2", {"prompt": "a dog"},
                 {"size": "32x32", "steps": 3, "seed": 6, "guidance_scale": 5.0})]
    results, errors = run(eng, requests, join_after=1)
    assert not errors and eng.stats()["max_rows"] == 2  # no negative rows
    for rid, inputs, params in requests:
        close_to(results[rid]["images"], reference(eng.denoiser.pipe, inputs, params))


def test_previews_sharpen_towards_the_image(models):
    """previews: the flow-matching estimate x0 = x_t - sigma * v, decoded; the last one
    is closer to the final image than the first."""
    eng = engine(models, "hunyuan_image_distilled")
    eng.add(EngineRequest("p", {"prompt": "a cat"},
                          {"size": "32x32", "steps": 8, "seed": 5, "previews": 3}))
    previews, final = [], None
    while eng.has_work():
        for out in eng.step():
            if out.data and "preview" in out.data:
                previews.append(out.data["preview"].float())
            if out.finished:
                final = out.data["images"].float()
    assert len(previews) == 3 and previews[0].shape == final.shape
    assert (previews[-1] - final).abs().mean() < (previews[0] - final).abs().mean()


def test_bad_requests_fail_alone_with_the_field_named(models):
    eng = engine(models, "hunyuan_image", max_steps=10)
    bad = [("img", {"prompt": "x", "images": [b"\x89PNG"]}, {}, "input image"),
           ("size", {"prompt": "x"}, {"size": "40x40"}, "multiples of 16"),
           ("steps", {"prompt": "x"}, {"steps": 11}, "'steps'"),
           ("guidance", {"prompt": "x"}, {"guidance_scale": "high"}, "'guidance_scale'"),
           ("prompt", {"prompt": ""}, {}, "'prompt'")]
    for rid, inputs, params, _ in bad:
        eng.add(EngineRequest(rid, inputs, params))
    errors = {o.request_id: o.error for o in eng.step()}
    for rid, _, _, words in bad:
        assert words in errors[rid]
