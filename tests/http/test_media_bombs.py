"""Media bombs at the endpoints that take uploads (omni/fixtures/media_bombs.py): a PNG
declaring 60000x60000, audio declaring hours (a WAV's data size, a FLAC's sample count),
a truncated MP4. Each is a 400 naming the limit, refused by its header before anything
decodes it: the server (in this process) keeps its peak memory, and keeps serving.

Chat media on the tiny Qwen3-Omni thinker (it takes image, audio and video parts)."""

from __future__ import annotations

import base64
import textwrap

import numpy as np
import pytest
from httputil import ServerSettings, run

from omni.fixtures.media_bombs import flac_declaring, png_declaring, truncated_mp4, wav_declaring
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.image import MAX_IMAGE_PIXELS, encode_image

PEAK_SLACK_KB = 300 * 1024  # generous; a decoded 60000x60000 RGB image is 10 GB


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("qwen3_omni", tmp_path_factory.getbasetemp() / "models")
    pipeline = textwrap.dedent(f"""\
        name: omni
        stages:
          - {{name: thinker, engine: ar, model_dir: {model_dir}, final_output: text,
              params: {{max_tokens: 4}}}}
        """)
    return start_server({"omni": pipeline}, ServerSettings(drain_timeout_s=2.0))


def _peak_kb() -> int:
    """This process's peak resident memory: the server runs in it (tests/http/httputil)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _chat(part: dict) -> dict:
    return {"model": "omni", "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"},
                                                       part]}]}


BOMBS = {
    "png-60000x60000": ({"type": "image_url", "image_url": {
        "url": _data_url("image/png", png_declaring(60000, 60000))}},
        f"more than {MAX_IMAGE_PIXELS} pixels"),
    "wav-2h": ({"type": "input_audio", "input_audio": {
        "data": base64.b64encode(wav_declaring(2 * 3600)).decode(), "format": "wav"}},
        "declares 7200 s; at most 300 s"),
    "flac-5h": ({"type": "input_audio", "input_audio": {
        "data": base64.b64encode(flac_declaring(5 * 3600)).decode(), "format": "flac"}},
        "declares 18000 s; at most 300 s"),
    "mp4-truncated": ({"type": "video_url", "video_url": {
        "url": _data_url("video/mp4", truncated_mp4())}}, "no video stream"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_chat_media_bomb_is_a_400_naming_the_limit(server, name):
    part, expected = BOMBS[name]

    async def body():
        async with server.session() as http:
            before = _peak_kb()
            async with http.post("/v1/chat/completions", json=_chat(part)) as resp:
                error = (await resp.json())["error"]
                assert resp.status == 400, error
            assert expected in error["message"], error
            assert error["param"] == "messages[0].content[1]"
            assert _peak_kb() - before < PEAK_SLACK_KB
            honest = {"type": "image_url", "image_url": {"url": _data_url(
                "image/png", encode_image(np.zeros((16, 16, 3), np.uint8)))}}
            async with http.post("/v1/chat/completions", json=_chat(honest)) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["finish_reason"]
            async with http.get("/health") as resp:
                assert resp.status == 200
    run(body())
