"""FLUX.1 and FLUX.2 through the unmodified openai SDK: /v1/images/generations on tiny
FLUX.1-dev and FLUX.2 directories served by their built-in presets (picked from
model_index.json), /v1/images/edits on a tiny FLUX.1 Kontext and the FLUX.2 one (two
reference images); the served PNGs equal diffusers' own pipeline call."""

from __future__ import annotations

import base64
import io

import diffusers
import numpy as np
import openai
import pytest
import torch
from httputil import Server, ServerSettings, run, write_pipeline
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)

STAGE = """\
name: {name}
stages:
  - name: diffusion
    engine: diffusion
    model: {model}
    model_dir: {model_dir}
    final_output: image
    options: {{default_size: 32x32, default_steps: 3, max_side: 64, {extra}}}
"""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    return {name: ensure_tiny_model(name, cache) for name in ("flux1", "flux1_kontext",
                                                               "flux2")}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    pipelines = tmp_path_factory.mktemp("flux-pipelines")
    # flux1 and flux2: the presets flux.yaml / flux2.yaml, as `omni.server DIR` serves them
    # (their 512-token prompt padding costs the tiny FLUX.2 ~0.2 s over 64 here)
    targets = {"flux1": dirs["flux1"], "flux2": dirs["flux2"],
               "kontext": write_pipeline(pipelines, "kontext", STAGE.format(
                   name="kontext", model="flux", model_dir=dirs["flux1_kontext"],
                   extra="auto_resize: false, max_sequence_length: 32"))}
    srv = Server(targets, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def reference(model_dir, **kwargs) -> np.ndarray:
    if (model_dir / "tokenizer" / "processor_config.json").is_file():  # FLUX.2
        from omni.models.flux2 import build_flux2

        pipe = build_flux2(model_dir=str(model_dir), device="cpu", dtype="auto",
                           options={}).pipe
    else:
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    seed = kwargs.pop("seed")
    out = pipe(output_type="np", generator=torch.Generator().manual_seed(seed), **kwargs)
    return (out.images * 255).round()


def assert_close(served: list[np.ndarray], ref: np.ndarray) -> None:
    assert len(np.unique(served[0])) > 20  # not a flat picture
    assert np.abs(np.stack(served).astype(float) - ref).max() <= 1


def test_generate_through_the_preset_equals_diffusers(server, dirs):
    async def body():
        async with server.client() as client:
            result = await client.images.generate(
                model="flux1", prompt="a red fox", n=2, size="64x32",
                extra_body={"seed": 3, "num_inference_steps": 3, "guidance_scale": 4.0})
        assert len(result.data) == 2 and result.size == "64x32"
        assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
        return [pixels(d.b64_json) for d in result.data]
    served = run(body())
    ref = reference(dirs["flux1"], prompt="a red fox", num_images_per_prompt=2, height=32,
                    width=64, num_inference_steps=3, guidance_scale=4.0, seed=3)
    assert_close(served, ref)


def png(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_kontext_edit_equals_diffusers(server, dirs):
    src = png(48, 32)

    async def body():
        async with server.client() as client:
            out = await client.images.edit(model="kontext", image=("in.png", src),
                                           prompt="make it red",
                                           extra_body={"seed": 5, "guidance_scale": 2.5})
        return [pixels(d.b64_json) for d in out.data]
    served = run(body())
    assert served[0].shape == (32, 48, 3)  # size auto: the input's size
    ref = reference(dirs["flux1_kontext"], image=Image.open(io.BytesIO(src)).convert("RGB"),
                    prompt="make it red", height=32, width=48, max_area=32 * 48,
                    _auto_resize=False, num_inference_steps=3, guidance_scale=2.5,
                    max_sequence_length=32, seed=5)
    assert_close(served, ref)


def test_flux2_generate_and_edit_with_two_references_equal_diffusers(server, dirs):
    refs, steps = [png(64, 64, 1), png(96, 64, 2)], {"num_inference_steps": 3}

    async def body():
        async with server.client() as client:
            made = await client.images.generate(model="flux2", prompt="a red fox",
                                                size="64x32", extra_body={"seed": 1, **steps})
            edited = await client.images.edit(
                model="flux2", image=[("a.png", refs[0]), ("b.png", refs[1])],
                prompt="put them together", size="32x32",
                extra_body={"seed": 2, **steps})
        return pixels(made.data[0].b64_json), pixels(edited.data[0].b64_json)
    made, edited = run(body())
    assert_close([made], reference(dirs["flux2"], prompt="a red fox", height=32, width=64,
                                   seed=1, **steps))
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in refs]
    assert_close([edited], reference(dirs["flux2"], prompt="put them together", image=images,
                                     height=32, width=32, seed=2, **steps))


@pytest.mark.parametrize("model, call, kwargs, param, text", [
    ("flux1", "generate", {"size": "40x40"}, "size", "multiples of 16"),
    ("flux1", "generate", {"extra_body": {"guidance_scale": "high"}}, "guidance_scale",
     "must be a number"),
    ("kontext", "generate", {}, "model", "edit"),
    ("flux1", "edit", {"image": ("a.png", b"\x89PNG\r\n\x1a\nbroken")}, None, "image"),
    ("flux2", "edit", {"image": ("a.png", png(48, 32))}, None, "at least 64px"),
    ("flux2", "edit", {"image": [("a.png", png(64, 64))] * 5}, "image", "4 image"),
])
def test_bad_requests_are_400s(server, model, call, kwargs, param, text):
    async def body():
        async with server.client() as client:
            method = getattr(client.images, call)
            args = {"model": model, "prompt": "x", **kwargs}
            with pytest.raises(openai.BadRequestError) as info:
                await method(**args)
            assert text in info.value.message
            if param is not None:
                assert info.value.body["param"] == param
    run(body())
