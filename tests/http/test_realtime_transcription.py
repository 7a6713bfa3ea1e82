"""Transcription sessions (/v1/realtime?intent=transcription) and semantic_vad, on the small
voice pipeline (voiceutil.py: Silero VAD, Whisper tiny.en, Piper making the speech): the
GA openai SDK transcribing a spoken turn found by semantic_vad, a beta-dialect session
committing by hand, a model that cannot transcribe, events a transcription session does
not take; semantic_vad's eagerness reaching the VAD, its echo, a bad eagerness."""

from __future__ import annotations

import json

import aiohttp
from httputil import run
from voiceutil import QUESTION, b64, events_until, events_until_any, quiet_for, silence, update

TRANSCRIBED = "conversation.item.input_audio_transcription.completed"


async def transcribe_through_sdk(conn, pcm: bytes) -> list:
    """Send ``pcm`` in 1-second appends through the SDK's connection; the events until
    the turn's transcription completed."""
    for offset in range(0, len(pcm), 48_000):
        await conn.input_audio_buffer.append(audio=b64(pcm[offset:offset + 48_000]))
    events = []
    while not events or events[-1].type != TRANSCRIBED:
        events.append(await conn.recv())
    return events


def semantic(eagerness: str, **more) -> dict:
    return {"type": "realtime", "output_modalities": ["text"], "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": eagerness, **more}}}}


async def append(ws, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 48_000):  # 1 s pieces, as fast as they go
        await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": b64(pcm[offset:offset + 48_000])}))


def test_semantic_vad_is_echoed_with_the_vad_settings_it_maps_to(voice_server):
    async def body():
        async with aiohttp.ClientSession() as http:
            for path in ("realtime", "duplex"):
                ws = await http.ws_connect(f"{voice_server.url}/v1/{path}?model=voice")
                assert (await ws.receive_json())["type"] == "session.created"
                updated = await update(ws, semantic("low", create_response=False))
                assert updated["type"] == "session.updated", updated
                turns = updated["session"]["audio"]["input"]["turn_detection"]
                assert turns == {"type": "semantic_vad", "eagerness": "low",
                                 "create_response": False, "interrupt_response": True,
                                 "threshold": 0.5, "prefix_padding_ms": 300,
                                 "silence_duration_ms": 1500}
                auto = await update(ws, semantic("auto"))
                assert auto["session"]["audio"]["input"]["turn_detection"][
                    "silence_duration_ms"] == 800
                await ws.close()
    run(body())


def test_bad_eagerness_is_an_error_event_naming_it(voice_server):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{voice_server.url}/v1/realtime?model=voice")
            await ws.receive_json()
            error = await update(ws, semantic("eager"))
            assert error["type"] == "error"
            assert error["error"]["param"] == "session.turn_detection.eagerness"
            assert "low, medium, high, auto" in error["error"]["message"]
            # the socket stays, and the session kept its settings
            kept = await update(ws, {"instructions": "x"})
            assert kept["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            await ws.close()
    run(body())


def test_eagerness_sets_how_long_a_pause_ends_the_turn(voice_server, speech):
    """Two sentences 0.8 s apart: high eagerness (300 ms) ends a turn in the gap, low
    (1500 ms) hears one turn."""
    gap_s = 0.8
    second_at = int((1.0 + len(speech[QUESTION]) / 48_000 + gap_s) * 1000)
    audio = silence(1.0) + speech[QUESTION] + silence(gap_s) + speech[QUESTION] + silence(2.5)

    async def turns(http, eagerness: str) -> list[dict]:
        ws = await http.ws_connect(f"{voice_server.url}/v1/realtime?model=voice")
        await ws.receive_json()
        assert (await update(ws, semantic(eagerness, create_response=False)))[
            "type"] == "session.updated"
        await append(ws, audio)
        events = await events_until(ws, "input_audio_buffer.speech_stopped")
        if events[-1]["audio_end_ms"] < second_at:  # a turn ended in the gap: the second
            events += await events_until(ws, "input_audio_buffer.speech_stopped")
        await ws.close()
        return [e for e in events if e["type"].startswith("input_audio_buffer.speech")]

    async def body():
        async with aiohttp.ClientSession() as http:
            eager, patient = await turns(http, "high"), await turns(http, "low")
        starts = [e for e in eager if e["type"] == "input_audio_buffer.speech_started"]
        assert len(starts) == 2 and eager[1]["audio_end_ms"] < second_at
        assert [e["type"] for e in patient].count("input_audio_buffer.speech_started") == 1
        assert patient[-1]["audio_end_ms"] > second_at
    run(body())


def test_ga_sdk_transcription_session_with_semantic_vad(voice_server, speech):
    async def body():
        client = voice_server.client(timeout=60.0)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            assert created.session.type == "transcription"
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                "turn_detection": {"type": "semantic_vad", "eagerness": "high",
                                   "create_response": True}}}})
            updated = await conn.recv()
            assert updated.type == "session.updated", updated
            turns = updated.session.audio.input.turn_detection
            assert turns.type == "semantic_vad" and turns.eagerness == "high"
            assert turns.create_response is False  # a transcription session never answers
            pcm = silence(0.5) + speech[QUESTION] + silence(1.0)
            events = await transcribe_through_sdk(conn, pcm)
            kinds = [e.type for e in events]
            assert kinds.index("input_audio_buffer.speech_started") \
                < kinds.index("input_audio_buffer.speech_stopped") \
                < kinds.index("input_audio_buffer.committed")
            done = events[-1]
            deltas = [e for e in events
                      if e.type == "conversation.item.input_audio_transcription.delta"]
            assert deltas and all(d.item_id == done.item_id for d in deltas)
            assert "".join(d.delta for d in deltas) == done.transcript
            assert "capital of france" in done.transcript.lower()
            assert done.usage.type == "duration" and done.usage.seconds > 1
            assert not [k for k in kinds if k.startswith("response.")]
            assert not [k for k in kinds if k.startswith("conversation.item.added")]
    run(body())


