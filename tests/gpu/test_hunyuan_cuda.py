"""HunyuanImage 2.1 and HunyuanVideo 1.5 T2V on CUDA (bf16): requests batched at different
steps, each output nearer diffusers' own call for it than the other request's."""

from __future__ import annotations

import numpy as np
import torch

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import DiffusionEngine
from omni.models import build_denoiser


def served(family, model_dir, requests):
    engine = DiffusionEngine(build_denoiser(family, model_dir=model_dir, device="cuda",
                                            dtype="auto", options={}), {})
    engine.add(EngineRequest(*requests[0]))
    engine.step()
    for request in requests[1:]:
        engine.add(EngineRequest(*request))
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            if out.finished:
                results[out.request_id] = out.data
    return engine.denoiser.pipe, results


def assert_nearest_own(ours, refs):
    """bf16: batched and single calls differ in rounding, not in content (swapped
    requests fail)."""
    for rid, ref in refs.items():
        mine = ours[rid].numpy().astype(float)
        own = np.abs(mine - ref).mean()
        other = min(np.abs(mine - r).mean() for k, r in refs.items() if k != rid)
        assert own < 4.0 and own < other, (rid, own, other)


def test_hunyuan_image_bf16_matches_diffusers(models):
    requests = [("a", {"prompt": "a red fox"}, {"size": "64x64", "steps": 6, "seed": 1}),
                ("b", {"prompt": 'a sign that says "open"'},
                 {"size": "64x64", "steps": 5, "seed": 2})]
    pipe, results = served("hunyuan_image", models("hunyuan_image"), requests)
    assert pipe.transformer.dtype == torch.bfloat16
    refs = {rid: pipe(prompt=inputs["prompt"], height=64, width=64,
                      num_inference_steps=params["steps"], output_type="np",
                      generator=torch.Generator().manual_seed(params["seed"])).images * 255
            for rid, inputs, params in requests}
    assert_nearest_own({rid: r["images"] for rid, r in results.items()}, refs)


def test_hunyuan_video_t2v_bf16_matches_diffusers(models):
    requests = [("a", {"prompt": "a red fox runs"},
                 {"size": "64x48", "frames": 9, "steps": 5, "seed": 1}),
                ("b", {"prompt": "waves on a beach"},
                 {"size": "64x48", "frames": 9, "steps": 4, "seed": 2})]
    pipe, results = served("hunyuan_video", models("hunyuan_video_t2v"), requests)
    refs = {rid: pipe(prompt=inputs["prompt"], height=48, width=64, num_frames=9,
                      num_inference_steps=params["steps"], output_type="np",
                      generator=torch.Generator().manual_seed(params["seed"])).frames[0] * 255
            for rid, inputs, params in requests}
    assert_nearest_own({rid: r["video"] for rid, r in results.items()}, refs)
