"""GET /v1/realtime on the tiny Qwen3, the claims of docs/realtime.md about the
conversation and the session: audio formats other than pcm16 at 24 kHz are refused,
conversation.item.delete / .truncate change what the next answer reads, previous_item_id
places an item, an image part is refused on a model that takes no images, and a session
that ends under its client (its lease ran out) sends ``session_ended`` and closes 1011."""

from __future__ import annotations

import json
import textwrap

import aiohttp
import pytest
from httputil import ServerSettings, run
from voiceutil import b64, events_until, events_until_any, silence, update

from omni.fixtures import build_tiny_qwen3


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model = build_tiny_qwen3(tmp_path_factory.mktemp("items") / "qwen3", initializer_range=0.5)
    stage = (f"{{name: llm, engine: ar, model_dir: {model}, final_output: text, "
             "params: {max_tokens: 6, temperature: 0}, options: {block_size: 4}}")
    chat = f"name: chat\nstages:\n  - {stage}\n"
    brief = textwrap.dedent(f"""\
        name: brief
        sessions: {{idle_ttl_s: 1}}
        stages:
          - {stage}
        """)
    return start_server({"chat": chat, "brief": brief}, ServerSettings(drain_timeout_s=2.0))


def message(text: str, role: str = "user") -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


async def connect(http, server, model: str = "chat"):
    ws = await http.ws_connect(f"{server.url}/v1/realtime?model={model}")
    assert (await ws.receive_json())["type"] == "session.created"
    return ws


async def send(ws, event: dict) -> dict:
    """An event; the server's first answer to it (an error, or what it did)."""
    await ws.send_str(json.dumps(event))
    return await ws.receive_json(timeout=30)


async def add(ws, item: dict, previous: str | None = None) -> dict:
    event = {"type": "conversation.item.create", "item": item}
    if previous is not None:
        event["previous_item_id"] = previous
    added = await send(ws, event)
    assert added["type"] == "conversation.item.added", added
    assert (await ws.receive_json())["type"] == "conversation.item.done"
    return added


async def answer(ws) -> dict:
    await ws.send_str(json.dumps({"type": "response.create"}))
    done = (await events_until(ws, "response.done"))[-1]["response"]
    assert done["status"] == "completed", done
    return {"text": done["output"][0]["content"][0]["text"],
            "prompt": done["usage"]["input_tokens"]}


async def answer_to(http, server, texts: list[str]) -> dict:
    """A fresh session's answer to these user messages, in this order."""
    ws = await connect(http, server)
    for text in texts:
        await add(ws, message(text))
    result = await answer(ws)
    await ws.close()
    return result


def test_audio_formats_other_than_pcm16_at_24_khz_are_refused(server):
    refused = [
        ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
        ({"output_audio_format": "g711_alaw"}, "session.output_audio_format"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format"),
        ({"audio": {"output": {"format": {"type": "audio/pcma"}}}},
         "session.audio.output.format"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
         "session.audio.input.format"),
    ]
    served = [{"input_audio_format": "pcm16", "output_audio_format": "pcm16"},
              {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}},
                         "output": {"format": {"type": "audio/pcm"}}}}]

    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await connect(http, server)
            for session, param in refused:
                error = await update(ws, session)
                assert error["type"] == "error", (session, error)
                assert (error["error"]["code"], error["error"]["param"]) == (
                    "invalid_value", param), error
                assert "pcm16 at 24 kHz" in error["error"]["message"]
            for session in served:
                assert (await update(ws, session))["type"] == "session.updated", session
            error = await send(ws, {"type": "response.create", "response": {
                "audio": {"output": {"format": {"type": "audio/pcmu"}}}}})
            assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
            await ws.close()
    run(body())


