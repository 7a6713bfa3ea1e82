"""/v1/videos on an LTX-2 release directory served as it is (the preset picked from
model_index.json's _class_name), through the unmodified openai SDK: the MP4 carries the
model's audio track (decoded here with PyAV: present, stereo, non-silent, as long as the
video), for text to video and for image to video (input_reference, the first frame)."""

from __future__ import annotations

import io

import aiohttp
import av
import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.video import decode_mp4

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # client.videos
FRAMES, FPS = 9, 24  # 8k+1 frames at the release's 24 fps
# AAC adds its priming and a padded last packet (~0.07 s at 24 kHz); the audio VAE's
# causal decode drops ~0.05 s of the 0.375 s
DURATION_TOLERANCE_S = 0.1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = ensure_tiny_model("ltx2", tmp_path_factory.getbasetemp() / "models")
    settings = ServerSettings(data_dir=str(tmp_path_factory.mktemp("ltx2-videos")))
    srv = Server({"ltx2": model_dir}, settings).start()
    yield srv
    srv.stop()


def audio_track(mp4: bytes) -> tuple[np.ndarray, int]:
    """(float (channels, samples), rate) of the MP4's first audio stream."""
    with av.open(io.BytesIO(mp4)) as container:
        assert container.streams.audio, "the MP4 has no audio stream"
        stream = container.streams.audio[0]
        pieces = [frame.to_ndarray() for frame in container.decode(stream)]
        return np.concatenate(pieces, axis=1), stream.rate


def png(seed=0, width=64, height=48):
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


async def mp4_of(client, **kwargs):
    video = await client.videos.create(
        model="ltx2", prompt="a fox barks in the snow", size="64x64",
        extra_body={"num_inference_steps": 2, "num_frames": FRAMES, "seed": 3}, **kwargs)
    done = await client.videos.poll(video.id, poll_interval_ms=50)
    assert done.status == "completed", done.error
    assert done.size == "64x64"
    return (await client.videos.download_content(video.id)).read()


def check_audio_track(mp4):
    sound, rate = audio_track(mp4)
    assert rate == 24000 and sound.shape[0] == 2  # the vocoder's stereo at 24 kHz
    assert np.abs(sound).max() > 0.01 and sound.std() > 1e-3, "silent audio track"
    assert not np.allclose(sound[0], sound[1])  # two channels, not one copied
    assert abs(sound.shape[1] / rate - FRAMES / FPS) < DURATION_TOLERANCE_S


def test_video_comes_with_its_audio_track(server):
    async def body():
        async with server.client() as client:
            return await mp4_of(client)
    mp4 = run(body())
    frames, fps = decode_mp4(mp4)
    assert frames.shape == (FRAMES, 64, 64, 3) and fps == FPS
    assert frames.std() > 2  # not a flat video
    check_audio_track(mp4)


def test_image_to_video_with_its_audio_track(server):
    async def body():
        async with server.client() as client:
            return [await mp4_of(client, input_reference=("first.png", png(seed)))
                    for seed in (0, 1)]
    videos = run(body())
    first, other = (decode_mp4(mp4)[0].astype(float) for mp4 in videos)
    assert first.shape == (FRAMES, 64, 64, 3) and first.std() > 2
    # same prompt and seed, another first frame: another video (measured 11 levels on
    # average; the same frames would encode to the same MP4)
    assert np.abs(first - other).mean() > 3
    for mp4 in videos:
        check_audio_track(mp4)


def test_sync_mp4_has_the_audio_track_too(server):
    async def body():
        async with server.session() as session:
            form = {"model": "ltx2", "prompt": "waves", "size": "64x64", "seed": "4",
                    "num_inference_steps": "1", "num_frames": str(FRAMES)}
            # one step: the release's schedule (stretched to shift_terminal) needs two
            async with session.post("/v1/videos/sync", data=form) as resp:
                assert resp.status == 400 and "'steps'" in await resp.text()
            async with session.post("/v1/videos/sync", data={
                    **form, "num_inference_steps": "2"}) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.read()
    sound, rate = audio_track(run(body()))
    assert rate == 24000 and sound.shape[0] == 2 and np.abs(sound).max() > 0.01


@pytest.mark.parametrize("images, text", [
    ([b"\x89PNG not really"], "'input_reference' is not an image"),
    ([png(0, width=1, height=1)], "'input_reference' must be at least 2x2 pixels"),
    ([png(0), png(1)], "'input_reference': one image per video, got 2")])
def test_bad_input_references_are_400s_naming_the_field(server, images, text):
    async def body():
        async with server.session() as session:
            form = aiohttp.FormData({"model": "ltx2", "prompt": "waves", "size": "64x64",
                                     "num_inference_steps": "2", "num_frames": str(FRAMES)})
            for data in images:
                form.add_field("input_reference", data, filename="first.png",
                               content_type="image/png")
            async with session.post("/v1/videos/sync", data=form) as resp:
                assert resp.status == 400 and text in (await resp.json())["error"]["message"]
    run(body())


@pytest.mark.parametrize("kwargs, param, text", [
    ({"extra_body": {"num_frames": 5}}, "num_frames", "8k+1"),
    ({"extra_body": {"guidance_scale_2": 2}}, "guidance_scale_2", "expert"),
])
def test_bad_requests_are_400s_naming_the_field(server, kwargs, param, text):
    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(model="ltx2", prompt="x", **kwargs)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())
