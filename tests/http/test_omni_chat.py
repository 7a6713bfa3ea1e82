"""Spoken answers from a Qwen3-Omni directory (tiny random release-layout checkpoint) through
the unmodified openai SDK: thinker -> talker -> code2wav, three engine processes, both
edges streaming; text-only requests run the thinker alone."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib

import av
import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run, write_pipeline

from omni.api import chat_audio
from omni.fixtures.tiny_models import ensure_tiny_model

# the preset's stages with a short talker (random weights rarely say codec_eos) and small
# audio chunks, so answers are ~1 s and arrive in several pieces
PIPELINE = """\
name: omni
default_modalities: [text]
stages:
  - {{name: thinker, engine: ar, model_dir: {d}, final_output: text,
      options: {{export_hidden_layers: auto}}}}
  - {{name: talker, engine: ar, model: qwen3_omni_talker, model_dir: {d},
      params: {{max_tokens: {frames}, temperature: 0.9, top_k: 50}}}}
  - {{name: code2wav, engine: generation, model: qwen3_omni_code2wav, model_dir: {d},
      final_output: audio, options: {{first_chunk_frames: 2, chunk_frames: 4, left_context: 4}}}}
edges:
  - {{from: thinker, to: talker, delivery: stream, max_lead: 2}}  # a lead, as in the preset
  - {{from: talker, to: code2wav, delivery: stream}}
