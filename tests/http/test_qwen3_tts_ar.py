"""Qwen3-TTS's talker on the AR engine (omni/models/qwen3_tts_talker.py: paged KV cache,
continuous batching, the code predictor as one batched call a step) streaming codes to a
code2wav stage, served through the unmodified openai SDK and compared with qwen-tts's own
``generate_custom_voice`` run in its environment (the tiny random CustomVoice release).

Bound: greedy talker and code predictor in float32; the served pcm16 equals the reference's
float audio converted to pcm16 within 2 LSB. A request's text is one prompt (qwen-tts's
generate over the whole text), and ``max_tokens`` frames are qwen-tts's ``max_new_tokens``
minus one (its last code's frame is never completed).

Skips without the qwen3-tts environment (fails under OMNI_REQUIRE_QWEN3_TTS_ENV=1)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess

import numpy as np
import openai
import pytest
import qwen3_tts_layouts as layouts
from httputil import assert_error_object, run
from qwen3_tts_layouts import pcm16

FRAMES = 12  # qwen-tts's max_new_tokens: 11 frames a request
TEXTS = ("Hello there, how are you today?", "The ship sailed north across the cold sea.")
JOBS = [(TEXTS[0], "vivian"), (TEXTS[1], "vivian"), (TEXTS[0], "ryan"),
        (f"{TEXTS[0]} {TEXTS[1]}", "vivian")]
REFERENCE = """\
import json, sys
import numpy as np, torch
from qwen_tts import Qwen3TTSModel
model_dir, out, frames, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
tts = Qwen3TTSModel.from_pretrained(model_dir, dtype=torch.float32)
for i, (text, speaker) in enumerate(jobs):
    wavs, sr = tts.generate_custom_voice(text, speaker=speaker, do_sample=False,
                                         subtalker_dosample=False, max_new_tokens=frames)
    np.save(f"{out}/{i}.npy", wavs[0].astype(np.float32))
"""


@pytest.fixture(scope="module")
def release():
    return layouts.release_dir()


@pytest.fixture(scope="module")
def reference(release, tmp_path_factory) -> list[np.ndarray]:
    """qwen-tts's own generate, in its environment, for each of JOBS."""
    out = tmp_path_factory.mktemp("reference")
    subprocess.run([layouts.PYTHON, "-c", REFERENCE, str(release), str(out), str(FRAMES),
                    json.dumps(JOBS)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return [np.load(out / f"{i}.npy") for i in range(len(JOBS))]


@pytest.fixture(scope="module")
def server(release, start_server):
    return start_server({
        # the code predictor over its static KV cache (omni/models/predictor_kv.py)
        "qwen3-tts-ar": layouts.ar("qwen3-tts-ar", release, FRAMES,
                                   ", openai_voices: true, predictor_kv_cache: true,"
                                   # the next step launched before the frames are read
                                   # (as on a GPU: steps.py overlap, FrameCodes)
                                   " overlap_steps: true"),
        "qwen3-tts-ar-sampled": layouts.ar("qwen3-tts-ar-sampled", release, 41, greedy=False),
        "preset": str(release),  # `--model DIR`: the preset its config picks
        "voiced-ar": layouts.ar("voiced-ar", release, FRAMES, ", openai_voices: true",
                                voiced=True),
        "voiced-ar-full": layouts.ar("voiced-ar-full", release, FRAMES, ", openai_voices: true",
                                     voiced=True).replace(
            "{from: echo, to: talker, delivery: stream}",
            "{from: echo, to: talker, delivery: full}")}, start_timeout_s=300.0)


def _lsb(served: np.ndarray, expected: np.ndarray) -> int:
    assert served.shape == expected.shape
    return int(np.abs(served.astype(np.int32) - expected.astype(np.int32)).max())


async def _speak(client: openai.AsyncOpenAI, text: str, voice: str,
                 model: str = "qwen3-tts-ar", **extra: object) -> np.ndarray:
    audio = await client.audio.speech.create(model=model, voice=voice, input=text,
                                             response_format="pcm", extra_body=extra or None)
    return np.frombuffer(audio.content, dtype=np.int16)


def test_the_reference_speaks_and_varies(reference):
    for audio in reference:
        assert audio.size == (FRAMES - 1) * 1920  # random weights: no end-of-speech
        assert np.abs(pcm16(audio)).max() > 1000  # not silence as pcm16
    assert not np.array_equal(pcm16(reference[0]), pcm16(reference[1]))  # the text counts
    assert not np.array_equal(pcm16(reference[0]), pcm16(reference[2]))  # the voice counts


def test_served_speech_equals_qwen_tts_generate(server, reference):
    """All four at once (one running batch on the AR engine), each qwen-tts's alone; the
    two-sentence text is one prompt, as qwen-tts's generate takes it."""
    async def speak_all():
        async with server.client(timeout=120.0) as client:
            return await asyncio.gather(*(_speak(client, t, v) for t, v in JOBS))
    for served, expected in zip(run(speak_all()), reference, strict=True):
        assert _lsb(served, pcm16(expected)) <= 2


def test_speech_streams_in_chunks_before_it_ends(server, reference):
    """SSE: the code2wav stage decodes frames as the talker makes them (4, then 8)."""
    deltas = layouts.sse_deltas(server, "qwen3-tts-ar", TEXTS[0])
    assert len(deltas) >= 2, "the audio came whole"
    assert len(deltas[0]) == 4 * 1920 * 2  # the first chunk: 4 frames of pcm16
    assert _lsb(np.frombuffer(b"".join(deltas), dtype=np.int16), pcm16(reference[0])) <= 2


def test_a_seed_gives_the_same_audio_alone_and_beside_others(server):
    """Sampled (the release's defaults): a request's seed draws the talker's codes and
    the code predictor's from its own generators, so its audio is the same alone and in a
    batch with unseeded requests; another seed gives other audio."""
    model = "qwen3-tts-ar-sampled"

    async def body():
        async with server.client(timeout=120.0) as client:
            alone = await _speak(client, TEXTS[1], "vivian", model, seed=7)
            crowd = await asyncio.gather(
                _speak(client, TEXTS[1], "vivian", model, seed=7),
                *(_speak(client, TEXTS[0], "ryan", model) for _ in range(3)))
            other = await _speak(client, TEXTS[1], "vivian", model, seed=8)
            return alone, crowd[0], other
    alone, beside, other = run(body())
    assert np.abs(alone).max() > 1000
    # the same codes; the code2wav stage's batched decodes add float noise
    assert _lsb(beside, alone) <= 2
    assert other.shape != alone.shape or _lsb(other, alone) > 1000


@pytest.mark.parametrize("body, param", [
    ({"voice": "nobody", "input": "Hi."}, "voice"),
    ({"voice": "vivian", "input": "   "}, "input"),
    ({"voice": "vivian", "input": "Hi.", "ref_audio": "UklGRg=="}, "ref_audio"),
    ({"voice": "vivian", "input": "Hi.", "seed": -1}, "seed"),
])
def test_bad_requests_are_400s_naming_the_field(server, body, param):
    async def post():
        async with server.session() as session:
            async with session.post("/v1/audio/speech",
                                    json={"model": "qwen3-tts-ar", **body}) as resp:
                return resp.status, await resp.json()
    status, error = run(post())
    assert status == 400, error
    assert_error_object(error, param=param)


def test_a_speed_other_than_one_is_refused(server):
    async def post():
        async with server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": "qwen3-tts-ar", "voice": "vivian", "input": "Hi.",
                    "speed": 1.5}) as resp:
                return resp.status, await resp.json()
    status, error = run(post())
    assert status == 400 and "speed" in error["error"]["message"], error


