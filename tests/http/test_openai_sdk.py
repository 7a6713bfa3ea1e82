"""The unmodified openai SDK against a real server: completions, chat (plain and
streamed), models, routing between several served pipelines, and request ids."""

from __future__ import annotations

import asyncio

import openai
import pytest
from httputil import MAIN_PIPELINES, parse_sse, run


def test_completion_returns_echoed_prompt(main_server):
    async def body():
        async with main_server.client() as client:
            completion = await client.completions.create(model="echo", prompt="hello")
        assert completion.object == "text_completion"
        assert completion.model == "echo"
        assert completion.id.startswith("cmpl-")
        assert [c.text for c in completion.choices] == ["hello"]
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage is not None
        assert completion.usage.total_tokens == (completion.usage.prompt_tokens
                                                 + completion.usage.completion_tokens)
    run(body())


def test_chat_returns_last_user_message(main_server):
    async def body():
        async with main_server.client() as client:
            chat = await client.chat.completions.create(model="echo", messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "what is omni?"},
            ])
        assert chat.object == "chat.completion"
        assert chat.id.startswith("chatcmpl-")
        assert chat.model == "echo"
        assert len(chat.choices) == 1
        message = chat.choices[0].message
        assert message.role == "assistant"
        assert message.content == "what is omni?"
        assert chat.choices[0].finish_reason == "stop"
        assert chat.usage is not None
    run(body())


def test_chat_accepts_content_parts(main_server):
    async def body():
        async with main_server.client() as client:
            chat = await client.chat.completions.create(model="echo", messages=[
                {"role": "user", "content": [{"type": "text", "text": "part one, "},
                                             {"type": "text", "text": "part two"}]}])
        assert chat.choices[0].message.content == "part one, part two"
    run(body())