outputs: {{text: [thinker], audio: [code2wav]}}
"""
FRAMES = 14  # talker frames per answer: 14 * 1920 - 555 samples at 24 kHz
ASK = [{"role": "user", "content": "Tell me about the sea."}]
SEEDED = {"max_tokens": 6, "temperature": 1.0, "seed": 5, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = ensure_tiny_model("qwen3_omni", tmp_path_factory.getbasetemp() / "models")
    path = write_pipeline(tmp_path_factory.mktemp("omni"), "omni",
                          PIPELINE.format(d=model_dir, frames=FRAMES))
    srv = Server({"omni": path}, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def speak(fmt: str, voice: str = "ethan") -> dict:
    return {"model": "omni", "messages": ASK, "modalities": ["text", "audio"],
            "audio": {"voice": voice, "format": fmt}}


def audio_fields(chunks) -> list[dict]:
    out = []
    for c in chunks:
        if c.choices and c.choices[0].delta.audio:
            a = c.choices[0].delta.audio
            out.append(a if isinstance(a, dict) else a.model_dump(exclude_unset=True))
    return out


def test_text_only_route_runs_the_thinker(server):
    async def body():
        async with server.client(timeout=60) as client:
            reply = await client.chat.completions.create(model="omni", messages=ASK, **SEEDED)
            assert reply.choices[0].message.content and reply.choices[0].message.audio is None
            assert reply.usage.completion_tokens == 6
    run(body())


def test_spoken_answer_non_stream_and_stream_agree(server, monkeypatch):
    # SSE audio events are bounded: a codec chunk (4 frames, 15,360 bytes) goes out as
    # several events of at most this many bytes
    monkeypatch.setattr(chat_audio, "MAX_PCM_EVENT", 6000)

    async def body():
        async with server.client(timeout=90) as client:
            reply = await client.chat.completions.create(**speak("pcm16"), **SEEDED)
            audio = reply.choices[0].message.audio
            whole = np.frombuffer(base64.b64decode(audio.data), dtype="<i2")
            assert len(whole) == FRAMES * 1920 - 555  # every frame, no seam lost
            # not silence (the fixture's vocoder is audible), so the comparisons below
            # could fail: a lost, reordered or re-seeded chunk changes the samples
            assert np.abs(whole.astype(np.int32)).max() > 1000
            assert len(np.unique(whole)) > 100
            assert reply.usage.completion_tokens_details.audio_tokens > 0
            stream = await client.chat.completions.create(
                **speak("pcm16"), stream=True, stream_options={"include_usage": True},
                **SEEDED)
            chunks = [c async for c in stream]
            fields = audio_fields(chunks)
            assert sum("id" in a for a in fields) == 1
            pieces = [base64.b64decode(a["data"]) for a in fields if "data" in a]
            assert len(pieces) >= 3  # a small first chunk, then the rest
            assert max(len(p) for p in pieces) <= 6000
            streamed = np.frombuffer(b"".join(pieces), dtype="<i2")
            assert np.array_equal(streamed, whole)  # same seed: the same speech
            transcript = "".join(a.get("transcript", "") for a in fields)
            assert transcript == audio.transcript
            wav = await client.chat.completions.create(**speak("wav"), **SEEDED)
            with av.open(io.BytesIO(base64.b64decode(wav.choices[0].message.audio.data))) as f:
                assert f.streams.audio[0].rate == 24000
    run(body())


def test_stream_helper_gets_the_final_audio(server):
    async def body():
        async with server.client(timeout=90) as client:
            text = await client.chat.completions.create(model="omni", messages=ASK, **SEEDED)
            word = text.choices[0].message.content.split()[-1]
            async with client.chat.completions.stream(**speak("pcm16"), stop=[word],
                                                      **SEEDED) as helper:
                final = await helper.get_final_completion()
            assert final.choices[0].finish_reason == "stop"
            assert final.choices[0].message.audio.id.startswith("audio_")
    run(body())


def test_one_word_answers_are_spoken(server):
    """A one-token answer: the talker may stop on its end code at once; code2wav ends the
    stream there (it used to fail on the talker's closing output, which has no codes)."""
    async def body():
        async with server.client(timeout=90) as client:
            for seed in range(3):
                reply = await client.chat.completions.create(
                    **speak("pcm16"), max_tokens=1, seed=seed)
                assert reply.choices[0].message.audio.transcript
            stream = await client.chat.completions.create(**speak("pcm16"), max_tokens=1,
                                                          stream=True)
            assert [c async for c in stream][-1].choices[0].finish_reason == "length"
            state = await server.wait_idle("omni", timeout_s=10)
            assert not state["requests"] and not any(state["outstanding"].values())
    run(body())


def test_voices_and_bad_requests(server):
    async def body():
        async with server.session() as session:
            async with session.get("/v1/audio/voices", params={"model": "omni"}) as resp:
                listed = (await resp.json())["voices"]
                assert [(v["id"], v["name"]) for v in listed] == [("ethan", "Ethan")]
            async with session.post("/v1/audio/speech", json={
                    "model": "omni", "input": "hi", "voice": "ethan"}) as resp:
                assert resp.status == 400
                assert "chat/completions" in (await resp.json())["error"]["message"]
        async with server.client(timeout=30) as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(**speak("wav", voice="nobody"), **SEEDED)
            assert info.value.body["param"] == "voice" and "Ethan" in info.value.message
            # the model card's spelling (transformers lower-cases it too) is accepted
            spoken = await client.chat.completions.create(**speak("wav", voice="Ethan"),
                                                          **SEEDED)
            assert spoken.choices[0].message.audio.data
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(**speak("wav"), stream=True, **SEEDED)
            assert info.value.body["param"] == "audio.format"
    run(body())


def test_leaving_mid_speech_frees_every_stage(server):
    async def body():
        async with server.client(timeout=60) as client:
            stream = await client.chat.completions.create(
                **speak("pcm16"), stream=True, **{**SEEDED, "max_tokens": 40})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.audio:
                    break
            await stream.close()
        state = await server.wait_idle("omni", timeout_s=15)
        assert not state["requests"] and not any(state["outstanding"].values())
    run(body())


def wav_b64(seconds: float = 1.5, rate: int = 22050) -> str:
    """A sine tone as a 16-bit WAV at another rate than the model's (it is resampled)."""
    import wave

    t = np.arange(int(rate * seconds)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def spoken_question(data: str) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "text", "text": "Answer the question."}]}]


