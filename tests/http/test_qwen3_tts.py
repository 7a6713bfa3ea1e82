"""Qwen3-TTS served from its own environment (qwen-tts pins transformers 4.57.3): a tiny
random CustomVoice release built with qwen-tts's own classes, served by the qwen3_tts
adapter (omni/models/qwen3_tts.py) through the unmodified openai SDK, plain and streamed,
and compared with qwen-tts's own ``generate_custom_voice`` run in that environment.

Bound: greedy decoding (talker and code predictor, the stage's options) in float32; the
served pcm16 equals the reference's float audio, converted to pcm16, within 2 LSB (the
rounding of the conversion plus float noise of batched, left-padded rows).

Without the qwen3-tts environment (bash scripts/install_qwen3_tts_env.sh) it skips,
saying so; with OMNI_REQUIRE_QWEN3_TTS_ENV=1 (.ci/run, which builds it) it fails."""

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

PYTHON = layouts.PYTHON
FRAMES = 12  # max_new_tokens: codec frames per sentence (1920 samples each)
OPENAI_VOICES = ", openai_voices: true"
TEXTS = ("Hello there, how are you today?", "The ship sailed north across the cold sea.")
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
# continuous batching in the stage's engine: request 0 (jobs[1]) starts; once its first
# chunk is out, request 1 (jobs[2]) joins its running call; each one's audio and the step
# of each output are kept
from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.models.qwen3_tts import Qwen3TTSRunner
from omni.models.qwen3_tts_predictor import GraphedPredictor
def run_engine(runner, tag):
    engine, audio, steps = GenerationEngine(runner, {}), {"0": [], "1": []}, {"0": [], "1": []}
    engine.add(EngineRequest("0", {"text": jobs[1][0]}, {"voice": jobs[1][1]}))
    for step in range(1000):
        if not engine.has_work():
            break
        for o in engine.step():
            assert o.error is None, o.error
            if o.data.get("samples"):
                audio[o.request_id].append(o.data["audio"].numpy())
                steps[o.request_id].append(step)
        if steps["0"] and step == steps["0"][0]:
            engine.add(EngineRequest("1", {"text": jobs[2][0]}, {"voice": jobs[2][1]}))
    for rid in audio:
        np.save(f"{out}/{tag}{rid}.npy", np.concatenate(audio[rid]))
    open(f"{out}/{tag}-steps.json", "w").write(json.dumps(steps))
greedy = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": frames}
runner = Qwen3TTSRunner(tts, "cpu", greedy)
run_engine(runner, "engine")
# the code predictor as on a GPU (its graphs' static buffers and loop, run eagerly here)
runner.graphed = GraphedPredictor.of(tts.model, runner._merged_sampling(), 8, capture=False)
run_engine(runner, "graphed")
# chunk_frames 0 (whole sentences), sampled: a seeded sentence alone, then beside an
# unseeded one and other seeds, the global RNG seeded differently each time
whole = Qwen3TTSRunner(tts, "cpu", {"do_sample": True, "subtalker_dosample": True,
                                    "max_new_tokens": frames, "chunk_frames": 0})
text, seeded = jobs[0][0], {"voice": "vivian", "seed": 7}
torch.manual_seed(1)
np.save(f"{out}/seeded-alone.npy", whole.run_items([text], [seeded])[0][0].numpy())
torch.manual_seed(7)  # qwen-tts's generate after torch.manual_seed(seed): run_items unseeded
np.save(f"{out}/seeded-qwen-tts.npy", whole.run_items([text], [{"voice": "vivian"}])[0][0].numpy())
torch.manual_seed(2)
batch = whole.run_items([jobs[1][0], text, text, text], [
    {"voice": "ryan", "seed": 8}, {"voice": "vivian"}, seeded, {**seeded, "seed": 9}])
for i, (wav, _) in enumerate(batch):
    np.save(f"{out}/seeded-batch{i}.npy", wav.numpy())
