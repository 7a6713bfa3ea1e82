"""HunyuanImage 2.1 through the unmodified openai SDK: /v1/images/generations on a tiny
HunyuanImage-2.1 directory served by its built-in preset (picked from model_index.json);
the served PNGs equal diffusers' own pipeline call, APG guider and all."""

from __future__ import annotations

import base64
import io

import diffusers
import numpy as np
import openai
import pytest
import torch
from httputil import Server, ServerSettings, run
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model("hunyuan_image", tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="module")
def server(model_dir):
    # the preset hunyuan_image.yaml, as `omni.server DIR` serves it
    srv = Server({"hunyuan": model_dir}, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def test_generate_through_the_preset_equals_diffusers(server, model_dir):
    prompt = 'a sign that says "open"'  # quoted text: the OCR guider and the ByT5 rows

    async def body():
        async with server.client() as client:
            result = await client.images.generate(
                model="hunyuan", prompt=prompt, n=2, size="64x32",
                extra_body={"seed": 3, "num_inference_steps": 7, "guidance_scale": 5.0})
        assert len(result.data) == 2 and result.size == "64x32"
        assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
        return [pixels(d.b64_json) for d in result.data]
    served = run(body())
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    pipe.ocr_guider = pipe.ocr_guider.new(guidance_scale=5.0)
    ref = pipe(prompt=prompt, num_images_per_prompt=2, height=32, width=64,
               num_inference_steps=7, output_type="np",
               generator=torch.Generator().manual_seed(3)).images
    assert len(np.unique(served[0])) > 20  # not a flat picture
    assert not np.array_equal(served[0], served[1])
    assert np.abs(np.stack(served).astype(float) - (ref * 255).round()).max() <= 1


def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("call, kwargs, param, text", [
    ("generate", {"size": "40x40"}, "size", "multiples of 16"),
    ("generate", {"extra_body": {"guidance_scale": "high"}}, "guidance_scale",
     "must be a number"),
    ("edit", {"image": ("a.png", png())}, "model", "edit"),
])
def test_bad_requests_are_400s(server, call, kwargs, param, text):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await getattr(client.images, call)(model="hunyuan", prompt="x", **kwargs)
            assert text in info.value.message, info.value.message
            if param is not None:
                assert info.value.body["param"] == param
    run(body())
