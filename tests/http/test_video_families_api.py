"""/v1/videos through the unmodified openai SDK on release directories served as they
are (the preset picked from model_index.json's _class_name): Wan 2.2 TI2V-5B and
LTX-Video, each doing text-to-video and image-to-video (input_reference) from one
release."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.video import decode_mp4

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # client.videos


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    targets = {name: ensure_tiny_model(name, cache) for name in ("wan22_ti2v", "ltx_video")}
    settings = ServerSettings(data_dir=str(tmp_path_factory.mktemp("video-families")))
    srv = Server(targets, settings).start()
    yield srv
    srv.stop()


def png(width=64, height=48):
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