def test_item_delete_takes_the_item_out_of_what_the_next_answer_reads(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            alone = await answer_to(http, server, ["Tell me about the sea."])
            both = await answer_to(http, server, ["Tell me about the sea.", "And the moon?"])
            ws = await connect(http, server)
            await add(ws, message("Tell me about the sea."))
            moon = (await add(ws, message("And the moon?")))["item"]["id"]
            deleted = await send(ws, {"type": "conversation.item.delete", "item_id": moon})
            assert deleted == {**deleted, "type": "conversation.item.deleted", "item_id": moon}
            for event in ({"type": "conversation.item.retrieve", "item_id": moon},
                          {"type": "conversation.item.delete", "item_id": moon}):
                error = await send(ws, event)
                assert error["error"]["code"] == "item_not_found", error
            after = await answer(ws)
            await ws.close()
        assert both["prompt"] > alone["prompt"]
        assert after == alone  # the same prompt, the same greedy answer
    run(body())


def test_previous_item_id_inserts_after_that_item(server):
    a, b, c = "Tell me about the sea.", "And the moon?", "What about the stars?"

    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await connect(http, server)
            first = (await add(ws, message(a)))["item"]["id"]
            await add(ws, message(b))
            placed = await add(ws, message(c), previous=first)
            assert placed["previous_item_id"] == first
            error = await send(ws, {"type": "conversation.item.create", "item": message(c),
                                    "previous_item_id": "item_nowhere"})
            assert (error["error"]["code"], error["error"]["param"]) == (
                "item_not_found", "previous_item_id"), error
            inserted = await answer(ws)
            await ws.close()
            in_order = await answer_to(http, server, [a, c, b])
            appended = await answer_to(http, server, [a, b, c])
        assert inserted == in_order  # the model read a, c, b
        assert inserted["text"] != appended["text"]
    run(body())


def test_item_truncate_drops_the_unheard_transcript(server):
    said = "The sea is wide and deep and full of fish."
    heard_part = {"type": "output_audio", "audio": b64(silence(1.0)), "transcript": said}

    async def body():
        async with aiohttp.ClientSession() as http:
            alone = await answer_to(http, server, ["Tell me about the sea."])
            ws = await connect(http, server)
            user = (await add(ws, message("Tell me about the sea.")))["item"]["id"]
            reply = (await add(ws, {"type": "message", "role": "assistant",
                                    "content": [heard_part]}))["item"]["id"]
            for bad, param in (({"item_id": user}, "item_id"),  # not an assistant's audio
                               ({"item_id": reply, "content_index": 1}, "content_index"),
                               ({"item_id": reply, "audio_end_ms": 1500}, "audio_end_ms"),
                               ({"item_id": reply, "audio_end_ms": -1}, "audio_end_ms")):
                error = await send(ws, {"type": "conversation.item.truncate",
                                        "content_index": 0, "audio_end_ms": 400, **bad})
                assert error["type"] == "error", (bad, error)
                assert error["error"]["param"] == param, error
            truncated = await send(ws, {"type": "conversation.item.truncate", "item_id": reply,
                                        "content_index": 0, "audio_end_ms": 400})
            assert truncated == {**truncated, "type": "conversation.item.truncated",
                                 "item_id": reply, "content_index": 0, "audio_end_ms": 400}
            item = (await send(ws, {"type": "conversation.item.retrieve",
                                    "item_id": reply}))["item"]
            assert item["content"][0]["transcript"] == ""  # nothing the user did not hear
            after = await answer(ws)
            await ws.close()
        assert after == alone  # the model no longer reads what was cut
    run(body())


def test_an_image_on_a_model_that_takes_none_is_an_error_event(server):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}

    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await connect(http, server)
            error = await send(ws, {"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Look:"}, image]}})
            assert (error["error"]["code"], error["error"]["param"]) == (
                "unsupported_input", "item.content[1]"), error
            assert "does not take image input (it takes text)" in error["error"]["message"]
            await add(ws, message("Tell me about the sea."))
            after = await answer(ws)  # the refused item was not added: not read
            await ws.close()
            assert after == await answer_to(http, server, ["Tell me about the sea."])
    run(body())


def test_a_session_whose_lease_runs_out_gets_session_ended_then_1011(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await connect(http, server, "brief")  # idle_ttl_s: 1
            events = await events_until_any(ws, ("error",), timeout=10)
            error = events[-1]["error"]
            assert (error["code"], error["type"]) == ("session_ended", "server_error"), error
            assert "idle" in error["message"]
            closed = await ws.receive(timeout=10)
            assert closed.type == aiohttp.WSMsgType.CLOSE, closed
            assert ws.close_code == 1011
    run(body())