def _metric(text: str, name: str, stage: str) -> float:
    lines = [line for line in text.splitlines()
             if line.startswith(name + "{") and f'stage="{stage}"' in line
             and 'pipeline="qwen3-tts-ar"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_client_leaving_mid_stream_frees_its_sequence(server, reference):
    """The client drops the stream after its first bytes: the talker's sequence and its
    KV blocks are freed, and the next request is served as before."""
    async def leave_then_speak() -> tuple[np.ndarray, float, float]:
        async with server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": "qwen3-tts-ar", "voice": "vivian", "input": TEXTS[1],
                    "response_format": "pcm", "stream_format": "audio"}) as resp:
                assert resp.status == 200
                await resp.content.readexactly(1920 * 2)
        for _ in range(100):  # the abort reaches the stages
            async with server.session() as session:
                async with session.get("/metrics") as resp:
                    text = await resp.text()
            queued = _metric(text, "omni_stage_queue_length", "talker")
            blocks = _metric(text, "omni_replica_kv_blocks_used", "talker")
            if queued == 0 and blocks == 0:
                break
            await asyncio.sleep(0.1)
        async with server.client(timeout=120.0) as client:
            return await _speak(client, TEXTS[0], "vivian"), queued, blocks
    served, queued, blocks = run(leave_then_speak())
    assert (queued, blocks) == (0, 0)
    assert _lsb(served, pcm16(reference[0])) <= 2


@pytest.mark.parametrize("model", ["voiced-ar", "voiced-ar-full"])
def test_a_text_stages_answer_is_voiced(server, model):
    """A text stage's answer spoken by the AR talker, streamed to it or delivered whole: it
    waits for the whole answer (qwen-tts's prompt holds the whole text), then speaks it as
    the speech API speaks that text."""
    async def body():
        async with server.client(timeout=120.0) as client:
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": TEXTS[0]}],
                modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
            return reply, await _speak(client, TEXTS[0], "alloy")
    reply, spoken = run(body())
    message = reply.choices[0].message
    voiced = np.frombuffer(base64.b64decode(message.audio.data), dtype=np.int16)
    assert message.audio.transcript == TEXTS[0]
    assert np.abs(spoken).max() > 1000
    assert _lsb(voiced, spoken) <= 2


def test_a_custom_voice_release_is_served_this_way_by_its_preset(server):
    """`--model DIR` on a CustomVoice release picks qwen3_tts_ar.yaml: the talker on the
    AR engine -> Code2Wav, sampled with the release's defaults (its generation_config:
    max_new_tokens 64, so 63 frames), OpenAI's voice names mapped. Seeded: sampled random
    weights sometimes pick end-of-speech early (a CI run once got 58 frames unseeded)."""
    async def body():
        async with server.session() as session:
            async with session.get("/v1/models") as resp:
                models = {m["id"]: m for m in (await resp.json())["data"]}
        async with server.client(timeout=120.0) as client:
            return models["preset"], await _speak(client, TEXTS[0], "alloy", "preset", seed=7)
    model, audio = run(body())
    assert {name: stage["engine"] for name, stage in model["stages"].items()} == {
        "talker": "ar", "code2wav": "generation"}
    assert audio.size == 63 * 1920 and np.abs(audio).max() > 1000
