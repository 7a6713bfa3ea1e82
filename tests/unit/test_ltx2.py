"""LTX-2 (video + audio) in the diffusion engine, loaded by the real adapter from a tiny
random release directory (Gemma-3, connectors, joint transformer, video VAE, audio VAE,
vocoder), against diffusers' LTX2Pipeline.__call__ (text to video) and
LTX2ImageToVideoPipeline.__call__ (image to video) for the same seed: frames AND audio,
with requests at different steps sharing transformer calls."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from unit.diffusion_runs import png

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
    if inputs.get("images"):
        scales = {**(scales or {}),
                  "image": Image.open(io.BytesIO(inputs["images"][0])).convert("RGB")}
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


def record_calls(pipe):
    """(rows, isolated, video timestep shape) per transformer call; undo() restores."""
    calls, forward = [], pipe.transformer.forward

    def recorded(*args, **kwargs):
        calls.append((kwargs["hidden_states"].shape[0], kwargs["isolate_modalities"],
                      tuple(kwargs["timestep"].shape)))
        return forward(*args, **kwargs)
    pipe.transformer.forward = recorded
    return calls, lambda: setattr(pipe.transformer, "forward", forward)


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


def test_image_to_video_batched_with_text_equals_ltx2_image_to_video_pipeline(eng):
    from diffusers import LTX2ImageToVideoPipeline

    pipe = eng.denoiser.pipe
    assert eng.denoiser.info()["tasks"] == ["text_to_video", "image_to_video"]
    calls, undo = record_calls(pipe)
    params = {"size": "64x64", "frames": 9, "seed": 5}
    # 64x48 images: the pipeline resizes them to the request's size
    requests = [
        ("i", {"prompt": "a bird sings", "images": [png(64, 48, seed=0)]},
         {**params, "steps": 3}),
        ("j", {"prompt": "a bird sings", "images": [png(64, 48, seed=1)]},
         {**params, "steps": 3}),
        ("t", {"prompt": "a bird sings"}, {**params, "steps": 4})]
    results = run(eng, requests)
    undo()
    # the video (and its sound) follow the image: same prompt and seed, other image
    first, other = results["i"], results["j"]
    assert (first["video"].float() - other["video"].float()).abs().max() > 20
    assert (first["audio"] - other["audio"]).abs().max() > 100 * AUDIO_BOUND
    # text and image rows (at different steps) shared calls, with per-token timesteps
    assert max(rows for rows, isolated, _ in calls if not isolated) == 3 * 3
    # 2 latent frames x 2 x 2 tokens (64x64 over 32x, 9 frames over 8x)
    assert (9, 8) in [shape for _, isolated, shape in calls if not isolated]
    i2v = LTX2ImageToVideoPipeline(**pipe.components)
    i2v.set_progress_bar_config(disable=True)
    for rid, inputs, request_params in requests[:2]:
        close_to(results[rid], reference(i2v, inputs, request_params))
    close_to(results["t"], reference(pipe, *requests[2][1:]))


@pytest.mark.parametrize("crf", ["x", -1, 52])
def test_a_bad_image_crf_fails_the_load_naming_it(eng, crf):
    from omni.engines.base import EngineLoadError
    from omni.models.ltx2_image import FirstFrame

    with pytest.raises(EngineLoadError, match="'image_crf'"):
        FirstFrame(eng.denoiser.pipe, {"image_crf": crf})
    assert FirstFrame(eng.denoiser.pipe, {}).crf == 33  # the pipeline's, for Gemma-3


def test_stg_rows_beside_others_run_in_bfloat16(tmp_path_factory):
    """The release's dtype: a call holding STG rows with other rows lerps bf16 values by
    the perturbation mask, which must be bf16 too (float32 failed every such call on the
    GPU; the float32 tests above could not see it)."""
    model_dir = ensure_tiny_model("ltx2", tmp_path_factory.getbasetemp() / "models")
    denoiser = build_denoiser("ltx2", model_dir=str(model_dir), device="cpu",
                              dtype="bfloat16", options=OPTIONS)
    results = run(DiffusionEngine(denoiser, OPTIONS), [
        ("a", {"prompt": "a red fox barks"}, {"size": "64x64", "steps": 2, "seed": 1,
                                              "frames": 9})])
    assert results["a"]["video"].float().std() > 2
    assert torch.isfinite(results["a"]["audio"]).all()
