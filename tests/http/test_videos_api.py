"""/v1/videos jobs and /v1/videos/sync through the unmodified openai SDK, on tiny random
Wan text-to-video and image-to-video pipelines; jobs persist across a server restart."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run, write_pipeline
from PIL import Image

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.video import decode_mp4

# the SDK marks client.videos deprecated (the Sora API's end); the calls still work
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PIPELINE = """\
name: {name}
stages:
  - name: diffusion
    engine: diffusion
    model: wan
    model_dir: {model_dir}
    final_output: video
    options: {{default_size: 32x32, default_steps: 2, max_side: 64, max_frames: 17}}
"""


def targets(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"
    pipelines = tmp_path_factory.mktemp("video-pipelines")
    return {name: write_pipeline(pipelines, name, PIPELINE.format(
        name=name, model_dir=ensure_tiny_model(fixture, cache)))
        for name, fixture in (("t2v", "wan_t2v"), ("i2v", "wan_i2v"))}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("video-data")
    settings = ServerSettings(drain_timeout_s=2.0, data_dir=str(data_dir))
    srv = Server(targets(tmp_path_factory), settings).start()
    yield srv, data_dir, settings
    srv.stop()


def png(width=48, height=32):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3),
                                                      dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


async def finished(client, video):
    return await client.videos.poll(video.id, poll_interval_ms=50)


def test_create_poll_download_list_delete(setup):
    server, _, _ = setup

    async def body():
        async with server.client() as client:
            video = await client.videos.create(model="t2v", prompt="a fox runs",
                                               seconds="1", size="32x32")
            assert video.status in ("queued", "in_progress") and video.seconds == "1"
            done = await finished(client, video)
            assert done.status == "completed" and done.progress == 100 and done.error is None
            mp4 = (await client.videos.download_content(video.id)).read()
            frames, fps = decode_mp4(mp4)
            assert frames.shape == (17, 32, 32, 3) and fps == 16  # 1 s at 16 fps -> 4k+1
            thumb = (await client.videos.download_content(video.id, variant="thumbnail"))
            assert Image.open(io.BytesIO(thumb.read())).size == (32, 32)
            listed = [v.id async for v in client.videos.list()]
            assert video.id in listed
            deleted = await client.videos.delete(video.id)
            assert deleted.deleted and deleted.id == video.id
            with pytest.raises(openai.NotFoundError):
                await client.videos.retrieve(video.id)
    run(body())


def test_image_to_video_with_input_reference(setup):
    server, _, _ = setup

    async def body():
        async with server.client() as client:
            video = await client.videos.create(
                model="i2v", prompt="it moves", input_reference=("first.png", png()),
                size="32x32", extra_body={"num_frames": 5})
            done = await finished(client, video)
            assert done.status == "completed", done.error
            frames, _ = decode_mp4((await client.videos.download_content(video.id)).read())
            assert frames.shape == (5, 32, 32, 3)
    run(body())


def test_sync_returns_the_mp4(setup):
    server, _, _ = setup

    async def body():
        async with server.session() as session:
            form = {"prompt": "a fox", "model": "t2v", "num_frames": "9", "seed": "1"}
            async with session.post("/v1/videos/sync", data=form) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.content_type == "video/mp4"
                assert resp.headers["X-Seed"] == "1"
                frames, _ = decode_mp4(await resp.read())
                assert frames.shape == (9, 32, 32, 3)
    run(body())


@pytest.mark.parametrize("kwargs, param, text", [
    ({"model": "t2v", "input_reference": ("a.png", png())}, "model", "image-to-video"),
    ({"model": "i2v"}, "model", "input_reference"),
    ({"model": "t2v", "seconds": "8"}, "seconds", "at most 17"),
    ({"model": "t2v", "size": "30x30"}, "size", "multiples"),
    ({"model": "t2v", "extra_body": {"num_frames": 8}}, "num_frames", "4k+1"),
])
def test_bad_video_requests_are_400s(setup, kwargs, param, text):
    server, _, _ = setup

    async def body():
        async with server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.create(prompt="x", **kwargs)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())


@pytest.mark.parametrize("query, param", [
    ("limit=", "limit"), ("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order")])
def test_bad_listing_queries_are_400s(setup, query, param):
    server, _, _ = setup

    async def body():
        async with server.session() as session:
            async with session.get(f"/v1/videos?{query}") as resp:
                assert resp.status == 400, await resp.text()
                assert (await resp.json())["error"]["param"] == param
    run(body())


def test_content_of_an_unfinished_job_is_a_4xx(setup):
    server, _, _ = setup

    async def body():
        async with server.client() as client:
            video = await client.videos.create(model="t2v", prompt="x", seconds="1",
                                               extra_body={"num_inference_steps": 100})
            with pytest.raises(openai.BadRequestError) as info:
                await client.videos.download_content(video.id)
            assert info.value.body["code"] == "video_not_ready"
            await client.videos.delete(video.id)  # cancels the running job
        state = await server.wait_idle("t2v", timeout_s=10)
        assert not state["requests"]
    run(body())


def test_jobs_survive_a_restart(tmp_path_factory, tmp_path):
    settings = ServerSettings(drain_timeout_s=0.5, data_dir=str(tmp_path))
    first = Server(targets(tmp_path_factory), settings).start()

    async def create_two():
        async with first.client() as client:
            done = await client.videos.create(model="t2v", prompt="x", seconds="1")
            await finished(client, done)
            running = await client.videos.create(model="t2v", prompt="x", seconds="1",
                                                 extra_body={"num_inference_steps": 100})
            return done.id, running.id
    try:
        done_id, running_id = run(create_two())
    finally:
        first.stop()
    second = Server(targets(tmp_path_factory), settings).start()
    try:
        async def check():
            async with second.client() as client:
                done = await client.videos.retrieve(done_id)
                assert done.status == "completed"
                frames, _ = decode_mp4((await client.videos.download_content(done_id)).read())
                assert len(frames) == 17
                stopped = await client.videos.retrieve(running_id)
                assert stopped.status == "failed"
                assert stopped.error.code in ("server_stopped", "server_restarted")
        run(check())
    finally:
        second.stop()
