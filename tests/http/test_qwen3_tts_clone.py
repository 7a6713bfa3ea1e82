"""Qwen3-TTS Base (voice clone) served from its own environment: a tiny random Base release
(speaker encoder, Mimi encoder in speech_tokenizer/) built with qwen-tts's own classes,
served with the reference voice in the request (``ref_audio``, ``ref_text``) through the
unmodified openai SDK, and compared with qwen-tts's own ``generate_voice_clone`` given the
same clip as a data: URL, in its environment. The prompt cache (omni/models/
qwen3_tts_clone.py) is checked there too, against ``create_voice_clone_prompt``. The
split layout (talker stage -> codes -> code2wav stage) serves the same clones.

Bound: greedy decoding in float32; served pcm16 within 2 LSB of the reference's float
audio converted to pcm16 (conversion rounding plus float noise of batched, left-padded
rows), as tests/http/test_qwen3_tts.py.

Without the qwen3-tts environment it skips (OMNI_REQUIRE_QWEN3_TTS_ENV=1: fails)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import subprocess
import wave
from typing import Any

import numpy as np
import openai
import pytest
import qwen3_tts_layouts as layouts
from httputil import assert_error_object, run
from qwen3_tts_layouts import pcm16

PYTHON = layouts.PYTHON
FRAMES = 12  # max_new_tokens: codec frames per sentence
TEXT = "The ship sailed north across the cold sea."
REF_TEXT = "Hello, this is my voice."
# (reference clip index, its transcript or None: the speaker embedding alone)
JOBS = [(0, REF_TEXT), (1, REF_TEXT), (0, None)]
REFERENCE = """\
import json, sys
import numpy as np, torch
from qwen_tts import Qwen3TTSModel
from omni.models.qwen3_tts_clone import VoiceClones
model_dir, out, frames, text = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
refs, jobs = json.loads(open(f"{out}/refs.json").read()), json.loads(sys.argv[5])
tts = Qwen3TTSModel.from_pretrained(model_dir, dtype=torch.float32)
for i, (ref, ref_text) in enumerate(jobs):
    wavs, sr = tts.generate_voice_clone(text, ref_audio=refs[ref], ref_text=ref_text,
                                        x_vector_only_mode=ref_text is None, do_sample=False,
                                        subtalker_dosample=False, max_new_tokens=frames)
    np.save(f"{out}/{i}.npy", wavs[0].astype(np.float32))
# the prompt cache: built once per distinct reference, least recently used out beyond 2
clones, built = VoiceClones(tts, capacity=2), []
clips = [(np.frombuffer(open(f"{out}/ref{r}.f32", "rb").read(), np.float32), t)
         for r, t in ((0, "a"), (0, "a"), (1, "a"), (0, None), (1, "a"), (0, "a"))]
for samples, t in clips:
    item = clones.prompt({"ref_audio": {"pcm_f32le": samples.tobytes(), "sample_rate": 24000},
                          "ref_text": t})
    built.append(clones.built)
own = tts.create_voice_clone_prompt(ref_audio=(clips[0][0], 24000), ref_text="a")[0]
item = clones.prompt({"ref_audio": {"pcm_f32le": clips[0][0].tobytes(), "sample_rate": 24000},
                      "ref_text": "a"})
same = bool(torch.equal(own.ref_code, item.ref_code)
            and torch.equal(own.ref_spk_embedding, item.ref_spk_embedding))
open(f"{out}/cache.json", "w").write(json.dumps({"built": built, "same": same}))
# the stage's runner: its streamed call (many small chunks), the third sentence joining
# it after 3 steps, against each sentence alone in qwen-tts's generate (whole), greedy and
# sampled with one seed per request
from omni.models.qwen3_tts import Qwen3TTSRunner
texts = [text, "Hi.", text + " And then some more words to say."]
params = [{"ref_audio": {"pcm_f32le": clips[i][0].tobytes(), "sample_rate": 24000},
           "ref_text": t, "seed": seed} for i, t, seed in ((0, "a", 7), (2, "a", 8), (3, None, 9))]
