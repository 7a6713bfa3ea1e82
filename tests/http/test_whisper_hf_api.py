"""POST /v1/audio/transcriptions through the unmodified openai SDK on a Whisper directory in
the Hugging Face layout (tiny random multilingual release-layout checkpoint, served by the
preset its config.json picks): the transcript is WhisperForConditionalGeneration.generate's
for the same clip; concurrent requests share generate() calls; bad input is a 400; a prompt longer than
the decoder holds counts with its last tokens, as OpenAI's Whisper reads it."""

from __future__ import annotations

import asyncio
import io
import wave

import numpy as np
import openai
import pytest
from httputil import Server, ServerSettings, run
from unit.test_whisper_hf import CLIPS, reference

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models.whisper import SAMPLE_RATE


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = ensure_tiny_model("whisper_hf", tmp_path_factory.getbasetemp() / "models")
    srv = Server({"whisper-hf": model_dir}, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv, str(model_dir)
    srv.stop()


def wav(clip: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((clip * 32767).astype("<i2").tobytes())
    return out.getvalue()


def test_transcripts_equal_transformers_generate(served):
    server, model_dir = served

    async def body():
        async with server.client(timeout=60) as client:
            return await asyncio.gather(*(client.audio.transcriptions.create(
                model="whisper-hf", file=(f"{rid}.wav", wav(clip), "audio/wav"))
                for rid, clip in CLIPS.items()))

    texts = [r.text for r in run(body())]
    assert len(set(texts)) == len(CLIPS)  # the fixture varies: each clip heard differently
    for text, clip in zip(texts, CLIPS.values(), strict=True):
        pcm = (clip * 32767).astype("<i2") / 32768.0
        assert text == reference(model_dir, pcm, max_new_tokens=None).strip()


def test_bad_input_is_a_400(served):
    server, _ = served

    async def body():
        async with server.client(timeout=30) as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.audio.transcriptions.create(
                    model="whisper-hf", file=("x.wav", b"not audio", "audio/wav"))
            assert info.value.body["param"] == "file"
            with pytest.raises(openai.BadRequestError) as info:
                await client.audio.transcriptions.create(
                    model="whisper-hf", file=("a.wav", wav(CLIPS["a"]), "audio/wav"),
                    language="xx")
            assert "xx" in info.value.message
    run(body())


def test_a_long_prompt_counts_with_its_last_tokens(served):
    server, _ = served
    tail = " ".join(f"w{i}" for i in range(150))  # alone, more than the decoder's half
    prompts = ("x " * 3000 + tail, "y " * 50 + tail, tail[:40])

    async def body():
        async with server.client(timeout=60) as client:
            return [(await client.audio.transcriptions.create(
                model="whisper-hf", file=("a.wav", wav(CLIPS["a"]), "audio/wav"),
                prompt=prompt)).text for prompt in prompts]

    long_one, other_head, short = run(body())
    assert long_one == other_head  # the same last tokens: the same transcript
    assert long_one != short  # the prompt is read
