"""Tools in realtime sessions (voice agents; protocols.md §10.10), through the unmodified
openai SDK (GA ``client.realtime`` and beta) and plain aiohttp.

On the tiny random Qwen3 a named function or ``required`` makes the call certain whatever
the weights (the answer is constrained to calls whose arguments follow the schema): the
function_call items and their events, the client's function_call_output, and the next
answer reading both. ``auto`` cannot be tested on random weights (they never choose a
call), so the spoken tests use fixed text: the echo engine answers with the user's
message, which holds Hermes calls, and Piper speaks it: the calls must not be voiced.
"""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap

import aiohttp
import jsonschema
import pytest
from httputil import run
from toolutil import SCHEMAS, WEATHER
from voiceutil import events_until, update

from omni.fixtures.tiny_models import ensure_tiny_model

TOOLS = [{"type": "function", "name": name, "description": f"{name} tool", "parameters": schema}
         for name, schema in SCHEMAS.items()]
ASK = {"type": "message", "role": "user",
       "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}
RESULT = json.dumps({"temperature": 21, "sky": "sunny", "wind": "light breeze from the west",
                     "humidity": 40, "forecast": "sunny all week with a chance of rain"})
CALL_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
             '"unit": "c", "days": 2}}\n</tool_call>')


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("qwen3", tmp_path_factory.mktemp("models"))
    # an echo stage whose answer Piper speaks: text with calls in it, 4 chunks apart
    spoken = textwrap.dedent("""\
        name: spoken
        stages:
          - {name: echo, engine: echo, params: {chunks: 4}, final_output: text}
          - {name: tts, engine: generation, model: piper, inputs: [text],
             final_output: audio, options: {openai_voices: true}}
        edges:
          - {from: echo, to: tts, delivery: stream}
        """)
    return start_server({"qwen3": str(model_dir), "spoken": spoken})


async def until(conn, kind: str) -> list:
    """SDK events up to and including the first of ``kind``."""
    seen = []
    while True:
        seen.append(await asyncio.wait_for(conn.recv(), 60))
        if seen[-1].type == kind:
            return seen


