"""FLUX.1 through the unmodified openai SDK: /v1/images/generations on a tiny FLUX.1-dev
directory served by its built-in preset (picked from model_index.json), /v1/images/edits
on a tiny FLUX.1 Kontext; the served PNGs equal diffusers' own pipeline call."""

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

KONTEXT = """\
name: kontext
stages:
  - name: diffusion
    engine: diffusion
    model: flux
    model_dir: {model_dir}
    final_output: image
    options: {{default_size: 32x32, default_steps: 3, max_side: 64, auto_resize: false,
               max_sequence_length: 32}}
"""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    return {name: ensure_tiny_model(name, cache) for name in ("flux1", "flux1_kontext")}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    pipelines = tmp_path_factory.mktemp("flux-pipelines")
    targets = {"flux1": dirs["flux1"],  # the preset flux.yaml, as `omni.server DIR` serves it
               "kontext": write_pipeline(pipelines, "kontext",
                                         KONTEXT.format(model_dir=dirs["flux1_kontext"]))}
    srv = Server(targets, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def reference(model_dir, **kwargs) -> np.ndarray:
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


def test_kontext_edit_equals_diffusers(server, dirs):
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)).save(buf, "PNG")
    src = buf.getvalue()

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


@pytest.mark.parametrize("model, call, kwargs, param, text", [
    ("flux1", "generate", {"size": "40x40"}, "size", "multiples of 16"),
    ("flux1", "generate", {"extra_body": {"guidance_scale": "high"}}, "guidance_scale",
     "must be a number"),
    ("kontext", "generate", {}, "model", "edit"),
    ("flux1", "edit", {"image": ("a.png", b"\x89PNG\r\n\x1a\nbroken")}, None, "image"),
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