for mode, sampled in (("greedy", False), ("sampled", True)):
    runner = Qwen3TTSRunner(tts, "cpu", {"do_sample": sampled, "subtalker_dosample": sampled,
                                         "max_new_tokens": 2 * frames, "first_chunk_frames": 2,
                                         "chunk_frames": 3})
    whole = []
    for t, p in zip(texts, params):
        # qwen-tts's generate after torch.manual_seed: run_items without the seed (with one
        # it runs our step loop, as streamed)
        torch.manual_seed(p["seed"])
        whole.append(runner.run_items([t], [{**p, "seed": None}])[0][0].numpy())
    torch.manual_seed(0)  # the global RNG differs: seeded rows draw from their own
    job, pieces, joined = runner.start_items(texts[:2], params[:2]), [[] for _ in texts], 0
    for step in range(1000):
        if job.done:
            break
        if step == 3:
            runner.join_items(job, texts[2:], params[2:])
            joined = len(job.talker.rows)  # it joined a running batch
        for i, (piece, _) in runner.advance(job).items():
            if piece is not None:
                pieces[i].append(piece[0].numpy())
    for i in range(len(texts)):
        np.save(f"{out}/{mode}-whole{i}.npy", whole[i])
        np.save(f"{out}/{mode}-streamed{i}.npy", np.concatenate(pieces[i]))
        json.dump([len(p) for p in pieces[i]], open(f"{out}/{mode}-chunks{i}.json", "w"))
    json.dump(joined, open(f"{out}/{mode}-joined.json", "w"))
"""


def reference_wav(freq: float, seconds: float = 2.0, seed: int = 0) -> bytes:
    """A 24 kHz pcm16 WAV: a tone in noise (distinct clips encode to distinct codes)."""
    t = np.arange(int(24000 * seconds)) / 24000
    noise = np.random.default_rng(seed).standard_normal(t.size)
    pcm = np.round((0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * noise) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


REFS = [reference_wav(220.0), reference_wav(440.0, seed=1)]


def data_url(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


@pytest.fixture(scope="module")
def release():
    return layouts.release_dir("base")


@pytest.fixture(scope="module")
def reference(release, tmp_path_factory) -> tuple[list[np.ndarray], dict, Any]:
    """qwen-tts's own generate_voice_clone for each of JOBS, the cache's record, and the
    directory with the runner's streamed and whole sentences."""
    out = tmp_path_factory.mktemp("clone-reference")
    (out / "refs.json").write_text(json.dumps([data_url(w) for w in REFS]))
    for i, wav in enumerate(REFS):  # the samples as the server decodes them (pcm16 / 32768)
        pcm = np.frombuffer(wav[44:], dtype="<i2").astype(np.float32) / 32768.0
        (out / f"ref{i}.f32").write_bytes(pcm.tobytes())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([PYTHON, "-c", REFERENCE, str(release), str(out), str(FRAMES), TEXT,
                    json.dumps(JOBS)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root})
    cache = json.loads((out / "cache.json").read_text())
    return [np.load(out / f"{i}.npy") for i in range(len(JOBS))], cache, out


@pytest.fixture(scope="module")
def server(release, start_server):
    return start_server({"qwen3-tts-base": layouts.fused("qwen3-tts-base", release, FRAMES,
                                                         ", clone_cache_size: 2"),
                         "qwen3-tts-base-split": layouts.split("qwen3-tts-base-split", release,
                                                               FRAMES),
                         "qwen3-tts-base-ar": layouts.ar("qwen3-tts-base-ar", release, FRAMES)},
                        start_timeout_s=300.0)


async def _clone(client: openai.AsyncOpenAI, ref: int, ref_text: str | None,
                 model: str = "qwen3-tts-base", text: str = TEXT) -> np.ndarray:
    # one clip as plain base64, the other as a data: URL: both forms are accepted
    ref_audio = base64.b64encode(REFS[ref]).decode() if ref else data_url(REFS[ref])
    extra = {"ref_audio": ref_audio, **({"ref_text": ref_text} if ref_text else {})}
    audio = await client.audio.speech.create(model=model, voice="alloy", input=text,
                                             response_format="pcm", extra_body=extra)
    return np.frombuffer(audio.content, dtype=np.int16)


def test_the_fixture_clones_distinct_voices(reference):
    audio = reference[0]
    for a in audio:
        assert np.abs(pcm16(a)).max() > 1000  # not silence as pcm16
    # the clip and the transcript (in-context vs embedding only) change the audio
    assert not np.array_equal(pcm16(audio[0]), pcm16(audio[1]))
    assert not np.array_equal(pcm16(audio[0]), pcm16(audio[2]))


