"""/v1/images/generations and /v1/images/edits through the unmodified openai SDK, on tiny
random Qwen-Image and Qwen-Image-Edit pipelines loaded by the real adapters."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run, write_pipeline
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model

PIPELINE = """\
name: {name}
stages:
  - name: diffusion
    engine: diffusion
    model: qwen_image
    model_dir: {model_dir}
    final_output: image
    options: {{default_size: 32x32, default_steps: 3, max_side: 64, {extra}}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    pipelines = tmp_path_factory.mktemp("image-pipelines")
    targets = {
        "t2i": write_pipeline(pipelines, "t2i", PIPELINE.format(
            name="t2i", model_dir=ensure_tiny_model("qwen_image", cache),
            extra="max_n: 3, max_steps: 2000")),
        "edit": write_pipeline(pipelines, "edit", PIPELINE.format(
            name="edit", model_dir=ensure_tiny_model("qwen_image_edit", cache),
            extra="edit_area: 1024")),
    }
    srv = Server(targets, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def decode(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def png_file(width=48, height=32, alpha=None):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if alpha is not None:
        image = Image.fromarray(np.dstack([pixels, alpha]), "RGBA")
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_generate_returns_n_images_in_each_format(server):
    async def body():
        async with server.client() as client:
            result = await client.images.generate(model="t2i", prompt="a red fox", n=2,
                                                  size="32x32", extra_body={"seed": 3})
            assert len(result.data) == 2 and result.size == "32x32"
            images = [decode(d.b64_json) for d in result.data]
            assert all(i.format == "PNG" and i.size == (32, 32) for i in images)
            assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
            again = await client.images.generate(model="t2i", prompt="a red fox", n=2,
                                                 size="32x32", extra_body={"seed": 3})
            assert [d.b64_json for d in again.data] == [d.b64_json for d in result.data]
            for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP")):
                out = await client.images.generate(model="t2i", prompt="x", size="64x32",
                                                   output_format=fmt, output_compression=50)
                image = decode(out.data[0].b64_json)
                assert image.format == pil and image.size == (64, 32)
            url = await client.images.generate(model="t2i", prompt="x", response_format="url")
            assert url.data[0].url.startswith("data:image/png;base64,")
    run(body())


def test_streamed_partial_images_come_in_order(server):
    async def body():
        async with server.client() as client:
            stream = await client.images.generate(
                model="t2i", prompt="a fox", stream=True, partial_images=2,
                extra_body={"num_inference_steps": 6})
            events = [event async for event in stream]
        assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + [
            "image_generation.completed"]
        assert [e.partial_image_index for e in events[:2]] == [0, 1]
        assert all(decode(e.b64_json).size == (32, 32) for e in events)
        assert events[-1].usage.total_tokens > 0
    run(body())


def test_edit_with_image_and_image_list_and_mask(server):
    async def body():
        async with server.client() as client:
            src = png_file()
            one = await client.images.edit(model="edit", image=("in.png", src),
                                           prompt="make it red", size="32x32")
            assert decode(one.data[0].b64_json).size == (32, 32)
            listed = await client.images.edit(model="edit", image=[("in.png", src)],
                                              prompt="make it red", size="32x32")
            assert len(listed.data) == 1
            # opaque mask pixels keep the original there
            alpha = np.zeros((32, 48), dtype=np.uint8)
            alpha[:, :20] = 255
            masked = await client.images.edit(model="edit", image=("in.png", src),
                                              mask=("m.png", png_file(alpha=alpha)),
                                              prompt="x", size="48x32")
            out = np.asarray(decode(masked.data[0].b64_json))
            original = np.asarray(Image.open(io.BytesIO(src)).convert("RGB"))
            assert np.array_equal(out[:, :20], original[:, :20])
            stream = await client.images.edit(model="edit", image=("in.png", src),
                                              prompt="x", stream=True, partial_images=1)
            types = [e.type async for e in stream]
            assert types == ["image_edit.partial_image", "image_edit.completed"]
    run(body())


@pytest.mark.parametrize("kwargs, param, text", [
    ({"size": "33x33"}, "size", "multiples"),
    ({"size": "128x128"}, "size", "larger than"),
    ({"n": 4}, "n", "'n'"),
    ({"output_format": "gif"}, "output_format", "png, jpeg, webp"),
    ({"background": "transparent"}, "background", "transparent"),
    ({"extra_body": {"num_inference_steps": 0}}, "num_inference_steps", "from 1"),
    ({"extra_body": {"seed": "soon"}}, "seed", "int"),
    ({"extra_body": {"steps": "many"}}, "steps", "must be an integer"),
    ({"extra_body": {"cfg_scale": "high"}}, "cfg_scale", "must be a number"),
    ({"extra_body": {"seed": True}}, "seed", "must be an integer"),
    ({"model": "edit"}, "model", "edit"),
    ({"model": "nope"}, "model", "not served"),
    ({"stream": True, "n": 2}, "n", "n=1"),
])
def test_bad_generation_requests_are_400s(server, kwargs, param, text):
    async def body():
        async with server.client() as client:
            args = {"model": "t2i", "prompt": "x", **kwargs}
            with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as info:
                await client.images.generate(**args)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())


@pytest.mark.parametrize("kwargs, param, text", [
    ({"model": "t2i"}, "model", "/v1/images/generations"),
    ({"image": [("a.png", png_file()), ("b.png", png_file())]}, "image", "1 image"),
    ({"mask": ("m.png", png_file(width=8, height=8))}, "mask", "must match"),
    ({"mask": ("m.png", png_file())}, "mask", "alpha"),
    ({"image": ("a.png", b"not an image")}, None, "not an image"),
])
def test_bad_edit_requests_are_400s(server, kwargs, param, text):
    async def body():
        async with server.client() as client:
            args = {"model": "edit", "prompt": "x", "image": ("a.png", png_file()), **kwargs}
            with pytest.raises(openai.BadRequestError) as info:
                await client.images.edit(**args)
            assert text in info.value.message and info.value.status_code == 400
            if param is not None:
                assert info.value.body["param"] == param
    run(body())


def test_client_disconnect_aborts_the_request(server):
    async def body():
        async with server.client(timeout=0.2) as client:
            with pytest.raises(openai.APITimeoutError):
                # three 64x64 images of 2,000 steps, ~5 s: well past the 0.2 s timeout
                # (of 100 steps, ~0.24 s here: a fast moment of a CI run finished them)
                await client.images.generate(model="t2i", prompt="x", size="64x64", n=3,
                                             extra_body={"num_inference_steps": 2000})
        state = await server.wait_idle("t2i", timeout_s=10)
        assert not state["requests"] and not any(state["outstanding"].values())
    run(body())


def test_chat_completions_on_an_image_model_return_image_parts(server):
    async def body():
        async with server.client() as client:
            reply = await client.chat.completions.create(
                model="t2i", messages=[{"role": "user", "content": "a red fox"}], n=2,
                extra_body={"size": "64x32", "seed": 1})
            assert len(reply.choices) == 2 and reply.usage.prompt_tokens > 0
            part = reply.choices[0].message.content[0]
            assert part["type"] == "image_url"
            url = part["image_url"]["url"]
            assert url.startswith("data:image/png;base64,")
            assert decode(url.split(",", 1)[1]).size == (64, 32)
            src = "data:image/png;base64," + base64.b64encode(png_file()).decode()
            edited = await client.chat.completions.create(model="edit", messages=[
                {"role": "user", "content": [{"type": "text", "text": "make it red"},
                                             {"type": "image_url", "image_url": {"url": src}}]}],
                extra_body={"size": "32x32"})
            assert edited.choices[0].message.content[0]["type"] == "image_url"
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(
                    model="t2i", messages=[{"role": "user", "content": "x"}], stream=True)
            assert "/v1/images/generations" in info.value.message
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="t2i", messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {
                        "url": "file:///etc/passwd"}}]}])
            assert "file URLs are refused" in info.value.message
    run(body())
