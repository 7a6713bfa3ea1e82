"""/v1/videos through the unmodified openai SDK on release directories served as they
are (the preset picked from model_index.json's _class_name): Wan 2.2 TI2V-5B and
LTX-Video, each doing text-to-video and image-to-video (input_reference) from one
release; Wan 2.2 A14B T2V and I2V (two experts), whose videos are the frames diffusers'
WanPipeline / WanImageToVideoPipeline make for the same seed."""

from __future__ import annotations

import io

import diffusers
import numpy as np
import openai
import pytest
import torch
from httputil import Server, ServerSettings, run
from PIL import Image
from unit.test_video_families import close_to, reference

from omni.api import videos
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.video import decode_mp4

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # client.videos
MODELS = ("wan22_ti2v", "ltx_video", "wan22_t2v", "wan22_i2v")
PROMPT = "a fox runs in the snow"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    return {name: ensure_tiny_model(name, cache) for name in MODELS}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    # each directory's preset as `python -m omni.server --model DIR` picks it (wan.yaml,
    # ltx_video.yaml)
    settings = ServerSettings(data_dir=str(tmp_path_factory.mktemp("video-families")))
    srv = Server(dirs, settings).start()
    yield srv
    srv.stop()


@pytest.fixture
def encoded(monkeypatch):
    """(frames, MP4 bytes) for each video the server encodes from now on: the frames as
    the pipeline made them, before H.264 (lossy: yuv420p alone moves a random-weight
    video's pixels by up to ~40 levels) could hide a difference from diffusers."""
    made = []
    encode = videos._mp4

    def tap(frames, fps, data, request_id):
        mp4 = encode(frames, fps, data, request_id)
        made.append((frames, mp4))
        return mp4
    monkeypatch.setattr(videos, "_mp4", tap)
    return made


def png(width=64, height=48):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3),
                                                      dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


async def mp4_of(client, **kwargs):
    video = await client.videos.create(prompt=PROMPT, **kwargs)
    done = await client.videos.poll(video.id, poll_interval_ms=50)
    assert done.status == "completed", done.error
    return (await client.videos.download_content(video.id)).read()


async def video_of(client, **kwargs):
    frames, fps = decode_mp4(await mp4_of(client, **kwargs))
    assert frames.std() > 2  # not a flat video
    return frames, fps


@pytest.mark.parametrize("model, size, frames, fps", [
    ("wan22_ti2v", "32x32", 5, 24),   # the release's 24 fps, frames 4k+1
    ("ltx_video", "64x64", 9, 25)])   # 25 fps, frames 8k+1
def test_text_and_image_to_video_from_one_release(server, model, size, frames, fps):
    async def body():
        async with server.client() as client:
            steps = {"num_inference_steps": 2, "num_frames": frames}
            text, got_fps = await video_of(client, model=model, size=size, extra_body=steps)
            side = int(size.split("x")[0])
            assert text.shape == (frames, side, side, 3)
            assert got_fps == fps
            first = await video_of(client, model=model, size=size, extra_body=steps,
                                   input_reference=("first.png", png()))
            assert first[0].shape == text.shape
    run(body())


@pytest.mark.parametrize("model, kwargs, param, text", [
    ("ltx_video", {"extra_body": {"num_frames": 5}}, "num_frames", "8k+1"),
    ("ltx_video", {"size": "48x48"}, "size", "multiples"),
    ("wan22_ti2v", {"size": "48x48"}, "size", "multiples"),
    ("ltx_video", {"extra_body": {"guidance_scale_2": 2}}, "guidance_scale_2", "expert"),
    ("wan22_ti2v", {"extra_body": {"guidance_scale_2": "x"}}, "guidance_scale_2", "number"),
])
def test_bad_requests_are_400s_naming_the_field(server, model, kwargs, param, text):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(model=model, prompt="x", **kwargs)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())


# -- Wan 2.2 A14B: two experts (boundary 0.875 T2V, 0.9 I2V) ------------------------------
# 4 steps: 999, 900 on the high-noise expert, 750, 500 on the low-noise one (the high-noise
# expert alone moves pixels by ~34 levels). The fixture's cond and uncond barely differ:
# guidance_scale_2 = 2 moves pixels 0.01 level, 50 (the limit) 14, so a lost one shows.
A14B = [("wan22_t2v", diffusers.WanPipeline, False, {"guidance_scale_2": 50}),
        ("wan22_i2v", diffusers.WanImageToVideoPipeline, True, {})]


@pytest.mark.parametrize("model, pipeline, with_image, extra", A14B)
def test_wan22_a14b_video_is_what_diffusers_makes(server, dirs, encoded, model, pipeline,
                                                  with_image, extra):
    image = png() if with_image else None
    kwargs = {"input_reference": ("first.png", image)} if with_image else {}

    async def body():
        async with server.client() as client:
            return await mp4_of(client, model=model, size="32x32", extra_body={
                "num_inference_steps": 4, "num_frames": 5, "seed": 3, **extra}, **kwargs)
    mp4 = run(body())
    decoded, fps = decode_mp4(mp4)
    assert decoded.shape == (5, 32, 32, 3) and fps == 16 and decoded.std() > 2
    made = [frames for frames, sent in encoded if sent == mp4]
    assert made, "the MP4 served is not one the server encoded"
    pipe = pipeline.from_pretrained(str(dirs[model]))
    assert pipe.transformer_2 is not None and pipe.config.boundary_ratio is not None
    pipe.set_progress_bar_config(disable=True)
    torch.set_num_threads(1)
    params = {"size": "32x32", "steps": 4, "seed": 3, "frames": 5, **extra}
    close_to(torch.from_numpy(made[0]), reference(pipe, {"prompt": PROMPT}, params, image))


@pytest.mark.parametrize("model, image, param, text", [
    ("wan22_t2v", png(), "model", "cannot do image to video"),
    ("wan22_i2v", None, "model", "need 'input_reference'"),
    ("wan22_i2v", b"\x89PNG not really", "input_reference", "is not an image"),
    ("wan22_i2v", b"", "input_reference", "is not an image"),
])
def test_wan22_a14b_bad_inputs_are_openai_400s(server, model, image, param, text):
    kwargs = {} if image is None else {"input_reference": ("first.png", image)}

    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(model=model, prompt="x", size="32x32", **kwargs)
            return info.value
    error = run(body())
    assert error.status_code == 400 and text in error.message, error.message
    assert error.body["type"] == "invalid_request_error" and error.body["param"] == param
    assert set(error.body) >= {"message", "type", "param", "code"}
