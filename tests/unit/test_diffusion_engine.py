"""The diffusion engine on tiny random Qwen-Image / Wan pipelines, loaded by the real
adapters from the release layout, against diffusers' own pipelines as the reference."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from unit.diffusion_runs import collect, engine, png, run

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import preview_steps


def close_to(ours, reference):
    """Our uint8 pixels vs diffusers' float output: at most one level apart (rounding
    of ~1e-7 differences between batched and single calls)."""
    assert ours.shape == reference.shape
    assert np.abs(ours.numpy().astype(float) - (reference * 255).round()).max() <= 1


def qwen_reference(pipe, inputs, params, image=None):
    width, height = (int(v) for v in params["size"].split("x"))
    extra = {"image": Image.open(io.BytesIO(image)).convert("RGB")} if image else {}
    return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                height=height, width=width, num_inference_steps=params["steps"],
                true_cfg_scale=params.get("guidance_scale", 4.0),
                num_images_per_prompt=params.get("n", 1), output_type="np",
                generator=torch.Generator().manual_seed(params["seed"]), **extra).images


def wan_reference(pipe, inputs, params, image=None):
    width, height = (int(v) for v in params["size"].split("x"))
    extra = {"image": Image.open(io.BytesIO(image)).convert("RGB")} if image else {}
    return pipe(prompt=inputs["prompt"], negative_prompt=inputs.get("negative_prompt"),
                height=height, width=width, num_frames=params["frames"],
                num_inference_steps=params["steps"],
                guidance_scale=params.get("guidance_scale", 5.0), output_type="np",
                generator=torch.Generator().manual_seed(params["seed"]), **extra).frames[0]


QWEN_REQUESTS = [
    ("plain", {"prompt": "a red fox in the snow"}, {"size": "32x32", "steps": 4, "seed": 1}),
    ("guided", {"prompt": "the quick brown dog in the rain", "negative_prompt": "blurry"},
     {"size": "32x32", "steps": 5, "seed": 2, "guidance_scale": 4.0, "n": 2}),
    ("wide", {"prompt": "hello"}, {"size": "64x32", "steps": 3, "seed": 3}),
]


def test_qwen_image_batched_equals_diffusers_per_request(models):
    eng = engine(models, "qwen_image", "qwen_image")
    results, errors = run(eng, QWEN_REQUESTS)
    assert not errors
    # plain + guided (2 images, 2 guidance rows) shared calls at different timesteps
    stats = eng.stats()
    assert stats["max_rows"] == 5 and stats["transformer_calls"] < 4 + 5 + 3
    assert stats["running"] == 0 and stats["tensor_bytes"] == 0
    for rid, inputs, params in QWEN_REQUESTS:
        close_to(results[rid]["images"], qwen_reference(eng.denoiser.pipe, inputs, params))
        assert results[rid]["seed"] == params["seed"]


def test_wan_multistep_scheduler_batched_equals_diffusers(models):
    eng = engine(models, "wan", "wan_t2v")
    assert type(eng.denoiser.pipe.scheduler).__name__ == "UniPCMultistepScheduler"
    requests = [
        ("a", {"prompt": "a red fox"}, {"size": "32x32", "steps": 4, "seed": 1, "frames": 9}),
        ("b", {"prompt": "a dog in the rain", "negative_prompt": "blurry"},
         {"size": "32x32", "steps": 5, "seed": 2, "frames": 9}),
        ("c", {"prompt": "hello"}, {"size": "32x32", "steps": 3, "seed": 3, "frames": 5,
                                    "guidance_scale": 1.0})]
    results, errors = run(eng, requests)
    assert not errors
    assert eng.stats()["transformer_calls"] < 4 + 5 + 3
    for rid, inputs, params in requests:
        close_to(results[rid]["video"], wan_reference(eng.denoiser.pipe, inputs, params))
        assert results[rid]["video"].shape[0] == params["frames"]


def test_image_conditioned_models_equal_diffusers(models):
    image = png(24, 20)
    eng = engine(models, "qwen_image", "qwen_image_edit", edit_area=32 * 32)
    params = {"steps": 3, "seed": 4, "size": "32x32"}
    requests = [("e1", {"prompt": "make it red", "images": [image]}, params),
                ("e2", {"prompt": "make it blue", "images": [png(24, 20, seed=1)]}, {**params,
                                                                             "seed": 5})]
    results, errors = run(eng, requests, join_after=1)
    assert not errors
    ref = _edit_reference(eng.denoiser.pipe, "make it red", image, params)
    close_to(results["e1"]["images"], ref)

    eng = engine(models, "wan", "wan_i2v")
    params = {"size": "32x32", "steps": 3, "seed": 6, "frames": 5}
    results, errors = run(eng, [("v", {"prompt": "a fox", "images": [image]}, params)])
    assert not errors
    close_to(results["v"]["video"], wan_reference(eng.denoiser.pipe, {"prompt": "a fox"},
                                                  params, image))


def _edit_reference(pipe, prompt, image, params):
    """QwenImageEditPipeline at our edit_area: diffusers fixes the area at 1024*1024, so
    the reference swaps in the same dimension rule."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

    original = edit.calculate_dimensions
    edit.calculate_dimensions = lambda area, ratio: original(32 * 32, ratio)
    try:
        return qwen_reference(pipe, {"prompt": prompt}, params, image)
    finally:
        edit.calculate_dimensions = original


