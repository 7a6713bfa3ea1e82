"""Spoken answers from a Qwen2.5-Omni directory (tiny random release-layout checkpoint)
through the unmodified openai SDK: thinker -> talker -> token2wav, three engine processes
(the preset's shape); text-only requests run the thinker alone, on those stages and on the
directory served by its own preset alike. With a greedy talker the served audio equals
transformers' composite generate for the same prompt; with the codes streamed to token2wav
(the preset's edge) each audio chunk equals transformers' Token2Wav over that chunk's codes
of the same generate, after its left context."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import openai
import pytest
import torch
from httputil import Server, ServerSettings, run, write_pipeline
from unit.omni25_reference import composite_generate

from omni.fixtures.tiny_models import ensure_tiny_model

# the preset's stages with a greedy talker and a short cap (random weights rarely stop)
PIPELINE = """\
name: omni25
default_modalities: [text]
stages:
  - {{name: thinker, engine: ar, model_dir: {d}, final_output: text,
      options: {{export_hidden_layers: auto}}}}
  - {{name: talker, engine: ar, model: qwen2_5_omni_talker, model_dir: {d},
      params: {{max_tokens: {frames}, temperature: 0, repetition_penalty: 1.0}}}}
  - {{name: token2wav, engine: generation, model: qwen2_5_omni_token2wav, model_dir: {d},
      final_output: audio, options: {{seed: {seed}}}}}
edges:
  - {{from: thinker, to: talker, delivery: stream}}
  - {{from: talker, to: token2wav, delivery: full}}
outputs: {{text: [thinker], audio: [token2wav]}}
"""
# the preset's streamed token2wav, in short chunks: 8, 16, 16, ... codes after up to 4
STREAMED = PIPELINE.replace("name: omni25", "name: omni25-stream").replace(
    "options: {{seed: {seed}}}", "options: {{seed: {seed}, first_chunk_frames: 8, "
    "chunk_growth: 2, chunk_frames: 16, left_context: 4}}").replace(
    "{{from: talker, to: token2wav, delivery: full}}",
    "{{from: talker, to: token2wav, delivery: stream}}")
FRAMES, SEED = 30, 4
PRESET = "qwen2_5_omni"  # the served directory's name
ASK = [{"role": "user", "content": "Tell me about the sea."}]
GREEDY = {"max_tokens": 4, "temperature": 0, "extra_body": {"ignore_eos": True}}
GREEDY_ONLY = {"max_tokens": 6, "temperature": 0}  # ignore_eos beside other extra_body


@pytest.fixture(scope="module")
def model_dir():
    return ensure_tiny_model("qwen2_5_omni")


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    out = tmp_path_factory.mktemp("omni25")
    paths = {name: write_pipeline(out, name, text.format(d=model_dir, frames=FRAMES, seed=SEED))
             for name, text in (("omni25", PIPELINE), ("omni25-stream", STREAMED))}
    # and the directory itself, as `omni.server --model DIR` serves it (qwen2_5_omni.yaml);
    # text only: its talker samples (temperature 0.9) up to 4096 codes, ~2000 and ~9 s of
    # audio work per answer on this fixture, and a chat request's sampling params reach
    # the text stages only, so no spoken answer of it can equal transformers' greedy one
    paths[PRESET] = model_dir
    srv = Server(paths, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def speak(fmt: str, voice: str = "Ethan", model: str = "omni25") -> dict:
    return {"model": model, "messages": ASK, "modalities": ["text", "audio"],
            "audio": {"voice": voice, "format": fmt}}


def audio_dict(audio) -> dict:
    return audio if isinstance(audio, dict) else audio.model_dump(exclude_unset=True)


def pcm16(wav: torch.Tensor) -> np.ndarray:
    return (wav.clamp(-1, 1).numpy() * 32767).round().astype("<i2")


@pytest.fixture(scope="module")
def reference(model_dir) -> dict:
    """transformers' composite generate for ASK as Ethan: the answer, its pcm16 audio, and
    what its token2wav call was given (the talker's codes and the speaker's conditioning),
    with the model."""
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok.apply_chat_template(ASK, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(model_dir),
                                                                dtype=torch.float32)
    calls = []
    hook = model.token2wav.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
    try:
        answer, wav = composite_generate(model, list(ids), words=4, frames=FRAMES,
                                         speaker="Ethan", seed=SEED)
    finally:
        hook.remove()
    (codes,), decode_kwargs = calls[0]
    return {"text": tok.decode(answer), "pcm": pcm16(wav), "model": model,
            "codes": codes, "decode_kwargs": decode_kwargs}


def test_text_only_route_runs_the_thinker(server, reference):
    """On the hand-written pipeline and on the directory's own preset alike: the answer
    transformers' generate writes, with no audio."""
    async def body():
        async with server.client(timeout=60) as client:
            for model in ("omni25", PRESET):
                reply = await client.chat.completions.create(model=model, messages=ASK,
                                                             **GREEDY)
                message = reply.choices[0].message
                assert message.content == reference["text"] and message.audio is None, model
                assert reply.usage.completion_tokens == 4
    run(body())


