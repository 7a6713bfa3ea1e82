"""GET /v1/duplex on the small voice pipeline (voiceutil.py: Silero VAD, Whisper, the tiny
Qwen3, Piper): turn_detection null refused in either dialect's shape (the session keeps
listening), the HTTP 400 before the upgrade for a model that cannot listen, hear or speak,
and a dropped duplex session resumed with its conversation, still listening."""

from __future__ import annotations

import json

import aiohttp
import pytest
from httputil import run
from voiceutil import QUESTION, events_until, silence, update

from omni.api.realtime.connection import HANDLERS, RealtimeConnection
from omni.api.realtime.duplex import DuplexConnection

NO_AUTO_ANSWER = {"type": "realtime", "audio": {"input": {"turn_detection": {
    "type": "server_vad", "create_response": False}}}}


async def heard_a_turn(ws, pcm: bytes) -> list[dict]:
    """Speech (between silences) as binary frames: the events up to its commit."""
    for offset in range(0, len(pcm), 9600):  # 200 ms frames
        await ws.send_bytes(pcm[offset:offset + 9600])
    return await events_until(ws, "input_audio_buffer.committed")


def test_duplex_refuses_turn_detection_null_and_keeps_listening(voice_server, speech):
    async def body():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{voice_server.url}/v1/duplex?model=voice") as ws:
                created = await ws.receive_json()
                assert created["session"]["audio"]["input"]["turn_detection"]["type"] \
                    == "server_vad"
                for off in ({"turn_detection": None},  # beta's flat key
                            {"type": "realtime", "audio": {"input": {"turn_detection": None}}}):
                    error = await update(ws, off)
                    assert error["type"] == "error", error
                    assert error["error"]["code"] == "invalid_value"
                    assert error["error"]["param"] == "session.turn_detection"
                    assert "always listens" in error["error"]["message"]
                updated = await update(ws, NO_AUTO_ANSWER)
                assert updated["type"] == "session.updated", updated
                vad = updated["session"]["audio"]["input"]["turn_detection"]
                assert vad["type"] == "server_vad" and vad["create_response"] is False
                kinds = [e["type"] for e in await heard_a_turn(
                    ws, silence(0.5) + speech[QUESTION] + silence(1.0))]
                assert "input_audio_buffer.speech_started" in kinds
                assert "input_audio_buffer.speech_stopped" in kinds
    run(body())


@pytest.mark.parametrize(("model", "says"), [
    ("chat", "no voice activity detection, no speech recognition, no speech output"),
    ("whisper", "no speech output"),  # a view of the voice pipeline: it hears, never speaks
])
def test_duplex_is_400_before_the_upgrade_for_a_model_that_cannot_listen(
        voice_server, model, says):
    async def body():
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(f"{voice_server.url}/v1/duplex?model={model}")
            assert info.value.status == 400
            async with http.get(f"{voice_server.url}/v1/duplex?model={model}") as response:
                assert response.status == 400
                error = (await response.json())["error"]
            assert says in error["message"] and error["param"] == "model", error
    run(body())


def test_duplex_resume_keeps_the_conversation_and_listens(voice_server, speech):
    async def body():
        url = f"{voice_server.url}/v1/duplex?model=voice"
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url)
            created = await ws.receive_json()
            token, session_id = created["resume_token"], created["session"]["id"]
            assert (await update(ws, NO_AUTO_ANSWER))["type"] == "session.updated"
            await ws.send_str(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Remember the word kettle."}]}}))
            item = (await events_until(ws, "conversation.item.added"))[-1]["item"]
            await ws.close(code=1001)  # going away: the session waits for a resume
            async with http.ws_connect(f"{url}&resume_token={token}") as ws:
                again = await ws.receive_json()
                assert again["type"] == "session.created"
                assert again["session"]["id"] == session_id
                vad = again["session"]["audio"]["input"]["turn_detection"]
                assert vad["type"] == "server_vad" and vad["create_response"] is False
                await ws.send_str(json.dumps({"type": "conversation.item.retrieve",
                                              "item_id": item["id"]}))
                retrieved = (await events_until(ws, "conversation.item.retrieved"))[-1]
                assert retrieved["item"]["content"] == item["content"]
                events = await heard_a_turn(ws, silence(0.5) + speech[QUESTION] + silence(1.0))
                assert events[-1]["previous_item_id"] == item["id"]  # the same conversation
                assert "input_audio_buffer.speech_started" in [e["type"] for e in events]
    run(body())


def test_events_dispatch_to_the_connections_own_methods():
    """The handler table names methods, looked up on the connection, so an override in
    DuplexConnection is what runs (a table of RealtimeConnection's functions bypassed it)."""
    assert all(isinstance(name, str) and callable(getattr(RealtimeConnection, name))
               for name in HANDLERS.values())
    overridden = [e for e, name in HANDLERS.items()
                  if getattr(DuplexConnection, name) is not getattr(RealtimeConnection, name)]
    assert overridden == ["session.update"]