def checked_calls(done) -> list:
    """The function_call items of a response.done, each checked against its schema."""
    calls = [item for item in done.output if item.type == "function_call"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return calls


def test_named_function_call_events_then_its_output_answered(server):
    async def body():
        async with server.client().realtime.connect(model="qwen3") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={
                "type": "realtime", "output_modalities": ["text"], "tools": TOOLS,
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": 1000})
            updated = (await conn.recv()).session
            assert [t.name for t in updated.tools] == ["get_weather", "get_time"]
            assert updated.tool_choice.name == "get_weather"
            await conn.conversation.item.create(item=ASK)
            await conn.response.create()
            events = await until(conn, "response.done")
            call = _check_call_events(events)
            first = events[-1].response.usage.input_tokens
            await conn.conversation.item.create(item={
                "type": "function_call_output", "call_id": call.call_id, "output": RESULT})
            added = await until(conn, "conversation.item.done")
            assert added[0].type == "conversation.item.added"
            assert added[0].item.type == "function_call_output"
            assert added[0].previous_item_id == call.id
            # the session still names get_weather: this response lets the model choose
            await conn.response.create(response={"tool_choice": "auto",
                                                 "max_output_tokens": 8})
            done = (await until(conn, "response.done"))[-1].response
        assert done.status == "completed"
        assert [item.type for item in done.output] == ["message"]
        # the call and its (long) output are in the prompt now
        assert done.usage.input_tokens > first + 40
        assert done.usage.input_token_details.cached_tokens >= first  # the KV was kept
    run(body())


def _check_call_events(events: list):
    """One get_weather call, announced, streamed and finished as OpenAI's are."""
    events = events[[e.type for e in events].index("response.created"):]
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds
    added = events[1]
    assert added.type == "response.output_item.added" and added.output_index == 0
    item = added.item
    assert (item.type, item.status, item.name, item.arguments) == (
        "function_call", "in_progress", "get_weather", "")
    assert events[2].type == "conversation.item.added" and events[2].item.id == item.id
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 2 and all(d.call_id == item.call_id and d.item_id == item.id
                                   for d in deltas)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert (done.name, done.call_id) == ("get_weather", item.call_id)
    assert done.arguments == "".join(d.delta for d in deltas)
    assert kinds.index("response.function_call_arguments.done") \
        < kinds.index("response.output_item.done") < kinds.index("conversation.item.done") \
        < kinds.index("response.done")
    response = events[-1].response
    assert response.status == "completed"
    [call] = checked_calls(response)
    assert [o.id for o in response.output] == [item.id]  # no message beside the call
    assert call.arguments == done.arguments
    return call


def test_required_calls_follow_their_schemas(server):
    async def body():
        async with server.client().realtime.connect(model="qwen3") as conn:
            await conn.recv()
            await conn.session.update(session={"type": "realtime",
                                               "output_modalities": ["text"],
                                               "max_output_tokens": 2000})
            await conn.recv()
            seen = []
            for seed in range(4):  # unseeded: 2 rounds were sometimes the same call
                await conn.conversation.item.create(item=ASK)
                # the response's own tools, over a session that has none
                await conn.response.create(response={
                    "tools": TOOLS, "tool_choice": "required", "temperature": 1.0 + seed / 4})
                events = await until(conn, "response.done")
                done = events[-1].response
                calls = checked_calls(done)
                assert calls and [o.type for o in done.output] == ["function_call"] * len(calls)
                indexes = [e.output_index for e in events
                           if e.type == "response.output_item.added"]
                assert indexes == list(range(len(calls)))
                seen += [(c.name, c.arguments) for c in calls]
            assert len(set(seen)) > 1  # the calls vary
    run(body())


def test_beta_client_gets_beta_names_for_a_call(server):
    async def body():
        ws_base = server.base_url.replace("http://", "ws://")
        beta = server.client(websocket_base_url=ws_base)
        async with beta.beta.realtime.connect(model="qwen3") as conn:
            await conn.recv()
            await conn.session.update(session={"modalities": ["text"], "tools": TOOLS,
                                               "tool_choice": "required",
                                               "max_response_output_tokens": 2000})
            updated = (await conn.recv()).session
            assert updated.tool_choice == "required" and updated.tools[1].name == "get_time"
            await conn.conversation.item.create(item=ASK)
            await conn.response.create()
            events = await until(conn, "response.done")
        kinds = [e.type for e in events]
        assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
        assert "conversation.item.done" not in kinds
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        jsonschema.validate(json.loads(done.arguments), SCHEMAS[done.name])
        assert events[-1].response.output[0].type == "function_call"
    run(body())


def test_a_call_cut_short_is_incomplete_and_not_read_again(server):
    # arguments of 1,000 characters cannot fit in 60 tokens; the name comes within them
    note = {"type": "function", "name": "n", "parameters": {
        "type": "object", "properties": {"t": {"type": "string", "minLength": 1000,
                                               "maxLength": 1000}},
        "required": ["t"], "additionalProperties": False}}

    async def prompt_after(conn, cut: bool) -> int:
        await conn.conversation.item.create(item=ASK)
        if cut:
            await conn.response.create(response={"tools": [note], "tool_choice": "required",
                                                 "max_output_tokens": 60})
            events = await until(conn, "response.done")
            [call] = events[-1].response.output
            done = next(e for e in events
                        if e.type == "response.function_call_arguments.done")
            assert call.status == "incomplete" and done.arguments == call.arguments
            assert call.arguments.startswith('{"t": "')
        await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 2})
        return (await until(conn, "response.done"))[-1].response.usage.input_tokens

    async def both():
        prompts = []
        for cut in (True, False):
            async with server.client().realtime.connect(model="qwen3") as conn:
                await conn.recv()
                await conn.session.update(session={"type": "realtime",
                                                   "output_modalities": ["text"]})
                await conn.recv()
                prompts.append(await prompt_after(conn, cut))
        assert prompts[0] == prompts[1]  # the cut call is not in the history
    run(both())