def test_spoken_answer_equals_transformers_and_streams_the_same(server, reference):
    text, ref = reference["text"], reference["pcm"]

    async def body():
        async with server.client(timeout=90) as client:
            reply = await client.chat.completions.create(**speak("pcm16"), **GREEDY)
            audio = reply.choices[0].message.audio
            whole = np.frombuffer(base64.b64decode(audio.data), dtype="<i2")
            # not silence, so the comparisons below can fail
            assert np.abs(whole.astype(np.int32)).max() > 1000 and len(np.unique(whole)) > 100
            assert audio.transcript == text  # the answer, spoken (content is None, as OpenAI)
            assert len(whole) == len(ref) == FRAMES * 480
            # float32 audio quantized to pcm16 on both sides: at most one step apart
            assert np.abs(whole.astype(np.int32) - ref.astype(np.int32)).max() <= 1
            stream = await client.chat.completions.create(**speak("pcm16"), stream=True,
                                                          **GREEDY)
            fields = [audio_dict(c.choices[0].delta.audio) async for c in stream
                      if c.choices and c.choices[0].delta.audio]
            pieces = [base64.b64decode(a["data"]) for a in fields if "data" in a]
            assert np.array_equal(np.frombuffer(b"".join(pieces), dtype="<i2"), whole)
            other = await client.chat.completions.create(**speak("pcm16", "chelsie"), **GREEDY)
            assert base64.b64decode(other.choices[0].message.audio.data) != whole.tobytes()
    run(body())


def test_streamed_token2wav_speaks_in_chunks_of_transformers_own_decode(server, reference):
    """The preset's shape: codes stream to token2wav, which decodes 8, then 16, ... codes
    as they come, each after up to 4 earlier ones: every chunk equals transformers'
    Token2Wav over those codes of transformers' own generate (seeded), after the context's
    samples (pcm16, within 1 LSB). Not the whole-utterance audio: no windowed form of the
    DiT is (omni/models/qwen2_5_omni_token2wav.py)."""
    codes, model = reference["codes"], reference["model"]
    expected, start, k = [], 0, 0
    while start < codes.shape[1]:
        end, ctx = min(start + min(8 * 2 ** k, 16), codes.shape[1]), max(0, start - 4)
        torch.manual_seed(SEED)
        with torch.no_grad():
            wav = model.token2wav(codes[:, ctx:end], **reference["decode_kwargs"])
        expected.append(wav.reshape(-1)[(start - ctx) * 480:])
        start, k = end, k + 1
    want = pcm16(torch.cat(expected))

    async def body() -> bytes:
        async with server.client(timeout=90) as client:
            stream = await client.chat.completions.create(
                **speak("pcm16", model="omni25-stream"), stream=True, **GREEDY)
            fields = [audio_dict(c.choices[0].delta.audio) async for c in stream
                      if c.choices and c.choices[0].delta.audio]
            return [base64.b64decode(a["data"]) for a in fields if a.get("data")]
    pieces = run(body())
    assert len(pieces) >= len(expected) >= 2  # the answer's audio came in chunks
    served = np.frombuffer(b"".join(pieces), dtype="<i2").astype(np.int32)
    assert np.abs(served).max() > 1000 and len(np.unique(served)) > 100  # not silence
    assert served.shape == want.shape
    assert np.abs(served - want.astype(np.int32)).max() <= 1
    assert not np.array_equal(served, reference["pcm"].astype(np.int32))  # chunked, not whole


