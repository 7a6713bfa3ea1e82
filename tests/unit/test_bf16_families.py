"""Every diffusion family served in bfloat16, the dtype its releases ship and serve in
(tiny fixtures, real adapters, on the CPU): two requests, the second joining the first
mid-denoise, so calls carry guidance rows of both; and with fp8 blocks (quantization:
fp8). The equality tests run float32, where
a tensor built in float32 beside bf16 weights goes unnoticed; LTX-2's STG mask was such a
tensor and failed every such call on the GPU (tests/unit/test_ltx2.py has its own)."""

from __future__ import annotations

import pytest
import torch
from unit.diffusion_runs import png, run_clean

from omni.engines.diffusion.engine import DiffusionEngine
from omni.models import build_denoiser

torch.set_num_threads(1)

IMAGE = {"size": "32x32", "steps": 3}
VIDEO = {"size": "32x32", "steps": 3, "frames": 5}
CASES = [  # (adapter, tiny fixture, inputs, params)
    ("qwen_image", "qwen_image", {"prompt": "a red fox", "negative_prompt": "blur"},
     {**IMAGE, "guidance_scale": 4.0}),
    ("qwen_image", "qwen_image_edit", {"prompt": "make it blue", "images": [png(32, 32)]},
     {**IMAGE, "guidance_scale": 4.0}),
    ("flux", "flux1", {"prompt": "a red fox"}, IMAGE),
    ("flux", "flux1_kontext", {"prompt": "make it blue", "images": [png(32, 32)]}, IMAGE),
    ("flux2", "flux2", {"prompt": "a red fox"}, IMAGE),
    ("hunyuan_image", "hunyuan_image", {"prompt": "a red fox"}, IMAGE),
    ("wan", "wan22_t2v", {"prompt": "a red fox runs"}, VIDEO),
    ("wan", "wan22_i2v", {"prompt": "a red fox runs", "images": [png(32, 32)]}, VIDEO),
    ("wan", "wan22_ti2v", {"prompt": "a red fox runs"}, VIDEO),
    ("ltx_video", "ltx_video", {"prompt": "a red fox runs"}, {**VIDEO, "frames": 9}),
    ("hunyuan_video", "hunyuan_video_t2v", {"prompt": "a red fox runs"},
     {"size": "48x32", "steps": 3, "frames": 5}),
    ("hunyuan_video", "hunyuan_video_i2v", {"prompt": "a fox", "images": [png(64, 48)]},
     {"size": "64x48", "steps": 3, "frames": 5}),
]


@pytest.mark.parametrize("family,fixture,inputs,params", CASES,
                         ids=[c[1] for c in CASES])
def test_a_family_serves_in_bfloat16(models, family, fixture, inputs, params):
    denoiser = build_denoiser(family, model_dir=models(fixture), device="cpu",
                              dtype="bfloat16", options={})
    results = run_clean(DiffusionEngine(denoiser, {}), [
        ("a", inputs, {**params, "seed": 1}), ("b", inputs, {**params, "seed": 2})],
        join_after=1)
    for out in results.values():
        pixels = out["images"][0] if "images" in out else out["video"]
        assert torch.as_tensor(pixels).float().std() > 1, f"{fixture}: flat output"


FP8_CASES = [*CASES, ("ltx2", "ltx2", {"prompt": "a red fox barks"},
                      {"size": "64x64", "steps": 2, "frames": 9})]


@pytest.mark.parametrize("family,fixture,inputs,params", FP8_CASES,
                         ids=[c[1] for c in FP8_CASES])
def test_a_family_serves_with_fp8_blocks(models, family, fixture, inputs, params):
    """quantization: fp8 on every family (pipeline.md says every diffusion family takes
    it): each one's blocks really hold fp8 weights and still serve, in bf16."""
    options = {"quantization": "fp8"}
    if family == "ltx2":
        options["stg_blocks"] = [1]  # the tiny transformer's 2 blocks (the release: 28)
    denoiser = build_denoiser(family, model_dir=models(fixture), device="cpu",
                              dtype="bfloat16", options={k: v for k, v in options.items()
                                                         if k != "quantization"})
    engine = DiffusionEngine(denoiser, options)
    # the tiny Wan's widths are 24, none a multiple of 16 (what the fp8 kernel takes):
    # nothing converts there (a warning says so) and it must still serve
    converted = engine.info()["quantized_weights"]
    assert (converted == 0) if fixture.startswith("wan") else (converted > 0), fixture
    results = run_clean(engine, [("a", inputs, {**params, "seed": 1}),
                                 ("b", inputs, {**params, "seed": 2})], join_after=1)
    for out in results.values():
        pixels = out["images"][0] if "images" in out else out["video"]
        assert torch.as_tensor(pixels).float().std() > 1, f"{fixture}: flat output"