def test_step_cache_zero_is_exact_and_positive_skips(models):
    request = [("r", {"prompt": "a red fox"}, {"size": "32x32", "steps": 12, "seed": 7})]
    plain, _ = run(engine(models, "qwen_image", "qwen_image"), request)
    exact_engine = engine(models, "qwen_image", "qwen_image", step_cache=0.0)
    exact, _ = run(exact_engine, request)
    assert torch.equal(plain["r"]["images"], exact["r"]["images"])
    assert exact["r"]["skipped_steps"] == 0 and exact_engine.stats()["transformer_calls"] == 12
    cached_engine = engine(models, "qwen_image", "qwen_image", step_cache=0.5)
    cached, _ = run(cached_engine, request)
    skipped = cached["r"]["skipped_steps"]
    assert skipped > 0 and cached_engine.stats()["transformer_calls"] == 12 - skipped
    # a request turns on the default threshold for itself
    per_request = [("r", {"prompt": "a red fox"}, {"size": "32x32", "steps": 12, "seed": 7,
                                                   "step_cache": True})]
    default, _ = run(engine(models, "qwen_image", "qwen_image"), per_request)
    assert default["r"]["skipped_steps"] > 0


def test_abort_mid_denoise_frees_the_request_and_others_finish(models):
    eng = engine(models, "qwen_image", "qwen_image")
    eng.add(EngineRequest("keep", {"prompt": "a"}, {"size": "32x32", "steps": 6, "seed": 1}))
    eng.add(EngineRequest("drop", {"prompt": "b"}, {"size": "32x32", "steps": 6, "seed": 2}))
    eng.step()
    eng.step()
    assert eng.stats()["running"] == 2
    held = eng.stats()["tensor_bytes"]
    eng.abort(["drop"])
    assert eng.stats()["running"] == 1 and eng.stats()["tensor_bytes"] < held
    results, errors = {}, {}
    while eng.has_work():
        collect(eng.step(), results, errors)
    assert list(results) == ["keep"] and not errors
    stats = eng.stats()
    assert (stats["running"], stats["waiting"], stats["tensor_bytes"]) == (0, 0, 0)


@pytest.mark.parametrize("name, inputs, params, message", [
    ("qwen_image", {"prompt": "x", "images": [b"png"]}, {}, "image-editing model"),
    ("qwen_image", {"prompt": ""}, {}, "'prompt'"),
    ("qwen_image", {"prompt": "x"}, {"size": "30x30"}, "multiples of 16"),
    ("qwen_image", {"prompt": "x"}, {"size": "4096x4096"}, "larger than"),
    ("qwen_image", {"prompt": "x"}, {"steps": 0}, "'steps'"),
    ("qwen_image", {"prompt": "x"}, {"n": 9}, "'n'"),
    ("qwen_image", {"prompt": "x"}, {"seed": -1}, "'seed'"),
    ("qwen_image", {"prompt": "x"}, {"previews": 7}, "'previews'"),
    ("qwen_image_edit", {"prompt": "x"}, {}, "send the image"),
    ("qwen_image_edit", {"prompt": "x", "images": [b"not an image"]}, {}, "not an image"),
    ("wan_t2v", {"prompt": "x", "images": [b"png"]}, {}, "image-to-video model"),
    ("wan_t2v", {"prompt": "x"}, {"frames": 8}, "4k+1"),
    ("wan_i2v", {"prompt": "x"}, {}, "input_reference"),
])
def test_bad_requests_fail_alone_with_a_clear_error(models, name, inputs, params, message):
    family = "wan" if name.startswith("wan") else "qwen_image"
    eng = engine(models, family, name)
    eng.add(EngineRequest("bad", inputs, params))
    out = eng.step()
    assert len(out) == 1 and out[0].finished and message in out[0].error
    assert not eng.has_work()