def _media_question() -> list[dict]:
    """A spoken question (a 16-bit WAV at 22.05 kHz: resampled) about an image."""
    import io
    import wave

    from PIL import Image

    rate = 22050
    pcm = (0.3 * np.sin(2 * np.pi * 330 * np.arange(rate) / rate) * 32767).astype("<i2")
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    png = io.BytesIO()
    Image.fromarray((np.random.default_rng(1).random((56, 84, 3)) * 255).astype("uint8")
                    ).save(png, "PNG")
    return [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {
            "data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"}},
        {"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}},
        {"type": "text", "text": "What is it?"}]}]


def test_a_spoken_question_about_an_image_gets_a_spoken_answer(server):
    async def body():
        async with server.client(timeout=90) as client:
            reply = await client.chat.completions.create(
                model="omni25", messages=_media_question(), modalities=["text", "audio"],
                audio={"voice": "Chelsie", "format": "pcm16"}, **GREEDY)
            audio = reply.choices[0].message.audio
            # here the talker's first code is its stop code: an answer with no speech (the
            # full edge then carries only its closing output), not an error
            assert audio.transcript and base64.b64decode(audio.data) == b""
            text_only = await client.chat.completions.create(
                model="omni25", messages=[{"role": "user", "content": "What is it?"}], **GREEDY)
            # the clip and the image became encoder frames and patches, not one token each
            assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + 20
    run(body())


def test_unknown_voice_is_a_400_naming_the_voices(server):
    async def body():
        async with server.client(timeout=60) as client:
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(**speak("pcm16", "nobody"), **GREEDY)
            assert "Chelsie" in str(e.value) and "Ethan" in str(e.value)
    run(body())


def _ask_about(video: bytes) -> list[dict]:
    url = "data:video/mp4;base64," + base64.b64encode(video).decode()
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                         {"type": "text", "text": "What is this?"}]}]