"""
JOBS = [(TEXTS[0], "vivian"), (TEXTS[1], "vivian"), (TEXTS[0], "ryan")]


@pytest.fixture(scope="module")
def release():
    return layouts.release_dir()


@pytest.fixture(scope="module")
def reference(release, reference_dir) -> list[np.ndarray]:
    """qwen-tts's own generate, in its environment, for each of JOBS."""
    return [np.load(reference_dir / f"{i}.npy") for i in range(len(JOBS))]


@pytest.fixture(scope="module")
def reference_dir(release, tmp_path_factory):
    """The reference script's output: qwen-tts's audio, the engine's continuous batch."""
    out = tmp_path_factory.mktemp("reference")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([PYTHON, "-c", REFERENCE, str(release), str(out), str(FRAMES),
                    json.dumps(JOBS)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root})
    return out


@pytest.fixture(scope="module")
def server(release, start_server):
    return start_server({
        "qwen3-tts": layouts.fused("qwen3-tts", release, FRAMES, OPENAI_VOICES),
        "qwen3-tts-split": layouts.split("qwen3-tts-split", release, FRAMES, OPENAI_VOICES),
        "voiced": layouts.fused("voiced", release, FRAMES, OPENAI_VOICES, voiced=True),
        "voiced-split": layouts.split("voiced-split", release, FRAMES, OPENAI_VOICES,
                                      voiced=True)}, start_timeout_s=300.0)


async def _speak(client: openai.AsyncOpenAI, text: str, voice: str,
                 model: str = "qwen3-tts", **extra: object) -> np.ndarray:
    audio = await client.audio.speech.create(model=model, voice=voice, input=text,
                                             response_format="pcm", extra_body=extra or None)
    return np.frombuffer(audio.content, dtype=np.int16)


def test_the_fixture_speaks_and_varies(reference):
    for audio in reference:
        assert audio.size == FRAMES * 1920 or audio.size % 1920 == 0
        assert np.abs(pcm16(audio)).max() > 1000  # not silence as pcm16
    # the text and the voice change the audio
    assert not np.array_equal(pcm16(reference[0]), pcm16(reference[1]))
    assert not np.array_equal(pcm16(reference[0]), pcm16(reference[2]))


def test_a_request_joins_a_running_sentence(reference_dir, reference):
    """The stage's engine: a request that arrives once another's sentence has streamed its
    first chunk joins that running call (its first audio comes before the other sentence
    ends, not after), and both sentences equal qwen-tts's generate for each alone."""
    steps = json.loads((reference_dir / "engine-steps.json").read_text())
    assert steps["1"][0] < steps["0"][-1], steps  # joined, did not wait for the call's end
    for rid, job in (("0", 1), ("1", 2)):
        served = pcm16(np.load(reference_dir / f"engine{rid}.npy")).astype(np.int32)
        expected = pcm16(reference[job]).astype(np.int32)
        assert served.shape == expected.shape
        assert np.abs(served - expected).max() <= 2


def test_the_graphed_code_predictor_speaks_as_qwen_tts(reference_dir, reference):
    """The code predictor a GPU stage runs as CUDA graphs (omni/models/qwen3_tts_predictor.py:
    no KV cache, static buffers, the codes picked inside the loop), run eagerly here, in
    the same continuous batch: greedy, both sentences equal qwen-tts's generate alone."""
    steps = json.loads((reference_dir / "graphed-steps.json").read_text())
    assert steps["1"][0] < steps["0"][-1], steps
    for rid, job in (("0", 1), ("1", 2)):
        served = pcm16(np.load(reference_dir / f"graphed{rid}.npy")).astype(np.int32)
        expected = pcm16(reference[job]).astype(np.int32)
        assert served.shape == expected.shape
        assert np.abs(served - expected).max() <= 2


