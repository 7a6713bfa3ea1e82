"""/v1/audio/speech and /v1/audio/voices with the real Piper voice, through the
unmodified openai SDK (and raw HTTP where the SDK has no types, e.g. speech SSE)."""

from __future__ import annotations

import base64
import io
import json
import time

import av
import openai
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest
from httputil import ServerSettings, assert_error_object, run

VOICE = "en_US-joe-medium"
TWO = "The first sentence is here. And then a second one follows."
FIVE = ("One small step starts the walk. The road turns left at the old mill. A dog barks "
        "twice behind the fence. Rain falls on the quiet town. Then the sun comes out again.")


@pytest.fixture(scope="module")
def tts_server(start_server):
    return start_server({"piper": "piper"}, ServerSettings(drain_timeout_s=2.0,
                                                           max_speech_chars=400))


def decoded_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24_000
    container = av.open(io.BytesIO(data))
    samples, rate = 0, None
    for frame in container.decode(audio=0):
        samples, rate = samples + frame.samples, frame.sample_rate
    return samples / rate


async def _sse(server, body: dict) -> tuple[int, list[dict], float | None]:
    """(status, events, seconds to the first delta) of a speech SSE request."""
    events, first = [], None
    start = time.monotonic()
    async with server.session() as session:
        async with session.post("/v1/audio/speech", json=body) as resp:
            if resp.status != 200:
                return resp.status, [await resp.json()], None
            assert resp.content_type == "text/event-stream"
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
                    if first is None:
                        first = time.monotonic() - start
    return 200, events, first


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_decodes_to_the_audio_made(tts_server, fmt):
    async def body():
        async with tts_server.client() as client:
            raw = await client.audio.speech.with_raw_response.create(
                model="piper", voice=VOICE, input=TWO, response_format=fmt)
            data = raw.content
            made = float(raw.headers["x-audio-duration"])
            assert made > 1.0
            assert decoded_seconds(data, fmt) == pytest.approx(made, rel=0.05)
            expected_type = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                             "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
            assert raw.headers["content-type"] == expected_type[fmt]
    run(body())


def test_wav_header_states_the_exact_length(tts_server):
    async def body():
        import wave

        async with tts_server.client() as client:
            audio = await client.audio.speech.create(model="piper", voice=VOICE, input=TWO,
                                                     response_format="wav")
        with wave.open(io.BytesIO(audio.content)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
            assert w.getnframes() == (len(audio.content) - 44) // 2
    run(body())


def test_streamed_audio_arrives_in_pieces_and_decodes(tts_server):
    async def body():
        async with tts_server.client() as client:
            for fmt in ("wav", "mp3", "pcm"):
                pieces, arrivals = [], []
                start = time.monotonic()
                async with client.audio.speech.with_streaming_response.create(
                        model="piper", voice=VOICE, input=FIVE, response_format=fmt,
                        extra_body={"stream_format": "audio"}) as resp:
                    async for piece in resp.iter_bytes():
                        pieces.append(piece)
                        arrivals.append(time.monotonic() - start)
                data = b"".join(pieces)
                seconds = decoded_seconds(data, fmt)
                assert seconds > 5.0, fmt  # five sentences
                # the first sentence's audio came out well before the last one was made
                assert arrivals[0] < 0.6 * arrivals[-1], (fmt, arrivals)
                if fmt == "wav":
                    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"
    run(body())


def test_sse_deltas_and_done_with_usage(tts_server):
    async def body():
        status, events, _ = await _sse(tts_server, {
            "model": "piper", "voice": VOICE, "input": FIVE, "response_format": "pcm",
            "stream_format": "sse"})
        assert status == 200
        deltas = [e for e in events if e["type"] == "speech.audio.delta"]
        assert len(deltas) >= 5 and events[-1]["type"] == "speech.audio.done"
        usage = events[-1]["usage"]
        assert usage["input_tokens"] > 50 and usage["output_tokens"] > 100
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
        # output tokens are 256-sample frames at 22,050 Hz; pcm is resampled to 24 kHz
        frames_s = usage["output_tokens"] * 256 / 22050
        assert decoded_seconds(pcm, "pcm") == pytest.approx(frames_s, rel=0.02)
        await tts_server.wait_idle("piper")
    run(body())


def test_openai_voice_names_map_to_the_default_voice(tts_server):
    async def body():
        async with tts_server.client() as client:
            audio = await client.audio.speech.create(model="piper", voice="alloy",
                                                     input="Hello there.", response_format="wav")
            assert len(audio.content) > 44 + 2 * 22050 // 4
            audio = await client.audio.speech.create(model="piper", voice={"id": VOICE},
                                                     input="Hi.", response_format="pcm",
                                                     speed=2.0, instructions="cheerful")
            assert len(audio.content) > 1000
    run(body())


def test_voices_endpoint(tts_server):
    async def body():
        async with tts_server.session() as session:
            async with session.get("/v1/audio/voices", params={"model": "piper"}) as resp:
                assert resp.status == 200
                assert await resp.json() == {"voices": [
                    {"id": VOICE, "name": "joe", "language": "en_US", "sample_rate": 22050}]}
            async with session.get("/v1/audio/voices") as resp:
                (voice,) = (await resp.json())["voices"]
                assert voice["model"] == "piper" and voice["id"] == VOICE
            async with session.get("/v1/audio/voices", params={"model": "nope"}) as resp:
                assert resp.status == 404
                assert_error_object(await resp.json(), param="model")
    run(body())


BAD = [
    ({"input": ""}, "input", None),
    ({"input": "   "}, "input", None),
    ({"input": 5}, "input", None),
    ({"input": "x. " * 200}, "input", "string_above_max_length"),
    ({"voice": "nobody"}, "voice", None),
    ({"voice": None}, "voice", None),
    ({"response_format": "ogg"}, "response_format", None),
    ({"speed": 0.2}, "speed", None),
    ({"speed": 4.5}, "speed", None),
    ({"speed": "fast"}, "speed", None),
    ({"stream_format": "chunks"}, "stream_format", None),
    ({"instructions": 7}, "instructions", None),
    ({"instructions": "Slowly. " * 60}, "instructions", "string_above_max_length"),
    ({"model": "tts-1"}, "model", "model_not_found"),
]


@pytest.mark.parametrize("change,param,code", BAD)
def test_bad_input_is_a_400_error_object(tts_server, change, param, code):
    async def body():
        request = {"model": "piper", "voice": VOICE, "input": "Hello.", **change}
        async with tts_server.session() as session:
            async with session.post("/v1/audio/speech", json=request) as resp:
                error = assert_error_object(await resp.json(), param=param)
                assert resp.status == (404 if param == "model" else 400), error
                if code:
                    assert error["code"] == code
                if param == "voice":
                    assert VOICE in error["message"]  # lists the valid voices
    run(body())


def test_sdk_raises_on_bad_voice(tts_server):
    async def body():
        async with tts_server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.audio.speech.create(model="piper", voice="nobody", input="Hi.")
            assert info.value.param == "voice"
    run(body())


def test_disconnect_mid_stream_frees_the_request(tts_server):
    async def body():
        async with tts_server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": "piper", "voice": VOICE, "input": " ".join([FIVE] * 2),
                    "response_format": "pcm", "stream_format": "audio"}) as resp:
                assert resp.status == 200
                await resp.content.readany()  # the first sentence, then hang up
        state = await tts_server.wait_idle("piper", timeout_s=10.0)
        assert not state["requests"] and not any(state["outstanding"].values()), state
    run(body())


