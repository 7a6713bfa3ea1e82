"""LTX-2 (video + audio) in the diffusion engine, loaded by the real adapter from a tiny
random release directory (Gemma-3, connectors, joint transformer, video VAE, audio VAE,
vocoder), against diffusers' LTX2Pipeline.__call__ for the same seed: frames AND audio,
with requests at different steps sharing transformer calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import DiffusionEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_denoiser

torch.set_num_threads(1)
# the tiny transformer has 2 blocks: STG perturbs block 1 (the release: 28)
OPTIONS = {"stg_blocks": [1], "max_sequence_length": 32, "max_batch_rows": 16}
# audio: float differences between batched and single calls (measured <= 2e-7; a wrong
# step or pass moves it by >= 5e-3)
AUDIO_BOUND = 1e-5


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    model_dir = ensure_tiny_model("ltx2", tmp_path_factory.getbasetemp() / "models")
    denoiser = build_denoiser("ltx2", model_dir=str(model_dir), device="cpu", dtype="auto",
                              options=OPTIONS)
    return DiffusionEngine(denoiser, OPTIONS)


def run(eng, requests, join_after=1):
    """The first request starts alone; the rest join after ``join_after`` steps."""
    results = {}
    eng.add(EngineRequest(*requests[0]))
    for _ in range(join_after):
        collect(eng.step(), results)
    for request in requests[1:]:
        eng.add(EngineRequest(*request))
    while eng.has_work():
        collect(eng.step(), results)
    return results


def collect(outputs, results):
    for out in outputs:
        assert out.error is None, out.error
        if out.finished:
            results[out.request_id] = out.data


def reference(pipe, inputs, params, scales=None):
    width, height = (int(v) for v in params["size"].split("x"))
    out = pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
               height=height, width=width, num_frames=params["frames"], frame_rate=24.0,
               num_inference_steps=params["steps"],
               guidance_scale=params.get("guidance_scale", 3.0),
               spatio_temporal_guidance_blocks=OPTIONS["stg_blocks"],
               max_sequence_length=OPTIONS["max_sequence_length"], output_type="np",
               generator=torch.Generator().manual_seed(params["seed"]), **(scales or {}))
    return out.frames[0], out.audio[0].float()


def close_to(result, expected):
    frames, audio = expected
    video, sound = result["video"], result["audio"]
    assert video.shape == frames.shape and sound.shape == audio.shape
    assert video.float().std() > 2, "the fixture's video does not vary: the test is blind"
    assert sound.abs().max() > 0.01 and sound.std() > 1e-3, "silent audio: the test is blind"
    # uint8 vs float x 255: the rounding (0.5) plus 0.01 of a level
    assert np.abs(video.numpy().astype(float) - frames * 255).max() <= 0.51
    assert (sound - audio).abs().max() <= AUDIO_BOUND


def test_audio_and_video_batched_at_different_steps_equal_ltx2pipeline(eng):
    pipe = eng.denoiser.pipe
    calls = []
    forward = pipe.transformer.forward

    def recorded(*args, **kwargs):
        calls.append((kwargs["hidden_states"].shape[0], kwargs["isolate_modalities"]))
        return forward(*args, **kwargs)
    pipe.transformer.forward = recorded
    requests = [
        ("a", {"prompt": "a red fox barks"}, {"size": "64x64", "steps": 3, "seed": 1,
                                              "frames": 9}),
        ("b", {"prompt": "rain on a tin roof", "negative_prompt": "blurry"},
         {"size": "64x64", "steps": 4, "seed": 2, "frames": 9, "guidance_scale": 5.0}),
        ("c", {"prompt": "a dog"}, {"size": "64x64", "steps": 2, "seed": 3, "frames": 9,
                                    "guidance_scale": 1.0})]
    results = run(eng, requests)
    pipe.transformer.forward = forward
    # each request: cond + uncond + STG rows in the joint call (c too: its audio
    # guidance 7 keeps the negative prompt on), one row in the isolated call; all three
    # requests, at different steps, shared both calls
    assert max(rows for rows, isolated in calls if not isolated) == 3 * 3
    assert max(rows for rows, isolated in calls if isolated) == 3
    assert eng.calls < 3 + 4 + 2 and eng.max_rows == 9  # the row cap counts STG rows
    for rid, inputs, params in requests:
        close_to(results[rid], reference(pipe, inputs, params))
    assert results["a"]["sample_rate"] == 24000 and results["a"]["fps"] == 24
    assert results["a"]["audio"].shape[0] == 2  # stereo
