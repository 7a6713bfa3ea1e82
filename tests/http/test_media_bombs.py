"""Media bombs at the endpoints that take uploads (omni/fixtures/media_bombs.py): a PNG
declaring 60000x60000, audio declaring hours (a WAV's data size, a FLAC's sample count),
a truncated MP4, and a real FLAC holding twenty minutes of silence in ~180 KB (which an
unbounded decoder turns into 75-150 MB of samples). Each is a 400 naming the limit,
refused by its header before anything decodes it: what the request costs the server is
measured on its own (this process's peak RSS, reset just before the request: the server
runs in it), so a decoder that materialises the bomb fails; and the server keeps serving.

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

# what refusing one bomb may cost the server: parsing the request, reading a header (about
# 1 MB here). An unbounded decode of the FLAC below holds 1200 s x 16 kHz float32 samples
# (75 MB) in pieces, then again concatenated; a decoded 60000x60000 RGB image is 10 GB
PEAK_SLACK_KB = 16 * 1024


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


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _reset_peak_kb() -> int:
    """Start this process's peak-RSS count over (Linux: "5" into /proc/self/clear_refs sets
    VmHWM to the current RSS); the RSS it starts from. The server runs in this process
    (tests/http/httputil), so the peak after a request minus this is what it cost,
    whatever ran before it."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    assert _status_kb("VmHWM") <= _status_kb("VmRSS") + 1024, "the peak did not reset"
    return _status_kb("VmRSS")


def silent_flac(seconds: float, rate: int = 24_000) -> bytes:
    """A real FLAC that holds ``seconds`` of silence and says so (a compression bomb:
    ~180 KB for twenty minutes), unlike flac_declaring's lying header."""
    from omni.media.audio import AudioEncoder

    encoder = AudioEncoder("flac", rate, streaming=False)
    minute = np.zeros(60 * rate, np.float32)
    whole, rest = divmod(int(seconds * rate), len(minute))
    data = b"".join(encoder.encode(minute) for _ in range(whole))
    return data + encoder.encode(minute[:rest]) + encoder.finish()


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
    "flac-1200s-silence": ({"type": "input_audio", "input_audio": {
        "data": base64.b64encode(silent_flac(1200)).decode(), "format": "flac"}},
        "declares 1200 s; at most 300 s"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_chat_media_bomb_is_a_400_naming_the_limit(server, name):
    part, expected = BOMBS[name]

    async def body():
        async with server.session() as http:
            start = _reset_peak_kb()
            async with http.post("/v1/chat/completions", json=_chat(part)) as resp:
                body = await resp.json()
            cost = _status_kb("VmHWM") - start
            assert cost < PEAK_SLACK_KB, (
                f"refusing {name} raised the server's peak RSS by {cost // 1024} MB (at most "
                f"{PEAK_SLACK_KB // 1024} MB): something decoded it ({body})")
            assert resp.status == 400, body
            error = body["error"]
            assert expected in error["message"], error
            assert error["param"] == "messages[0].content[1]"
            honest = {"type": "image_url", "image_url": {"url": _data_url(
                "image/png", encode_image(np.zeros((16, 16, 3), np.uint8)))}}
            async with http.post("/v1/chat/completions", json=_chat(honest)) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["finish_reason"]
            async with http.get("/health") as resp:
                assert resp.status == 200
    run(body())