def test_a_seeded_whole_sentence_is_the_same_alone_and_in_a_batch(reference_dir):
    """chunk_frames 0 (whole sentences), sampled: a request's seed gives its sentence the
    same audio alone and in a batch beside an unseeded sentence and other seeds (its own
    generator, not the global RNG's draws for the batch), qwen-tts's for it alone after
    torch.manual_seed(seed); another seed, other audio."""
    alone = pcm16(np.load(reference_dir / "seeded-alone.npy")).astype(np.int32)
    batch = [pcm16(np.load(reference_dir / f"seeded-batch{i}.npy")).astype(np.int32)
             for i in range(4)]
    assert np.abs(alone).max() > 1000  # not silence as pcm16
    # its sentence is qwen-tts's generate alone after torch.manual_seed(seed), as streamed
    expected = pcm16(np.load(reference_dir / "seeded-qwen-tts.npy")).astype(np.int32)
    assert alone.shape == expected.shape and np.abs(alone - expected).max() <= 2
    assert batch[2].shape == alone.shape
    assert np.abs(batch[2] - alone).max() <= 2
    other_seed = batch[3]
    assert other_seed.shape != alone.shape or np.abs(other_seed - alone).max() > 1000


def test_served_speech_equals_qwen_tts_generate(server, reference):
    async def speak_all():
        async with server.client(timeout=120.0) as client:
            # concurrent: the three share batched generate calls where they meet; a seed
            # (the API's extension) reaches the stage and changes nothing when greedy
            return await asyncio.gather(*(_speak(client, t, v, seed=i)
                                          for i, (t, v) in enumerate(JOBS)))
    for served, expected in zip(run(speak_all()), reference, strict=True):
        expected = pcm16(expected)
        assert served.shape == expected.shape
        diff = np.abs(served.astype(np.int32) - expected.astype(np.int32)).max()
        assert diff <= 2, f"served audio differs from qwen-tts's by {diff} LSB"


def test_streamed_speech_is_the_same_audio(server, reference):
    async def stream() -> tuple[bytes, int]:
        async with server.client(timeout=120.0) as client:
            chunks = 0
            data = b""
            async with client.audio.speech.with_streaming_response.create(
                    model="qwen3-tts", voice="vivian", input=f"{TEXTS[0]} {TEXTS[1]}",
                    response_format="pcm", extra_body={"stream_format": "audio"}) as resp:
                async for chunk in resp.iter_bytes():
                    data += chunk
                    chunks += 1
            return data, chunks
    data, _ = run(stream())
    served = np.frombuffer(data, dtype=np.int16).astype(np.int32)
    expected = np.concatenate([pcm16(reference[0]), pcm16(reference[1])]).astype(np.int32)
    assert served.shape == expected.shape  # one sentence after the other
    assert np.abs(served - expected).max() <= 2


@pytest.mark.parametrize("model", ["qwen3-tts", "qwen3-tts-split"])
def test_voices_are_the_releases_speakers(server, model):
    # split layout: the code2wav stage gives the audio, the talker stage the voices
    async def voices():
        async with server.session() as session:
            async with session.get("/v1/audio/voices", params={"model": model}) as r:
                return r.status, await r.json()
    status, body = run(voices())
    assert status == 200
    assert [v["id"] for v in body["voices"]] == ["aiden", "ryan", "vivian"]
    assert {v["sample_rate"] for v in body["voices"]} == {24000}


@pytest.mark.parametrize("body, param", [
    ({"voice": "nobody", "input": "Hi."}, "voice"),
    ({"voice": "vivian", "input": ""}, "input"),
    ({"voice": "vivian", "input": "   "}, "input"),
    ({"input": "Hi."}, "voice"),
    # a CustomVoice release speaks its own voices (Base clones: test_qwen3_tts_clone.py)
    ({"voice": "vivian", "input": "Hi.", "ref_audio": "UklGRg=="}, "ref_audio"),
    ({"voice": "vivian", "input": "Hi.", "seed": -1}, "seed"),
    ({"voice": "vivian", "input": "Hi.", "seed": "7"}, "seed"),
])
def test_bad_requests_are_400s_naming_the_field(server, body, param):
    async def post():
        async with server.session() as session:
            async with session.post("/v1/audio/speech",
                                    json={"model": "qwen3-tts", **body}) as resp:
                return resp.status, await resp.json()
    status, error = run(post())
    assert status == 400, error
    assert_error_object(error, param=param)


