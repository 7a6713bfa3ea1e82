"""GET /v1/realtime on the tiny Qwen3 (text turns) with the unmodified openai SDK (GA and
beta clients) and a plain aiohttp client: event order and names, the session's KV reused
by the next turn, cancel, errors that keep the socket open, 401 before the upgrade, 1009,
1013 beyond max_sessions, resume within the grace period and not after, and a killed
replica ending its sessions with an error event."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap

import aiohttp
import openai
import pytest
from httputil import ServerSettings, run

from omni.fixtures import build_tiny_qwen3

KEY = "sekrit"
HELLO = {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Tell me about the sea."}]}
FRAME_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    # a larger init than the default, so greedy answers vary (0.02 repeats one token)
    model = build_tiny_qwen3(tmp_path_factory.mktemp("rt") / "qwen3", initializer_range=0.5)
    stage = (f"{{name: llm, engine: ar, model_dir: {model}, final_output: text, "
             "params: {max_tokens: 12, temperature: 0}, options: {block_size: 4}}")
    chat = textwrap.dedent(f"""\
        name: chat
        sessions: {{max_sessions: 2, resume_grace_s: 2}}
        stages:
          - {stage}
        """)
    # answers that run until cancelled: 2,000 tokens, end tokens ignored
    long = chat.replace("name: chat", "name: long").replace(
        "max_tokens: 12", "max_tokens: 2000, ignore_eos: true")
    return start_server({"chat": chat, "long": long},
                        ServerSettings(api_key=KEY, max_request_bytes=FRAME_LIMIT,
                                       drain_timeout_s=2.0))


def client(server) -> openai.AsyncOpenAI:
    return server.client(api_key=KEY)


async def until(conn, kind: str) -> list:
    """Every event up to and including the first of ``kind``."""
    seen = []
    while True:
        event = await asyncio.wait_for(conn.recv(), 30)
        seen.append(event)
        if event.type == kind:
            return seen


async def text_turn(conn, text: str = "Tell me about the sea.") -> list:
    await conn.conversation.item.create(item={**HELLO, "content": [
        {"type": "input_text", "text": text}]})
    await conn.response.create()
    return await until(conn, "response.done")


def test_ga_text_turns_reuse_the_session_kv(server):
    async def body():
        async with client(server).realtime.connect(model="chat") as conn:
            created = await conn.recv()
            assert created.type == "session.created"  # first, right after the upgrade
            assert created.session.type == "realtime" and created.session.id
            await conn.session.update(session={"type": "realtime",
                                               "output_modalities": ["text"],
                                               "instructions": "Answer briefly."})
            updated = await conn.recv()
            assert updated.type == "session.updated"
            assert updated.session.instructions == "Answer briefly."
            events = await text_turn(conn)
            kinds = [e.type for e in events]
            assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]
            assert kinds.index("response.created") < kinds.index("response.output_item.added") \
                < kinds.index("response.content_part.added") \
                < kinds.index("response.output_text.delta") \
                < kinds.index("response.output_text.done") < kinds.index("response.done")
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            done = events[-1].response
            assert done.status == "completed" and len(set(deltas)) > 3
            assert done.output[0].content[0].text == deltas
            assert done.usage.output_tokens == 12 and done.usage.input_tokens > 0
            first_prompt = done.usage.input_tokens
            again = (await text_turn(conn, "And the mountains?"))[-1].response
            cached = again.usage.input_token_details.cached_tokens
            assert cached >= first_prompt  # the whole first turn was not recomputed
            assert len({e.event_id for e in events}) == len(events)
    run(body())


def test_beta_client_gets_beta_names(server):
    async def body():
        ws_base = server.base_url.replace("http://", "ws://")
        beta = server.client(api_key=KEY, websocket_base_url=ws_base)  # else it forces wss
        async with beta.beta.realtime.connect(model="chat") as conn:
            created = await conn.recv()
            assert created.type == "session.created" and created.session.modalities == ["text"]
            await conn.session.update(session={"modalities": ["text"], "temperature": 0.6})
            assert (await conn.recv()).session.temperature == 0.6
            kinds = [e.type for e in await text_turn(conn)]
            assert "conversation.item.created" in kinds and "response.text.delta" in kinds
            assert "conversation.item.added" not in kinds
            assert "response.output_text.delta" not in kinds
    run(body())


def test_bad_events_get_error_events_and_the_socket_stays(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.url}/v1/realtime?model=chat",
                                       headers={"Authorization": f"Bearer {KEY}"}) as ws:
                assert (await ws.receive_json())["type"] == "session.created"
                for bad, code in (("{not json", "invalid_json"),
                                  (json.dumps({"type": "no.such.event", "event_id": "e1"}),
                                   "unknown_event"),
                                  (json.dumps({"type": "input_audio_buffer.commit"}),
                                   "input_audio_buffer_commit_empty"),
                                  (json.dumps({"type": "input_audio_buffer.append",
                                               "audio": "###"}), "invalid_audio"),
                                  (json.dumps({"type": "session.update", "session": {
                                      "output_modalities": ["audio"]}}), "invalid_value"),
                                  (json.dumps({"type": "session.update", "session": {
                                      "turn_detection": {"type": "server_vad"}}}),
                                   "invalid_value"),  # this model has no VAD stage
                                  (json.dumps({"type": "response.cancel"}),
                                   "response_cancel_not_active")):
                    await ws.send_str(bad)
                    error = await ws.receive_json(timeout=10)
                    assert error["type"] == "error" and error["error"]["code"] == code, error
                assert error["error"]["event_id"] is None
                await ws.send_str(json.dumps({"type": "no.such", "event_id": "mine"}))
                assert (await ws.receive_json())["error"]["event_id"] == "mine"
                await ws.send_str(json.dumps({"type": "response.create"}))  # still served
                kinds = []
                while not kinds or kinds[-1] != "response.done":
                    kinds.append((await ws.receive_json(timeout=30))["type"])
                await ws.send_str("x" * (FRAME_LIMIT + 1))  # over the frame limit
                closed = await ws.receive(timeout=10)
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                assert ws.close_code == 1009
    run(body())


def test_a_client_that_keeps_sending_bad_events_is_closed_with_1008(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.url}/v1/realtime?model=chat",
                                       headers={"Authorization": f"Bearer {KEY}"}) as ws:
                await ws.receive_json()
                for _ in range(60):
                    await ws.send_str("{oops")
                errors = 0
                while (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
                    errors += 1
                assert errors == 51 and ws.close_code == 1008  # MAX_BAD_EVENTS + 1, then out
    run(body())


def test_auth_before_the_upgrade(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(f"{server.url}/v1/realtime?model=chat")
            assert info.value.status == 401
            protocols = ("realtime", f"openai-insecure-api-key.{KEY}")
            async with http.ws_connect(f"{server.url}/v1/realtime?model=chat",
                                       protocols=protocols) as ws:  # a browser's way
                assert ws.protocol == "realtime"
                assert (await ws.receive_json())["type"] == "session.created"
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(f"{server.url}/v1/realtime?model=nope",
                                      headers={"Authorization": f"Bearer {KEY}"})
            assert info.value.status == 404
    run(body())


def test_twice_max_sessions_the_excess_closed_with_1013(server):
    async def one(http):
        ws = await http.ws_connect(f"{server.url}/v1/realtime?model=chat",
                                   headers={"Authorization": f"Bearer {KEY}"})
        first = await ws.receive_json(timeout=10)
        return ws, first

    def open_sessions() -> int:
        return server.inspect(lambda: len(server.models["chat"].omni.sessions.manager))

    async def body():
        for _ in range(100):  # earlier tests' dropped sessions wait out their grace (2 s)
            if open_sessions() == 0:
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            opened = await asyncio.gather(*(one(http) for _ in range(4)))
            served = [ws for ws, first in opened if first["type"] == "session.created"]
            refused = [ws for ws, first in opened if first["type"] == "error"]
            assert len(served) == 2 and len(refused) == 2
            for ws in refused:
                assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE
                assert ws.close_code == 1013
            for ws in served:  # the admitted ones answer
                await ws.send_str(json.dumps({"type": "conversation.item.create",
                                              "item": HELLO}))
                await ws.send_str(json.dumps({"type": "response.create"}))
                kinds = []
                while not kinds or kinds[-1] != "response.done":
                    kinds.append((await ws.receive_json(timeout=30))["type"])
                await ws.close()  # a normal close ends the session at once
        await asyncio.sleep(0.5)
        assert open_sessions() == 0
    run(body())


def test_cancel_mid_answer(server):
    async def body():
        async with client(server).realtime.connect(model="long") as conn:
            await conn.recv()
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await conn.recv()
            await conn.conversation.item.create(item=HELLO)
            await conn.response.create()
            while (await conn.recv()).type != "response.output_text.delta":
                pass
            await conn.response.cancel()
            done = (await until(conn, "response.done"))[-1].response
            assert done.status == "cancelled"
            assert done.status_details.reason == "client_cancelled"
            assert 0 < done.usage.output_tokens < 2000 and done.output[0].content[0].text
            await conn.conversation.item.retrieve(item_id=done.output[0].id)
            item = (await until(conn, "conversation.item.retrieved"))[-1].item
            assert item.status == "incomplete"  # what was said before the cancel stays
            assert item.content[0].text == done.output[0].content[0].text
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 5})
            await conn.recv()
            await conn.response.create()  # the session answers again
            again = (await until(conn, "response.done"))[-1].response
            assert again.status == "completed" and again.usage.output_tokens == 5
    run(body())


async def raw_turn(ws) -> dict:
    await ws.send_str(json.dumps({"type": "conversation.item.create", "item": HELLO}))
    await ws.send_str(json.dumps({"type": "response.create"}))
    while True:
        event = await ws.receive_json(timeout=30)
        if event["type"] == "response.done":
            return event["response"]


def test_resume_within_the_grace_period_and_not_after(server):
    async def body():
        auth = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{server.url}/v1/realtime?model=chat", headers=auth)
            created = await ws.receive_json()
            token, session_id = created["resume_token"], created["session"]["id"]
            first = await raw_turn(ws)
            await ws.close(code=1001)  # going away: the session waits for us
            url = f"{server.url}/v1/realtime?model=chat&resume_token={token}"
            async with http.ws_connect(url, headers=auth) as ws:
                created = await ws.receive_json()
                assert created["session"]["id"] == session_id
                await ws.send_str(json.dumps({"type": "conversation.item.retrieve",
                                              "item_id": first["output"][0]["id"]}))
                item = (await ws.receive_json())["item"]
                assert item["content"][0]["text"] == first["output"][0]["content"][0]["text"]
                second = await raw_turn(ws)  # the conversation and its KV carried over
                cached = second["usage"]["input_token_details"]["cached_tokens"]
                assert cached >= first["usage"]["input_tokens"]
                await ws.close(code=1001)
            await asyncio.sleep(2.5)  # past the grace period (2 s)
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(url, headers=auth)
            assert info.value.status == 404
        # the reaped session's KV is back in the engine
        llm = server.inspect(lambda: list(
            server.models["chat"].omni.orchestrator.engines.replicas.values())[0])
        for _ in range(100):
            if server.inspect(lambda: llm.stats.get("session_bytes")) == {}:
                break
            await asyncio.sleep(0.05)
        assert server.inspect(lambda: llm.stats.get("session_bytes")) == {}
    run(body())


def test_a_killed_replica_ends_its_sessions_with_an_error(server):
    async def body():
        async with client(server).realtime.connect(model="chat") as conn:
            await conn.recv()
            await text_turn(conn)
            replicas = server.inspect(lambda: list(
                server.models["chat"].omni.orchestrator.engines.replicas.values()))
            os.kill(replicas[0].process.pid, signal.SIGKILL)
            error = await asyncio.wait_for(conn.recv(), 30)
            assert error.type == "error" and error.error.code == "session_ended"
            assert "died" in error.error.message
    run(body())
