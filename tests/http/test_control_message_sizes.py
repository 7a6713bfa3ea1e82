"""Request media travel through the payload plane, not inside control messages: during a
transcription (Whisper tiny.en, 10 s of speech: 320 KB of PCM), a chat with an image (tiny
Qwen3-Omni thinker, a 256 x 256 PNG) and a robot's observation (tiny π0, two 224 x 224
cameras: 301 KB), no message the orchestrator sends an engine exceeds CONTROL_BOUND; the
front end's media arena holds nothing once the requests have ended, aborted ones too.

Fails with omni/runtime/request_media.py's PUBLISH_FROM raised past the media's size (the
bytes ride inline again): the largest ADD is then the clip, the image or the frames."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import numpy as np
import pytest
from httputil import Server, ServerSettings, run, write_pipeline

from omni.api.openpi import codec
from omni.fixtures.tiny_models import ensure_tiny_model

CONTROL_BOUND = 8 * 1024  # bytes: prompts, params and refs; no media
THINKER = """\
name: thinker
stages:
  - {{name: thinker, engine: ar, model_dir: {d}, final_output: text}}
"""
ROBOT = """\
name: robot
default_modalities: [actions]
stages:
  - {{name: policy, engine: policy, model: pi0, model_dir: {d}, final_output: actions}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.getbasetemp() / "models"
    where = tmp_path_factory.mktemp("sizes")
    srv = Server({"whisper": "whisper", "piper": "piper",
                  "thinker": write_pipeline(where, "thinker", THINKER.format(
                      d=ensure_tiny_model("qwen3_omni", models))),
                  "robot": write_pipeline(where, "robot", ROBOT.format(
                      d=ensure_tiny_model("pi0", models)))},
                 ServerSettings(drain_timeout_s=2.0), start_timeout_s=180).start()
    yield srv
    srv.stop()


def largest_and_held(server, model: str, timeout_s: float = 10.0) -> tuple[int, int, int]:
    """(the largest message sent to any of its stages, requests whose media are held,
    payloads in the media arena), once nothing is held (or after ``timeout_s``: an abort's
    media are freed when its replicas have answered the ABORT, a moment after the request
    ended)."""
    orch = server.models[model].omni.orchestrator

    def look():
        return (max(orch.engines.largest_sent.values(), default=0), orch.media.held(),
                orch.media.stats().get("shm_payloads_in_use", 0))

    deadline = time.monotonic() + timeout_s
    while (seen := server.inspect(look))[1:] != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen


def png(side: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(side).random((side, side, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_a_transcription_sends_its_audio_as_a_ref(server):
    async def body():
        client = server.client(timeout=90.0)
        speech = await client.audio.speech.create(
            model="piper", voice="alloy", response_format="wav",
            input="The quick brown fox jumps over the lazy dog, and then it runs far away "
                  "into the woods, where nobody can find it again.")
        clip = speech.read()
        assert len(clip) > 5 * 22050 * 2  # over five seconds: the PCM is past the bound
        heard = await client.audio.transcriptions.create(model="whisper",
                                                         file=("s.wav", clip))
        assert "fox" in heard.text.lower()
        # a client that leaves mid-request: its media are freed after the abort too
        task = asyncio.create_task(client.audio.transcriptions.create(
            model="whisper", file=("s.wav", clip)))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.wait_idle("whisper", timeout_s=30)
    run(body())
    largest, held, payloads = largest_and_held(server, "whisper")
    assert 0 < largest <= CONTROL_BOUND, largest
    assert held == 0 and payloads == 0


def test_a_chat_with_an_image_sends_the_image_as_a_ref(server):
    async def body():
        client = server.client(timeout=90.0)
        image = png(256)
        assert len(image) > 4 * CONTROL_BOUND
        reply = await client.chat.completions.create(
            model="thinker", max_tokens=3, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "text", "text": "What is in the picture?"}]}])
        text_only = await client.chat.completions.create(
            model="thinker", max_tokens=3, messages=[
                {"role": "user", "content": "What is in the picture?"}])
        # the image's tokens reached the model
        assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens
        await server.wait_idle("thinker", timeout_s=30)
    run(body())
    largest, held, payloads = largest_and_held(server, "thinker")
    assert 0 < largest <= CONTROL_BOUND, largest
    assert held == 0 and payloads == 0


def test_a_robots_observation_sends_its_frames_as_refs(server):
    rng = np.random.default_rng(0)
    obs = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/state": rng.standard_normal(8), "prompt": "stack the cups"}

    async def body():
        async with server.session() as http:
            ws = await http.ws_connect("/openpi/robot", max_msg_size=0)
            await ws.receive(timeout=30)  # the metadata
            for _ in range(2):
                await ws.send_bytes(codec.packb(obs))
                reply = codec.unpackb((await ws.receive(timeout=60)).data)
                assert reply["actions"].shape == (50, 7)
            await ws.close()
        await server.wait_idle("robot", timeout_s=30)
    run(body())
    largest, held, payloads = largest_and_held(server, "robot")
    assert 0 < largest <= CONTROL_BOUND, largest
    assert held == 0 and payloads == 0