def test_streaming_chat_deltas_finish_and_usage(main_server):
    text = "streaming through four pieces"

    async def body():
        async with main_server.client() as client:
            stream = await client.chat.completions.create(
                model="streamy", messages=[{"role": "user", "content": text}], stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
        assert chunks, "no chunks"
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
        assert len({c.created for c in chunks}) == 1
        with_choices = [c for c in chunks if c.choices]
        contents = [c.choices[0].delta.content for c in with_choices
                    if c.choices[0].delta.content]
        assert "".join(contents) == text
        assert len(contents) == 4  # params: {chunks: 4} -> four content deltas
        roles = [c.choices[0].delta.role for c in with_choices if c.choices[0].delta.role]
        assert roles == ["assistant"]  # role only once
        finishes = [c.choices[0].finish_reason for c in with_choices
                    if c.choices[0].finish_reason]
        assert finishes == ["stop"]
        assert with_choices[-1].choices[0].finish_reason == "stop"
        # the usage chunk is the last one, with no choices
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens == (chunks[-1].usage.prompt_tokens
                                                 + chunks[-1].usage.completion_tokens)
        assert all(c.usage is None for c in chunks[:-1])
    run(body())


def test_streaming_chat_wire_framing(main_server):
    """Raw SSE: text/event-stream, the usage chunk last before [DONE]."""
    async def body():
        async with main_server.session() as session:
            async with session.post("/v1/chat/completions", json={
                    "model": "streamy", "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "abcdefgh"}]}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                events = parse_sse(await resp.read())
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] >= 0
        assert events.count("[DONE]") == 1
    run(body())


def test_streaming_chat_usage_null_before_usage_chunk(main_server):
    async def body():
        async with main_server.session() as session:
            async with session.post("/v1/chat/completions", json={
                    "model": "streamy", "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "abcdefgh"}]}) as resp:
                events = parse_sse(await resp.read())
        earlier = [e for e in events[:-2]]
        assert earlier and all("usage" in e and e["usage"] is None for e in earlier)
    run(body())


def test_streaming_completion(main_server):
    async def body():
        async with main_server.client() as client:
            stream = await client.completions.create(model="streamy", prompt="0123456789ab",
                                                     stream=True)
            chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == "0123456789ab"
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert all(c.id.startswith("cmpl-") for c in chunks)
    run(body())


def test_models_list_and_retrieve(main_server):
    async def body():
        async with main_server.client() as client:
            page = await client.models.list()
            ids = [m.id for m in page.data]
            assert sorted(ids) == sorted(MAIN_PIPELINES)
            for model in page.data:
                assert model.object == "model"
                assert isinstance(model.created, int) and model.created > 0
                assert model.owned_by
            chain = await client.models.retrieve("chain")
            assert chain.id == "chain" and chain.object == "model"
            assert set(chain.model_extra["modalities"]) == {"text", "audio"}
            assert chain.model_extra["test"] is True  # served metadata is passed through
            with pytest.raises(openai.NotFoundError) as info:
                await client.models.retrieve("no-such-model")
            assert info.value.code == "model_not_found"
    run(body())


def test_requests_are_routed_by_model(main_server):
    """Two pipelines in one server: each request runs on the one its `model` names."""
    async def body():
        asks = [(model, f"to {model} #{i}") for i in range(3) for model in ("echo", "chain")]
        async with main_server.client() as client:
            results = await asyncio.gather(*(
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}])
                for model, text in asks))
        assert [(c.model, c.choices[0].message.content) for c in results] == asks
        # the engines really ran: each pipeline's stages saw exactly its own requests
        done = main_server.inspect(lambda: {
            (labels["pipeline"], labels.get("stage")) for metric in
            main_server.metrics.registry.collect() if metric.name == "omni_stage_latency_seconds"
            for s in metric.samples for labels in [s.labels]
            if s.name.endswith("_count") and s.value > 0})
        assert {("echo", "echo"), ("chain", "a"), ("chain", "b"), ("chain", "c")} <= done
        assert ("chain", "side") not in done  # a text request does not run the audio branch
    run(body())


def test_unknown_model_is_not_found(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.NotFoundError) as info:
                await client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 404
        assert info.value.code == "model_not_found"
        assert info.value.param == "model"
        assert info.value.type == "invalid_request_error"
        assert "echo" in info.value.message and "chain" in info.value.message
    run(body())


def test_request_id_header_and_response_ids(main_server):
    async def body():
        async with main_server.session() as session:
            async with session.post("/v1/chat/completions", headers={"X-Request-Id": "abc123"},
                                    json={"model": "echo",
                                          "messages": [{"role": "user", "content": "x"}]}) as r:
                assert r.status == 200
                assert r.headers["X-Request-Id"] == "abc123"
                chat = await r.json()
            assert chat["id"].startswith("chatcmpl-")  # ours; the client id rides in the header
            async with session.post("/v1/completions", headers={"X-Request-Id": "def456"},
                                    json={"model": "echo", "prompt": "x"}) as r:
                assert "def456" in r.headers["X-Request-Id"]
                assert (await r.json())["id"].startswith("cmpl-")
            async with session.post("/v1/chat/completions", headers={"X-Request-Id": "s789"},
                                    json={"model": "echo", "stream": True,
                                          "messages": [{"role": "user", "content": "x"}]}) as r:
                assert "s789" in r.headers["X-Request-Id"]
                events = parse_sse(await r.read())
            ids_seen = {e["id"] for e in events if e != "[DONE]"}
            assert len(ids_seen) == 1 and ids_seen.pop().startswith("chatcmpl-")
            # without the header the server picks distinct ids
            ids = set()
            for _ in range(2):
                async with session.post("/v1/completions",
                                        json={"model": "echo", "prompt": "x"}) as r:
                    ids.add((await r.json())["id"])
                    assert r.headers["X-Request-Id"] in ids
            assert len(ids) == 2
    run(body())


def test_duplicate_request_id_header_does_not_fail(main_server):
    async def body():
        request = {"model": "slow", "stream": True,
                   "messages": [{"role": "user", "content": "x"}]}
        headers = {"X-Request-Id": "same-id"}
        async with main_server.session() as s1, main_server.session() as s2:
            async with s1.post("/v1/chat/completions", headers=headers, json=request) as r1:
                assert r1.status == 200  # the first is streaming (4 s in total)
                async with s2.post("/v1/chat/completions", headers=headers,
                                   json=request) as r2:
                    assert r2.status == 200, await r2.text()
    try:
        run(body())
    finally:
        run(main_server.wait_idle("slow", 3.0))