def test_the_prompt_cache_builds_once_per_reference(reference):
    cache = reference[1]
    # A, A (hit), B, A without text (a distinct reference; A out), B (hit), A (rebuilt)
    assert cache["built"] == [1, 1, 2, 3, 3, 4]
    assert cache["same"]  # a cached prompt is create_voice_clone_prompt's own


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_streamed_sentences_equal_whole_ones(reference, mode):
    """The runner's own decode loop (audio in chunks of 2, then 3 frames) against qwen-tts's
    generate_voice_clone for each sentence alone, greedy and sampled with the request's
    seed: in-context and embedding-only rows; the third joins the running batch after 3
    steps (continuous batching), rows end at different steps and leave it."""
    out = reference[2]
    assert json.loads((out / f"{mode}-joined.json").read_text()) == 3  # 2 running + 1 joining
    for i in range(3):
        whole, streamed = (np.load(out / f"{mode}-{kind}{i}.npy") for kind in ("whole", "streamed"))
        chunks = json.loads((out / f"{mode}-chunks{i}.json").read_text())
        assert np.abs(pcm16(whole)).max() > 1000
        assert len(chunks) >= 2 or whole.size <= 2 * 1920  # streamed, unless 2 frames long
        assert streamed.shape == whole.shape
        assert np.abs(streamed - whole).max() < 1e-4


@pytest.mark.parametrize("model", ["qwen3-tts-base", "qwen3-tts-base-split",
                                   "qwen3-tts-base-ar"])
def test_served_clones_equal_qwen_tts_generate_voice_clone(server, reference, model):
    """Each clone, batched, equals qwen-tts's generate_voice_clone, in-context and
    embedding-only, in every layout: the one stage; talker stage -> codes (an in-context
    clone's reference codes first) -> code2wav stage; and the talker on the AR engine
    (omni/models/qwen3_tts_talker.py), its first frame carrying the reference codes that
    code2wav decodes as left context."""
    async def speak_all():
        async with server.client(timeout=120.0) as client:
            return await asyncio.gather(*(_clone(client, r, t, model) for r, t in JOBS))
    for served, expected in zip(run(speak_all()), reference[0], strict=True):
        expected = pcm16(expected)
        assert served.shape == expected.shape
        diff = np.abs(served.astype(np.int32) - expected.astype(np.int32)).max()
        assert diff <= 2, f"{model}'s clone differs from qwen-tts's by {diff} LSB"


def test_the_split_layout_decodes_each_sentence_after_the_reference(server):
    """Two sentences of an in-context clone: the code2wav stage decodes the second one's
    first frames after the reference's codes (not the first sentence's last frames), so the
    split layout's audio equals the fused layout's, where each sentence is decoded alone."""
    text = f"{TEXT} Then it came home again."

    async def both():
        async with server.client(timeout=120.0) as client:
            return await asyncio.gather(*(_clone(client, 1, REF_TEXT, model, text) for model in
                                          ("qwen3-tts-base", "qwen3-tts-base-split")))
    fused, split = (a.astype(np.int32) for a in run(both()))
    assert np.abs(fused).max() > 1000  # not silence
    assert split.shape == fused.shape
    assert np.abs(split - fused).max() <= 2


def _wav_b64(seconds: float) -> str:
    return base64.b64encode(reference_wav(330.0, seconds)).decode()


BAD_REFERENCES = [
    ({}, "ref_audio"),                                           # the reference is required
    ({"ref_text": REF_TEXT}, "ref_audio"),
    ({"ref_audio": "not base64 at all!"}, "ref_audio"),
    ({"ref_audio": base64.b64encode(b"RIFF junk").decode()}, "ref_audio"),  # undecodable
    ({"ref_audio": "data:audio/wav;base64,@@@"}, "ref_audio"),
    ({"ref_audio": "ftp://example.com/a.wav"}, "ref_audio"),
    ({"ref_audio": 5}, "ref_audio"),
    ({"ref_audio": "__long__"}, "ref_audio"),                    # over max_seconds (30 s)
    ({"ref_audio": "__short__"}, "ref_audio"),                   # under min_seconds
    ({"ref_audio": "__ok__", "ref_text": ""}, "ref_text"),
    ({"ref_audio": "__ok__", "ref_text": 3}, "ref_text"),
]
# the split and AR layouts' limits come from their talker stage: a few cases suffice there
CASES = [(*case, "qwen3-tts-base") for case in BAD_REFERENCES] + [
    (*BAD_REFERENCES[i], model) for i in (0, 3, 7, 9)
    for model in ("qwen3-tts-base-split", "qwen3-tts-base-ar")]


@pytest.mark.parametrize("extra, param, model", CASES)
def test_bad_references_are_400s_naming_the_field(server, extra, param, model):
    clips = {"__long__": _wav_b64(31.0), "__short__": _wav_b64(0.1), "__ok__": _wav_b64(1.0)}
    if extra.get("ref_audio") in clips:
        extra = {**extra, "ref_audio": clips[extra["ref_audio"]]}

    async def post():
        async with server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": model, "voice": "alloy", "input": "Hi.",
                    **extra}) as resp:
                return resp.status, await resp.json()
    status, error = run(post())
    assert status == 400, error
    assert_error_object(error, param=param)