def _thinker_answer(reference, model_dir, video: bytes, heard: bool) -> str:
    """transformers' thinker.generate on the processor's inputs for the video (and the
    track the API decodes, when heard), as text."""
    from transformers import AutoTokenizer
    from unit.omni25_reference import video_inputs

    from omni.media.audio import decode_audio

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    track = decode_audio(video, 16000, 600.0) if heard else None
    pads, media = video_inputs(str(model_dir), video, track)
    text = tok.apply_chat_template([{"role": "user", "content": [
        {"type": "video"}, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True, tokenize=False).replace("<|VIDEO|>", pads)
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = reference["model"].thinker.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
            do_sample=False, eos_token_id=None, **media)
    return tok.decode(out[0, ids.shape[1]:])


def test_a_video_answer_equals_transformers_seen_and_heard(server, reference, model_dir):
    from unit.omni25_reference import mp4_with_track

    videos = [mp4_with_track(1), mp4_with_track(5)]
    asks = [(v, heard) for v in videos for heard in (False, True)]

    async def body() -> list[str]:
        async with server.client(timeout=90) as client:
            replies = [await client.chat.completions.create(
                model="omni25", messages=_ask_about(v), **GREEDY_ONLY,
                extra_body={"ignore_eos": True, "use_audio_in_video": heard})
                for v, heard in asks]
            return [r.choices[0].message.content for r in replies]
    served = run(body())
    assert len(set(served)) == len(asks)  # each video, seen or heard, answers differently
    for (video, heard), answer in zip(asks, served, strict=True):
        assert answer == _thinker_answer(reference, model_dir, video, heard), heard


def test_bad_video_parts_are_400s_naming_the_part(server):
    from unit.omni25_reference import mp4_with_track
    from unit.vl_reference import mp4

    one_frame = mp4_with_track(3, seconds=1, fps=1)  # readable; fewer frames than a patch
    cases = ((b"not a video", "not a video this server can read", False),
             (one_frame, "at least 2 are needed", False),  # the engine's refusal
             (mp4(1), "use_audio_in_video", True))  # no track to hear

    async def body():
        async with server.client(timeout=60) as client:
            for data, needle, heard in cases:
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(
                        model="omni25", messages=_ask_about(data), **GREEDY_ONLY,
                        extra_body={"use_audio_in_video": heard})
                assert needle in info.value.message, info.value.message
                assert info.value.body["param"] == "messages[0].content[0]"
    run(body())


def _ask_image(image: bytes) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is this?"}]}]


def _image_answer(reference, model_dir, image: bytes) -> str:
    """transformers' thinker.generate on the release processor's pixels, as text."""
    import io

    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pixels = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))(
        images=[Image.open(io.BytesIO(image)).convert("RGB")], return_tensors="pt")
    text = tok.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True, tokenize=False)
    pads = int(pixels["image_grid_thw"].prod()) // 4  # merged 2x2 patches
    ids = tok(text.replace("<|IMAGE|>", "<|IMAGE|>" * pads), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = reference["model"].thinker.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
            do_sample=False, eos_token_id=None, **pixels)
    return tok.decode(out[0, ids.shape[1]:])


def _images() -> list[bytes]:
    """Three images the tiny fixture answers differently."""
    from unit.vl_reference import png

    return [png(56, 56, 1), png(84, 56, 2), png(56, 84, 5)]


def _media_asks() -> list[list[dict]]:
    """Three images and a video: what concurrent prompts share a tower call over."""
    from unit.omni25_reference import mp4_with_track

    return [*map(_ask_image, _images()), _ask_about(mp4_with_track(1))]


async def _answer(client, messages: list[dict]):
    reply = await client.chat.completions.create(
        model="omni25", messages=messages, **GREEDY_ONLY, extra_body={"ignore_eos": True})
    return reply.choices[0].message.content


@pytest.fixture(scope="module")
def alone(server) -> list[str]:
    """Each media prompt's answer asked alone, one after another."""
    async def body() -> list[str]:
        async with server.client(timeout=90) as client:
            return [await _answer(client, m) for m in _media_asks()]
    return run(body())


def test_concurrent_media_prompts_answer_as_alone_and_as_generate(server, reference,
                                                                  model_dir, alone):
    """Prompts asked together are encoded in shared tower calls (the engine's encoder
    batches what waits): each answer equals its prompt's answer alone and thinker.generate."""
    from unit.omni25_reference import mp4_with_track

    async def body() -> list[str]:
        async with server.client(timeout=90) as client:
            return await asyncio.gather(*(_answer(client, m) for m in _media_asks()))
    together = run(body())
    assert len(set(alone)) == len(alone)  # each image / the video answers differently
    assert together == alone
    for image, answer in zip(_images(), together, strict=False):
        assert answer == _image_answer(reference, model_dir, image)
    assert together[-1] == _thinker_answer(reference, model_dir, mp4_with_track(1), False)


def test_a_bad_image_among_concurrent_prompts_is_its_own_400(server, alone):
    from unit.vl_reference import png

    truncated = png(64, 48, 1)[:4000]  # its header passes the API: the engine refuses it

    async def body() -> list:
        async with server.client(timeout=90) as client:
            asks = [_ask_image(truncated), *_media_asks()]
            return await asyncio.gather(*(_answer(client, m) for m in asks),
                                        return_exceptions=True)
    bad, *answers = run(body())
    assert isinstance(bad, openai.BadRequestError), bad
    assert "not an image this server can read" in bad.message
    assert bad.body["param"] == "messages[0].content[0]"
    assert answers == alone