async def raw_connect(http, server, model: str = "qwen3"):
    ws = await http.ws_connect(f"{server.url}/v1/realtime?model={model}")
    assert (await ws.receive_json())["type"] == "session.created"
    return ws


async def send(ws, event: dict) -> dict:
    """An event; the server's first answer to it."""
    await ws.send_str(json.dumps(event))
    return await ws.receive_json(timeout=30)


@pytest.mark.parametrize("session, param", [
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     "session.tool_choice"),
    ({"tools": [{**TOOLS[0], "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(?<=a)b"}}}}]}, "session.tools[0].parameters"),
    ({"tools": [], "tool_choice": "required"}, "session.tool_choice"),
    ({"tools": [{**TOOLS[0], "name": "bad name!"}]}, "session.tools[0].name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "session.tool_choice"),
])
def test_bad_tools_are_error_events_and_change_nothing(server, session, param):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await raw_connect(http, server)
            set_up = await update(ws, {"tools": TOOLS[1:], "tool_choice": "auto"})
            assert set_up["type"] == "session.updated"
            error = await update(ws, {"instructions": "changed", **session})
            assert error["type"] == "error", error
            assert (error["error"]["type"], error["error"]["param"]) == (
                "invalid_request_error", param), error
            kept = (await update(ws, {}))["session"]
            assert kept["tools"] == TOOLS[1:] and kept["instructions"] == ""
            bad = await send(ws, {"type": "response.create", "response": session})
            assert bad["error"]["param"] == param.replace("session.", "response."), bad
            await ws.close()
    run(body())


def test_call_items_create_retrieve_truncate_delete(server):
    call = {"type": "function_call", "call_id": "call_mine", "name": "get_time",
            "arguments": "{\"zone\": \"utc\"}"}
    output = {"type": "function_call_output", "call_id": "call_mine", "output": "12:00"}

    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await raw_connect(http, server)
            orphan = await send(ws, {"type": "conversation.item.create", "item": output})
            assert (orphan["error"]["code"], orphan["error"]["param"]) == (
                "item_not_found", "item.call_id"), orphan
            added = await send(ws, {"type": "conversation.item.create", "item": call})
            assert added["item"] == {**call, "id": added["item"]["id"],
                                     "object": "realtime.item", "status": "completed"}
            assert (await ws.receive_json())["type"] == "conversation.item.done"
            again = await send(ws, {"type": "conversation.item.create", "item": call})
            assert again["error"]["param"] == "item.call_id", again
            answered = await send(ws, {"type": "conversation.item.create", "item": output})
            assert answered["item"]["output"] == "12:00"
            await ws.receive_json()
            call_id = added["item"]["id"]
            got = await send(ws, {"type": "conversation.item.retrieve", "item_id": call_id})
            assert got["item"]["arguments"] == call["arguments"]
            cut = await send(ws, {"type": "conversation.item.truncate", "item_id": call_id,
                                  "content_index": 0, "audio_end_ms": 0})
            assert (cut["type"], cut["error"]["param"]) == ("error", "item_id"), cut
            gone = await send(ws, {"type": "conversation.item.delete", "item_id": call_id})
            assert gone["type"] == "conversation.item.deleted"
            await ws.close()
    run(body())


async def spoken_turn(ws, text: str) -> tuple[list, float]:
    """The events of an answer to ``text`` and the seconds of audio it had."""
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await ws.receive_json()  # conversation.item.done
    await ws.send_str(json.dumps({"type": "response.create"}))
    events = await events_until(ws, "response.done")
    pcm = b"".join(base64.b64decode(e["delta"]) for e in events
                   if e["type"] == "response.output_audio.delta")
    return events, len(pcm) / 48_000