def test_beta_transcription_session_commits_by_hand(voice_server, speech):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"{voice_server.url}/v1/realtime?model=gpt-4o-transcribe&intent=transcription",
                headers={"OpenAI-Beta": "realtime=v1"})
            created = await ws.receive_json()
            assert created["type"] == "transcription_session.created"
            assert created["session"]["object"] == "realtime.transcription_session"
            await ws.send_str(json.dumps({"type": "transcription_session.update", "session": {
                "input_audio_format": "pcm16", "turn_detection": None,
                "input_audio_transcription": {"model": "whisper"}}}))
            updated = (await events_until_any(ws, ("transcription_session.updated", "error")))
            assert updated[-1]["type"] == "transcription_session.updated", updated
            assert updated[-1]["session"]["turn_detection"] is None
            await append(ws, speech[QUESTION] + silence(0.3))
            assert [e["type"] for e in await quiet_for(ws, 1.5)] == []  # no VAD: it waits
            await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
            events = await events_until(ws, TRANSCRIBED)
            kinds = [e["type"] for e in events]
            assert kinds[0] == "input_audio_buffer.committed"
            assert "conversation.item.input_audio_transcription.delta" in kinds
            assert "capital of france" in events[-1]["transcript"].lower()
            assert events[-1]["item_id"] == events[0]["item_id"]
            # the session's language reaches Whisper: tiny.en refuses French
            await ws.send_str(json.dumps({"type": "transcription_session.update", "session": {
                "input_audio_transcription": {"model": "whisper", "language": "fr"}}}))
            await events_until(ws, "transcription_session.updated")
            await append(ws, speech[QUESTION])
            await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
            failed = (await events_until(
                ws, "conversation.item.input_audio_transcription.failed"))[-1]
            assert "English-only" in failed["error"]["message"]
            # a transcription session answers nothing
            await ws.send_str(json.dumps({"type": "response.create", "event_id": "e1"}))
            error = (await events_until(ws, "error"))[-1]["error"]
            assert error["param"] == "type" and error["event_id"] == "e1"
            assert "transcription session" in error["message"]
            # and an empty commit is the usual error
            await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
            error = (await events_until(ws, "error"))[-1]["error"]
            assert error["code"] == "input_audio_buffer_commit_empty"
            await ws.close()
    run(body())


def test_a_model_that_cannot_transcribe_is_an_error_event(voice_server):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"{voice_server.url}/v1/realtime?model=chat&intent=transcription")
            first = await ws.receive_json()
            assert first["type"] == "error" and first["error"]["param"] == "model"
            assert "cannot transcribe" in first["error"]["message"]
            assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1008
            # nor can it be picked in session.update of a session that transcribes
            ws = await http.ws_connect(f"{voice_server.url}/v1/realtime?intent=transcription")
            await ws.receive_json()
            error = await update(ws, {"type": "transcription", "audio": {"input": {
                "transcription": {"model": "chat"}}}})
            assert error["type"] == "error"
            assert error["error"]["param"] == "session.audio.input.transcription.model"
            # and a realtime session is not turned into one
            bad = await update(ws, {"type": "realtime"})
            assert bad["type"] == "error" and bad["error"]["param"] == "session.type"
            await ws.close()
    run(body())


def test_beta_sdk_transcription_session(voice_server, speech):
    """The beta client (its model is required and is ignored when not served) with
    transcription_session.update and semantic_vad in the flat turn_detection."""
    async def body():
        ws_base = voice_server.base_url.replace("http://", "ws://")
        client = voice_server.client(timeout=60.0, websocket_base_url=ws_base)
        async with client.beta.realtime.connect(
                model="gpt-4o-transcribe", extra_query={"intent": "transcription"}) as conn:
            created = await conn.recv()
            assert created.type == "transcription_session.created"
            await conn.transcription_session.update(session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "gpt-4o-transcribe"},
                "turn_detection": {"type": "semantic_vad", "eagerness": "medium"}})
            updated = await conn.recv()
            assert updated.type == "transcription_session.updated", updated
            assert updated.session.turn_detection.silence_duration_ms == 800
            pcm = silence(0.5) + speech[QUESTION] + silence(1.5)
            events = await transcribe_through_sdk(conn, pcm)
            kinds = [e.type for e in events]
            assert "input_audio_buffer.speech_stopped" in kinds
            assert "conversation.item.input_audio_transcription.delta" in kinds
            assert "capital of france" in events[-1].transcript.lower()
    run(body())
