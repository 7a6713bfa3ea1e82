"""HunyuanImage 2.1 and HunyuanVideo 1.5 through the unmodified openai SDK, on tiny release
directories served as they are (each preset picked from model_index.json), one server:
/v1/images/generations (the PNGs equal diffusers' own pipeline call, APG guider and all)
and /v1/videos (text to video; image to video from input_reference)."""

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
from omni.media.video import decode_mp4

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # client.videos
VIDEO_MODELS = ("hunyuan_video_t2v", "hunyuan_video_i2v")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    return {name: ensure_tiny_model(name, cache) for name in ("hunyuan_image", *VIDEO_MODELS)}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    # the presets hunyuan_image.yaml / hunyuan_video.yaml, as `omni.server DIR` serves them
    targets = {"hunyuan": dirs["hunyuan_image"], **{m: dirs[m] for m in VIDEO_MODELS}}
    settings = ServerSettings(drain_timeout_s=2.0,
                              data_dir=str(tmp_path_factory.mktemp("hunyuan-videos")))
    srv = Server(targets, settings).start()
    yield srv
    srv.stop()


def pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def test_generate_through_the_preset_equals_diffusers(server, dirs):
    prompt = 'a sign that says "open"'  # quoted text: the OCR guider and the ByT5 rows

    async def body():
        async with server.client() as client:
            result = await client.images.generate(
                model="hunyuan", prompt=prompt, n=2, size="64x32",
                extra_body={"seed": 3, "num_inference_steps": 4, "guidance_scale": 5.0})
        assert len(result.data) == 2 and result.size == "64x32"
        assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
        return [pixels(d.b64_json) for d in result.data]
    served = run(body())
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(dirs["hunyuan_image"]))
    pipe.set_progress_bar_config(disable=True)
    pipe.ocr_guider = pipe.ocr_guider.new(guidance_scale=5.0)
    ref = pipe(prompt=prompt, num_images_per_prompt=2, height=32, width=64,
               num_inference_steps=4, output_type="np",
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
def test_bad_image_requests_are_400s(server, call, kwargs, param, text):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await getattr(client.images, call)(model="hunyuan", prompt="x", **kwargs)
            assert text in info.value.message, info.value.message
            if param is not None:
                assert info.value.body["param"] == param
    run(body())


def reference_png(width=64, height=40):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3),
                                                      dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


async def video_of(client, **kwargs):
    video = await client.videos.create(prompt="a fox runs in the snow", **kwargs)
    done = await client.videos.poll(video.id, poll_interval_ms=50)
    assert done.status == "completed", done.error
    frames, fps = decode_mp4((await client.videos.download_content(video.id)).read())
    assert frames.std() > 2  # not a flat video
    assert done.size == f"{frames.shape[2]}x{frames.shape[1]}"  # the size as made
    return frames, fps


def test_text_to_video_and_image_to_video(server):
    async def body():
        async with server.client() as client:
            steps = {"num_inference_steps": 2, "num_frames": 5}
            text, fps = await video_of(client, model="hunyuan_video_t2v", size="48x32",
                                       extra_body=steps)
            assert text.shape == (5, 32, 48, 3) and fps == 24
            # no size: the bucket nearest the image's aspect ratio (64x40 -> 64x48)
            first, fps = await video_of(client, model="hunyuan_video_i2v", extra_body=steps,
                                        input_reference=("first.png", reference_png()))
            assert first.shape == (5, 48, 64, 3) and fps == 24
    run(body())


@pytest.mark.parametrize("model, kwargs, param, text", [
    ("hunyuan_video_t2v", {"extra_body": {"num_frames": 6}}, "num_frames", "4k+1"),
    ("hunyuan_video_t2v", {"size": "40x40"}, "size", "multiples"),
])
def test_bad_video_requests_are_400s_naming_the_field(server, model, kwargs, param, text):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(model=model, prompt="x", **kwargs)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())


def test_image_to_video_without_an_image_is_a_400_naming_it(server):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(model="hunyuan_video_i2v", prompt="x")
            assert "input_reference" in info.value.message, info.value.message
    run(body())