def test_calls_in_a_spoken_answer_are_not_voiced(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await raw_connect(http, server, "spoken")
            updated = await update(ws, {"tools": TOOLS, "output_modalities": ["audio"]})
            assert updated["type"] == "session.updated", updated
            said, said_s = await spoken_turn(ws, "Let me check the weather for you.")
            mixed, mixed_s = await spoken_turn(
                ws, f"Let me check the weather for you.\n{CALL_TEXT}")
            only, only_s = await spoken_turn(ws, CALL_TEXT)
            await ws.close()
        assert said_s > 0.5
        # the call's ~100 characters would be several seconds of speech
        assert abs(mixed_s - said_s) < 0.5, (said_s, mixed_s)
        output = mixed[-1]["response"]["output"]
        assert [o["type"] for o in output] == ["message", "function_call"]
        assert output[0]["content"][0]["transcript"].strip() == \
            "Let me check the weather for you."
        assert json.loads(output[1]["arguments"]) == {"city": "Paris", "unit": "c", "days": 2}
        # a call alone: no message item, no audio
        assert only_s == 0 and [o["type"] for o in only[-1]["response"]["output"]] == [
            "function_call"]
        assert not any(e["type"].startswith("response.content_part") for e in only)
    run(body())


def test_required_on_a_stage_that_cannot_constrain_is_refused(server):
    """A certain call needs a stage that constrains decoding (the AR engine); the echo
    stage cannot, so "required" is an error event naming tool_choice, and the session
    keeps answering (in words, spoken). The real models' test below runs one."""
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await raw_connect(http, server, "spoken")
            refused = await update(ws, {"tools": TOOLS, "tool_choice": "required"})
            events, seconds = await spoken_turn(ws, "Anything.")
            await ws.close()
        assert refused["type"] == "error" and refused["error"]["param"] == "session.tool_choice"
        assert seconds > 0 and events[-1]["response"]["status"] == "completed"
    run(body())


@pytest.fixture(scope="module")
def agent(start_server):
    """SmolLM2 speaking through Piper (the default assistant's models, real weights)."""
    from omni.models.smollm2 import ensure_smollm2

    agent = textwrap.dedent(f"""\
        name: agent
        stages:
          - {{name: llm, engine: ar, model: hf_causal, model_dir: {ensure_smollm2()},
             final_output: text, params: {{temperature: 0}}}}
          - {{name: tts, engine: generation, model: piper, inputs: [text],
             final_output: audio, options: {{openai_voices: true}}}}
        edges:
          - {{from: llm, to: tts, delivery: stream}}
        """)
    return start_server({"agent": agent})


def test_a_spoken_agent_calls_silently_then_speaks_the_answer(agent):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await raw_connect(http, agent, "agent")
            await update(ws, {"tools": TOOLS, "output_modalities": ["audio"],
                              "tool_choice": {"type": "function", "name": "get_weather"},
                              "max_output_tokens": 200})
            called, called_s = await spoken_turn(ws, "What is the weather in Paris?")
            [call] = called[-1]["response"]["output"]
            answer = await send(ws, {"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"],
                "output": "sunny, 21 C"}})
            assert answer["type"] == "conversation.item.added", answer
            await ws.receive_json()
            await ws.send_str(json.dumps({"type": "response.create", "response": {
                "tool_choice": "auto", "max_output_tokens": 30}}))
            spoken = await events_until(ws, "response.done")
            await ws.close()
        assert called_s == 0 and call["type"] == "function_call"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
        done = spoken[-1]["response"]
        assert done["status"] == "completed" and done["output"][0]["type"] == "message"
        pcm = [e for e in spoken if e["type"] == "response.output_audio.delta"]
        assert pcm and done["output"][0]["content"][0]["transcript"].strip(), json.dumps(done["output"])
    run(body())