def test_a_sentence_streams_in_chunks_before_it_ends(server, reference):
    """One sentence, SSE: its audio comes in several deltas (the stage decodes frames as
    the talker makes them: 4, then 8), which together are qwen-tts's audio."""
    deltas = layouts.sse_deltas(server, "qwen3-tts", TEXTS[0])
    assert len(deltas) >= 2, "the sentence's audio came whole"
    assert len(deltas[0]) == 4 * 1920 * 2  # the first chunk: 4 frames of pcm16
    served = np.frombuffer(b"".join(deltas), dtype=np.int16).astype(np.int32)
    expected = pcm16(reference[0]).astype(np.int32)
    assert served.shape == expected.shape
    assert np.abs(served - expected).max() <= 2


def test_the_split_layout_speaks_as_qwen_tts(server, reference):
    """talker stage -> codes over the connector -> code2wav stage (chunks of 4, then 8
    frames, 25 of left context): each sentence equals qwen-tts's generate_custom_voice."""
    async def speak_all():
        async with server.client(timeout=120.0) as client:
            return await asyncio.gather(*(_speak(client, t, v, "qwen3-tts-split")
                                          for t, v in JOBS))
    for served, expected in zip(run(speak_all()), reference, strict=True):
        expected = pcm16(expected)
        assert served.shape == expected.shape
        diff = np.abs(served.astype(np.int32) - expected.astype(np.int32)).max()
        assert diff <= 2, f"split-layout audio differs from qwen-tts's by {diff} LSB"


def test_the_split_layout_joins_sentences(server, reference):
    """Two sentences: the code2wav stage decodes one stream of codes, so the second
    sentence's first frames have the first one's last frames as left context (the fused
    layout decodes each alone): lengths add up, the first sentence is qwen-tts's."""
    async def speak():
        async with server.client(timeout=120.0) as client:
            return await _speak(client, f"{TEXTS[0]} {TEXTS[1]}", "vivian", "qwen3-tts-split")
    served = run(speak()).astype(np.int32)
    first, second = pcm16(reference[0]), pcm16(reference[1])
    assert served.size == first.size + second.size
    assert np.abs(served[:first.size] - first).max() <= 2


def test_a_client_leaving_mid_sentence_leaves_the_stage_serving(server, reference):
    """The client drops the stream after the first chunk of a sentence: its request is
    aborted in the running streamed call, and the next request is served as before."""
    async def leave_then_speak() -> np.ndarray:
        async with server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": "qwen3-tts", "voice": "vivian", "input": TEXTS[1],
                    "response_format": "pcm", "stream_format": "audio"}) as resp:
                assert resp.status == 200
                await resp.content.readexactly(1920 * 2)  # part of the first chunk
        async with server.client(timeout=120.0) as client:
            return await _speak(client, TEXTS[0], "vivian")
    served = run(leave_then_speak()).astype(np.int32)
    expected = pcm16(reference[0]).astype(np.int32)
    assert served.shape == expected.shape
    assert np.abs(served - expected).max() <= 2


@pytest.mark.parametrize("model", ["voiced", "voiced-split"])
def test_a_text_stage_answer_is_voiced_to_its_end(server, model):
    """A text stage's streamed answer spoken by Qwen3-TTS (fused and split): the answer's
    stream ends right after its last sentence, and the stage closes the request (it used
    to crash its replica unpacking that closing output); the voice is the speech API's."""
    text = "Hello there."

    async def body():
        async with server.client(timeout=120.0) as client:
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": text}],
                modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
            spoken = await _speak(client, text, "alloy")
            return reply, spoken
    reply, spoken = run(body())
    message = reply.choices[0].message
    voiced = np.frombuffer(base64.b64decode(message.audio.data), dtype=np.int16)
    assert message.audio.transcript == text
    assert np.abs(spoken).max() > 1000 and voiced.shape == spoken.shape
    assert np.abs(voiced.astype(np.int32) - spoken.astype(np.int32)).max() <= 2
