"""Wan 2.2 (A14B two experts, TI2V-5B) and LTX-Video in the diffusion engine, loaded by
the real adapters from tiny random release directories, against diffusers' own
pipelines' __call__ for the same seed."""

from __future__ import annotations

import io

import diffusers
import numpy as np
import torch
from PIL import Image
from unit.diffusion_runs import engine, png
from unit.diffusion_runs import run_clean as run


def close_to(ours, reference):
    """Our uint8 frames vs diffusers' float output x 255: within the rounding (0.5) plus
    0.01 of a level for float differences between batched and single calls (~1e-5), and
    the video is not flat. (A token at a wrong timestep is off by more than a level.)"""
    assert ours.shape == reference.shape
    assert ours.float().std() > 2, "the fixture's video does not vary: the test is blind"
    diff = np.abs(ours.numpy().astype(float) - reference * 255).max()
    assert diff <= 0.51


def reference(pipe, inputs, params, image=None, **extra):
    width, height = (int(v) for v in params["size"].split("x"))
    if image is not None:
        extra["image"] = Image.open(io.BytesIO(image)).convert("RGB")
    if "guidance_scale_2" in params:
        extra["guidance_scale_2"] = params["guidance_scale_2"]
    return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                height=height, width=width, num_frames=params["frames"],
                num_inference_steps=params["steps"],
                guidance_scale=params.get("guidance_scale", 5.0), output_type="np",
                generator=torch.Generator().manual_seed(params["seed"]), **extra).frames[0]


def record_calls(pipe, names):
    """(expert, rows) per transformer call."""
    calls = []
    for name in names:
        model = getattr(pipe, name)
        forward = model.forward

        def recorded(*args, _name=name, _forward=forward, **kwargs):
            calls.append((_name, kwargs["hidden_states"].shape[0]))
            return _forward(*args, **kwargs)
        model.forward = recorded
    return calls


def test_wan22_two_experts_batched_across_the_boundary_equal_diffusers(models):
    eng = engine(models, "wan", "wan22_t2v")
    pipe = eng.denoiser.pipe
    assert pipe.transformer_2 is not None and pipe.config.boundary_ratio == 0.875
    calls = record_calls(pipe, ("transformer", "transformer_2"))
    # 4 steps: 999, 900 | 750, 500 (boundary 875); b joins when a is at its low-noise steps
    requests = [
        ("a", {"prompt": "a red fox"}, {"size": "32x32", "steps": 4, "seed": 1,
                                        "frames": 5}),
        ("b", {"prompt": "a dog in the rain", "negative_prompt": "blurry"},
         {"size": "32x32", "steps": 6, "seed": 2, "frames": 5, "guidance_scale_2": 2.0}),
        ("c", {"prompt": "hello"}, {"size": "32x32", "steps": 4, "seed": 3, "frames": 5})]
    results = run(eng, requests)
    experts = {name for name, _ in calls}
    assert experts == {"transformer", "transformer_2"}
    # a job on the high side never shares a call with one on the low side, yet b and c
    # (at their own steps) shared calls: more rows than one request has
    assert max(rows for _, rows in calls) > 2
    assert len(calls) < 4 + 6 + 4
    for rid, inputs, params in requests:
        close_to(results[rid]["video"], reference(pipe, inputs, params))


def test_wan22_image_to_video_without_image_encoder_equals_diffusers(models):
    eng = engine(models, "wan", "wan22_i2v")
    pipe = eng.denoiser.pipe
    assert pipe.image_encoder is None and eng.info()["tasks"] == ["image_to_video"]
    image = png(40, 24)
    params = {"size": "32x32", "steps": 4, "seed": 6, "frames": 5}
    requests = [("v", {"prompt": "a fox", "images": [image]}, params),
                ("w", {"prompt": "a cat", "images": [png(40, 24, seed=1)]}, {**params, "seed": 7})]
    results = run(eng, requests, join_after=1)
    close_to(results["v"]["video"], reference(pipe, {"prompt": "a fox"}, params, image))


def test_wan22_ti2v_text_and_image_requests_share_calls_and_equal_diffusers(models):
    eng = engine(models, "wan", "wan22_ti2v")
    pipe = eng.denoiser.pipe
    assert pipe.config.expand_timesteps and eng.info()["tasks"] == ["text_to_video",
                                                                   "image_to_video"]
    calls = record_calls(pipe, ("transformer",))
    image = png(40, 24)
    params = {"size": "32x32", "steps": 4, "frames": 5}
    requests = [("t", {"prompt": "a fox runs"}, {**params, "seed": 1}),
                ("i", {"prompt": "it moves", "images": [image]}, {**params, "seed": 2})]
    results = run(eng, requests, join_after=1)
    assert max(rows for _, rows in calls) == 4  # both guided requests in one call
    close_to(results["t"]["video"], reference(pipe, *requests[0][1:]))
    i2v = diffusers.WanImageToVideoPipeline.from_pretrained(models("wan22_ti2v"))
    i2v.set_progress_bar_config(disable=True)
    ref = reference(i2v, {"prompt": "it moves"}, {**params, "seed": 2}, image)
    close_to(results["i"]["video"], ref)


def ltx_reference(pipe, inputs, params, image=None, **decode):
    width, height = (int(v) for v in params["size"].split("x"))
    extra = {"image": Image.open(io.BytesIO(image)).convert("RGB")} if image else {}
    return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                height=height, width=width, num_frames=params["frames"], frame_rate=25,
                num_inference_steps=params["steps"],
                guidance_scale=params.get("guidance_scale", 3.0), output_type="np",
                generator=torch.Generator().manual_seed(params["seed"]), **decode,
                **extra).frames[0]


def test_ltx_video_text_and_image_requests_batched_equal_diffusers(models):
    decode = {"decode_timestep": 0.05, "decode_noise_scale": 0.025}
    eng = engine(models, "ltx_video", "ltx_video", **decode)
    pipe = eng.denoiser.pipe
    assert type(pipe).__name__ == "LTXPipeline" and pipe.vae.config.timestep_conditioning
    assert eng.info()["tasks"] == ["text_to_video", "image_to_video"]
    calls = record_calls(pipe, ("transformer",))
    image = png(64, 64)
    params = {"size": "64x64", "steps": 4, "frames": 9}
    requests = [
        ("t", {"prompt": "a fox runs", "negative_prompt": "blurry"}, {**params, "seed": 1}),
        ("i", {"prompt": "it moves", "images": [image]}, {**params, "seed": 2}),
        ("u", {"prompt": "hello"}, {**params, "seed": 3, "guidance_scale": 1.0, "steps": 3})]
    results = run(eng, requests, join_after=1)
    assert max(rows for _, rows in calls) == 5  # t, i guided + u, at different steps
    close_to(results["t"]["video"], ltx_reference(pipe, *requests[0][1:], **decode))
    close_to(results["u"]["video"], ltx_reference(pipe, *requests[2][1:], **decode))
    i2v = diffusers.LTXImageToVideoPipeline.from_pretrained(models("ltx_video"))
    i2v.set_progress_bar_config(disable=True)
    ref = ltx_reference(i2v, {"prompt": "it moves"}, {**params, "seed": 2}, image, **decode)
    close_to(results["i"]["video"], ref)