def test_previews_are_evenly_spaced_and_come_before_the_result(models):
    assert preview_steps(2, 6) == (2, 4)
    assert preview_steps(3, 2) == (1,)
    eng = engine(models, "qwen_image", "qwen_image")
    eng.add(EngineRequest("p", {"prompt": "a fox"}, {"size": "32x32", "steps": 6,
                                                     "previews": 2, "seed": 1}))
    seen = []
    while eng.has_work():
        for out in eng.step():
            if "preview" in (out.data or {}):
                seen.append((out.data["index"], out.data["progress"]["step"],
                             tuple(out.data["preview"].shape)))
            elif out.finished:
                seen.append(("final", out.data["steps"], tuple(out.data["images"].shape)))
    assert seen == [(0, 2, (1, 32, 32, 3)), (1, 4, (1, 32, 32, 3)), ("final", 6, (1, 32, 32, 3))]


def test_requests_finishing_together_decode_in_one_call_and_equal_diffusers(models):
    eng = engine(models, "qwen_image", "qwen_image")
    calls = []
    decode = eng.denoiser.decode
    eng.denoiser.decode = lambda jobs: calls.append(len(jobs)) or decode(jobs)
    requests = [(f"r{i}", {"prompt": f"picture {i} of a fox"},
                 {"size": "32x32", "steps": 3, "seed": i}) for i in range(3)]
    results, errors = run(eng, requests, join_after=0)
    assert not errors and calls == [3]
    for rid, inputs, params in requests:
        close_to(results[rid]["images"], qwen_reference(eng.denoiser.pipe, inputs, params))


def test_a_burst_is_admitted_a_few_requests_per_step(models):
    eng = engine(models, "qwen_image", "qwen_image", max_admit_per_step=2)
    for i in range(5):
        eng.add(EngineRequest(f"r{i}", {"prompt": "x"}, {"size": "32x32", "steps": 3,
                                                         "seed": i}))
    eng.step()
    assert (eng.stats()["running"], eng.stats()["waiting"]) == (2, 3)
    results, errors = {}, {}
    while eng.has_work():
        collect(eng.step(), results, errors)
    assert sorted(results) == [f"r{i}" for i in range(5)] and not errors


@pytest.mark.parametrize("family, name, typo, valid", [
    ("qwen_image", "qwen_image", "max_step", "max_steps"),  # a limit
    ("wan", "wan_t2v", "max_batch_row", "max_batch_rows")])  # the engine's
def test_an_unknown_option_fails_the_load_and_names_the_valid_ones(models, family, name,
                                                                   typo, valid):
    from omni.engines.base import EngineLoadError
    from omni.engines.diffusion.engine import build_diffusion_engine

    with pytest.raises(EngineLoadError, match=rf"unknown diffusion engine \({family}\) "
                       rf"option\(s\) {typo};.*\b{valid}\b"):
        build_diffusion_engine(family, model_dir=models(name), device="cpu", dtype="auto",
                               options={typo: 4})
    eng = build_diffusion_engine(family, model_dir=models(name), device="cpu", dtype="auto",
                                 options={valid: 4, "nice": 1})
    assert eng.max_batch_rows == 4 or eng.denoiser.limits.max_steps == 4


def test_a_failing_transformer_call_fails_its_requests_and_the_engine_goes_on(models):
    eng = engine(models, "qwen_image", "qwen_image")
    predict, calls = eng.denoiser.predict, []

    def fail_second_call(jobs):  # failure injection: the second call raises
        calls.append([j.request_id for j in jobs])
        if len(calls) == 2:
            raise RuntimeError("CUDA out of memory (injected)")
        return predict(jobs)
    eng.denoiser.predict = fail_second_call
    eng.add(EngineRequest("a", {"prompt": "x"}, {"size": "32x32", "steps": 3, "seed": 1}))
    eng.add(EngineRequest("b", {"prompt": "y"}, {"size": "32x32", "steps": 3, "seed": 2}))
    results, errors = {}, {}
    while eng.has_work():
        collect(eng.step(), results, errors)
    assert sorted(errors) == ["a", "b"] and "out of memory (injected)" in errors["a"]
    assert eng.stats()["tensor_bytes"] == 0
    eng.add(EngineRequest("c", {"prompt": "z"}, {"size": "32x32", "steps": 2, "seed": 3}))
    while eng.has_work():
        collect(eng.step(), results, errors)
    assert list(results) == ["c"]