def _kill_engine(server, model: str) -> None:
    import os
    import signal

    (replica,) = server.models[model].omni.orchestrator.engines.replicas.values()
    os.kill(replica.process.pid, signal.SIGKILL)


async def _wait_live(server, model: str, timeout_s: float = 30.0) -> None:
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while not server.inspect(lambda: server.models[model].omni.output_info("audio")):
        assert asyncio.get_running_loop().time() < deadline, "replica did not come back"
        await asyncio.sleep(0.1)


def test_engine_death_mid_stream(tts_server):
    """After the 200: SSE gets an error event, a raw audio stream is cut (never a
    short file that looks complete); the stage restarts and serves again."""
    import aiohttp

    long_text = " ".join([FIVE] * 2)

    async def body():
        async with tts_server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": "piper", "voice": VOICE, "input": long_text,
                    "response_format": "pcm", "stream_format": "sse"}) as resp:
                first = await resp.content.readline()
                assert first.startswith(b"data: ")
                _kill_engine(tts_server, "piper")
                events = [json.loads(line[6:]) async for line in resp.content
                          if line.startswith(b"data: ")]
            assert events[-1]["type"] == "error", events[-1]
            assert events[-1]["error"]["type"] == "server_error"
            await _wait_live(tts_server, "piper")
            async with session.post("/v1/audio/speech", json={
                    "model": "piper", "voice": VOICE, "input": long_text,
                    "response_format": "pcm", "stream_format": "audio"}) as resp:
                await resp.content.readany()
                _kill_engine(tts_server, "piper")
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
            await _wait_live(tts_server, "piper")
            assert (await tts_server.wait_idle("piper", timeout_s=5.0))["requests"] == []
        async with tts_server.client() as client:
            audio = await client.audio.speech.create(model="piper", voice=VOICE, input="Back.",
                                                     response_format="pcm")
            assert len(audio.content) > 2000
    run(body())


def test_split_pipeline_over_http(start_server):
    server = start_server({"split": "piper_split"})

    async def body():
        status, events, _ = await _sse(server, {
            "model": "split", "voice": "alloy", "input": TWO, "response_format": "wav",
            "stream_format": "sse"})
        assert status == 200 and events[-1]["type"] == "speech.audio.done"
        wav = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert decoded_seconds(wav, "wav") > 1.0
        async with server.session() as session:
            async with session.get("/v1/audio/voices", params={"model": "split"}) as resp:
                assert (await resp.json())["voices"][0]["id"] == VOICE
    run(body())


def test_listener_side_numbers_reach_metrics(tts_server):
    async def body():
        async with tts_server.client() as client:
            await client.audio.speech.create(model="piper", voice="alloy",
                                             input="One sentence. And another one.",
                                             response_format="wav")
        async with tts_server.session() as session, session.get("/metrics") as resp:
            metrics = await resp.text()
        line = next(x for x in metrics.splitlines()
                    if x.startswith('omni_ttfp_seconds_count{pipeline="piper"}'))
        assert float(line.split()[-1]) >= 1
        assert 'omni_rtf_count{pipeline="piper"}' in metrics
        assert 'omni_audio_underrun_seconds_count{pipeline="piper"}' in metrics
    run(body())