def test_a_spoken_question_gets_a_spoken_answer(server):
    async def body():
        async with server.client(timeout=90) as client:
            question = spoken_question(wav_b64())
            reply = await client.chat.completions.create(
                model="omni", messages=question, modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "pcm16"}, **SEEDED)
            audio = reply.choices[0].message.audio
            assert audio.transcript and len(base64.b64decode(audio.data)) > 0
            # the audio became ~N encoder frames of prompt, not one token
            text_only = await client.chat.completions.create(
                model="omni", messages=[{"role": "user", "content": "Answer the question."}],
                **SEEDED)
            assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + 10
            for bad, needle in (("bm90IGF1ZGlv", "cannot be decoded"), ("%%%", "base64")):
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(
                        model="omni", messages=spoken_question(bad), **SEEDED)
                assert info.value.body["param"] == "messages[0].content[0]"
                assert needle in info.value.message
    run(body())


def png_url(width: int, height: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(width).random((height, width, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def huge_png_header() -> str:
    """A PNG whose header claims 10000 x 10000 pixels (no pixel data follows)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    head = struct.pack(">IIBBBBB", 10000, 10000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_an_image_question_gets_a_spoken_answer(server):
    async def body():
        async with server.client(timeout=90) as client:
            question = [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": png_url(96, 64)}},
                {"type": "text", "text": "What is in the picture?"}]}]
            chunks = [c async for c in await client.chat.completions.create(
                model="omni", messages=question, modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "pcm16"}, stream=True,
                stream_options={"include_usage": True}, **SEEDED)]
            pcm = b"".join(base64.b64decode(a["data"]) for a in audio_fields(chunks)
                           if a.get("data"))
            assert len(pcm) == 2 * (FRAMES * 1920 - 555)
            text_only = await client.chat.completions.create(
                model="omni", messages=[{"role": "user", "content": "What is in the picture?"}],
                **SEEDED)
            # 96 x 64 pixels = 6 x 4 patches of 16 = 6 merged 2x2 tokens, + start and end
            assert chunks[-1].usage.prompt_tokens == text_only.usage.prompt_tokens + 8
    run(body())


def test_a_video_question_gets_a_spoken_answer(server):
    from omni.media.video import encode_mp4

    frames = (np.random.default_rng(3).random((20, 48, 64, 3)) * 255).astype("uint8")
    url = "data:video/mp4;base64," + base64.b64encode(encode_mp4(frames, 10)).decode()

    async def body():
        async with server.client(timeout=90) as client:
            reply = await client.chat.completions.create(
                model="omni", modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "wav"}, messages=[{"role": "user", "content": [
                    {"type": "video_url", "video_url": {"url": url}},
                    {"type": "text", "text": "What happens?"}]}], **SEEDED)
            audio = reply.choices[0].message.audio
            assert audio.transcript and base64.b64decode(audio.data)[:4] == b"RIFF"
            # 2 s at 2 frames a second: 4 frames = 2 temporal patches of 2 x 2 merged
            # tokens (64 x 48 -> 64 x 64 pixels), + start and end
            text_only = await client.chat.completions.create(
                model="omni", messages=[{"role": "user", "content": "What happens?"}],
                **SEEDED)
            assert reply.usage.prompt_tokens == text_only.usage.prompt_tokens + 10
    run(body())


def test_a_video_is_heard_with_its_sound_when_asked(server):
    from omni.media.video import encode_mp4

    frames = (np.random.default_rng(4).random((20, 48, 64, 3)) * 255).astype("uint8")
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(48000) / 24000)
    loud = encode_mp4(frames, 10, audio=tone, audio_rate=24000)
    silent = encode_mp4(frames, 10)

    def ask(data: bytes) -> list[dict]:
        return [{"role": "user", "content": [
            {"type": "video_url", "video_url": {
                "url": "data:video/mp4;base64," + base64.b64encode(data).decode()}},
            {"type": "text", "text": "What do you hear?"}]}]

    async def body():
        async with server.client(timeout=90) as client:
            seen = await client.chat.completions.create(model="omni", messages=ask(loud),
                                                        **SEEDED)
            heard = await client.chat.completions.create(
                model="omni", messages=ask(loud),
                **{**SEEDED, "extra_body": {**SEEDED["extra_body"], "use_audio_in_video": True}})
            # the track's 2 s add its audio tokens (27 at the tiny encoder) + start and end
            assert heard.usage.prompt_tokens > seen.usage.prompt_tokens + 20
            for data, flag, needle in ((silent, True, "has no audio stream"),
                                       (loud, "yes", "must be true or false")):
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(
                        model="omni", messages=ask(data),
                        **{**SEEDED, "extra_body": {"use_audio_in_video": flag}})
                assert needle in info.value.message, info.value.message
    run(body())


def test_bad_media_parts_get_clear_errors(server):
    from omni.media.video import encode_mp4

    async def body():
        async with server.client(timeout=30) as client:
            for part, needle in (
                    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                     "not an image this server can read"),
                    ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
                     "file URLs are refused"),
                    ({"type": "image_url", "image_url": {"url": huge_png_header()}},
                     "10000x10000"),
                    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                     "not a video this server can read"),
                    ({"type": "video_url", "video_url": {"url": png_url(32, 32)}},
                     "not a video this server can read")):
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(model="omni", messages=[
                        {"role": "user", "content": [part]}], **SEEDED)
                assert needle in info.value.message, info.value.message
                assert info.value.body["param"] == "messages[0].content[0]"
            # readable, but one frame: the thinker refuses it, still a 400 naming the part;
            # an image question sent with it (its media encoded alongside) is answered
            one_frame = encode_mp4(np.zeros((1, 48, 64, 3), dtype=np.uint8), 10)
            bad, good = await asyncio.gather(client.chat.completions.create(
                model="omni", messages=[
                    {"role": "user", "content": [{"type": "text", "text": "and this?"}, {
                        "type": "video_url", "video_url": {
                            "url": "data:video/mp4;base64," + base64.b64encode(one_frame).decode()}}]}],
                **SEEDED), client.chat.completions.create(model="omni", messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {
                        "url": png_url(48, 32)}}]}], **SEEDED), return_exceptions=True)
            assert good.choices[0].message.content, good
            with pytest.raises(openai.BadRequestError) as info:
                raise bad
            assert "cannot use this input" in info.value.message
            assert "messages[0].content[1]: " in info.value.message
            assert "at least 2 are needed" in info.value.message
            assert info.value.code == "invalid_input"
            assert info.value.body["param"] == "messages[0].content[1]"
    run(body())


def test_the_thinker_makes_tool_calls_with_and_without_media(server):
    """Qwen3-Omni's thinker takes tools through the plain prompt and through its media
    encoder (an audio clip in the message): a required call is schema-valid either way."""
    import json

    import jsonschema
    zone = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
            "required": ["zone"]}
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": zone}}]
    heard = [{"role": "user", "content": [
        {"type": "text", "text": "What time is it?"},
        {"type": "input_audio", "input_audio": {"data": wav_b64(0.5), "format": "wav"}}]}]

    async def body():
        async with server.client(timeout=90) as client:
            for messages in (ASK, heard):
                reply = await client.chat.completions.create(
                    model="omni", messages=messages, tools=tools, tool_choice="required",
                    max_tokens=80, temperature=1.0, seed=3)
                choice = reply.choices[0]
                assert choice.finish_reason == "tool_calls", choice.message
                for call in choice.message.tool_calls:
                    jsonschema.validate(json.loads(call.function.arguments), zone)
    run(body())
