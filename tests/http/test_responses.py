"""POST /v1/responses (and GET / DELETE of kept responses) through the unmodified openai
SDK and raw HTTP, on the echo pipelines of the shared server (fixed text: the exact
object and event stream, calls read from Hermes text, store, errors, failures and
aborts). The tiny random Qwen3 runs are in test_responses_ar.py."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from httputil import assert_error_object, parse_sse, run
from toolutil import CLOCK, WEATHER

URL = "/v1/responses"
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather",
          "parameters": WEATHER, "strict": True},
         {"type": "function", "name": "get_time", "parameters": CLOCK, "strict": True}]
CALLS_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris", "unit": "c", "days": 2}}\n</tool_call>\n<tool_call>\n'
              '{"name": "get_time", "arguments": {"zone": "cet"}}\n</tool_call>')
TEXT_EVENTS = ["response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


async def post(server, body: dict) -> tuple[int, object]:
    async with server.session() as session, session.post(URL, json=body) as resp:
        raw = await resp.read()
        if resp.content_type == "text/event-stream":
            return resp.status, parse_sse(raw)
        return resp.status, json.loads(raw)


def squeeze(types: list[str]) -> list[str]:
    """Event types with runs of the same delta type written once."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and
                                                    types[i - 1] == t)]


def test_whole_response_has_every_field(main_server):
    async def body():
        status, obj = await post(main_server, {"model": "streamy", "input": "hello there",
                                               "instructions": "be brief",
                                               "metadata": {"k": "v"}, "include": []})
        assert status == 200, obj
        assert obj["id"].startswith("resp_") and obj["object"] == "response"
        assert obj["status"] == "completed" and obj["error"] is None
        assert obj["incomplete_details"] is None and obj["model"] == "streamy"
        assert isinstance(obj["created_at"], int) and obj["store"] is True
        assert obj["parallel_tool_calls"] is True and obj["tool_choice"] == "auto"
        assert obj["tools"] == [] and obj["text"] == {"format": {"type": "text"}}
        assert obj["instructions"] == "be brief" and obj["metadata"] == {"k": "v"}
        assert obj["previous_response_id"] is None and obj["max_output_tokens"] is None
        [message] = obj["output"]
        assert message["type"] == "message" and message["id"].startswith("msg_")
        assert message["status"] == "completed" and message["role"] == "assistant"
        assert message["content"] == [{"type": "output_text", "text": "hello there",
                                       "annotations": [], "logprobs": []}]
        usage = obj["usage"]
        assert set(usage) == {"input_tokens", "input_tokens_details", "output_tokens",
                              "output_tokens_details", "total_tokens"}
        assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
        assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
        async with main_server.client() as client:
            sdk = await client.responses.create(model="streamy", input=[
                {"role": "developer", "content": "sys"},
                {"role": "user", "content": [{"type": "input_text", "text": "two "},
                                             {"type": "input_text", "text": "parts"}]}])
        assert sdk.output_text == "two parts" and sdk.status == "completed"
    run(body())


def test_stream_events_come_numbered_in_order(main_server):
    async def body():
        status, events = await post(main_server, {"model": "streamy", "stream": True,
                                                  "input": "streamed words here"})
        assert status == 200
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        types = [e["type"] for e in events]
        assert squeeze(types) == ["response.created", "response.in_progress", *TEXT_EVENTS,
                                  "response.completed"]
        assert types.count("response.output_text.delta") > 1  # streamy gives 4 chunks
        ids = {e["response"]["id"] for e in events if "response" in e}
        assert len(ids) == 1
        added, part = events[2], events[3]
        assert added["item"]["content"] == [] and added["item"]["status"] == "in_progress"
        assert part["part"] == {"type": "output_text", "text": "", "annotations": [],
                                "logprobs": []}
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert all(d["logprobs"] == [] and d["item_id"] == added["item"]["id"]
                   for d in deltas)
        assert "".join(d["delta"] for d in deltas) == "streamed words here"
        final = events[-1]["response"]
        assert final["output"] == [events[-2]["item"]] and final["usage"] is not None
        async with main_server.client() as client:
            async with client.responses.stream(model="streamy", input="via the sdk") as s:
                seen = [e.type async for e in s]
                response = await s.get_final_response()
        assert response.output_text == "via the sdk" and "response.completed" in seen
    run(body())


def _calls(output: list[dict]) -> list[tuple[str, dict]]:
    calls = []
    for item in output:
        if item["type"] == "function_call":
            assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
            assert item["status"] == "completed"
            calls.append((item["name"], json.loads(item["arguments"])))
    return calls


EXPECTED_CALLS = [("get_weather", {"city": "Paris", "unit": "c", "days": 2}),
                  ("get_time", {"zone": "cet"})]


def test_auto_reads_calls_from_fixed_text(main_server):
    async def body():
        request = {"model": "streamy", "input": CALLS_TEXT, "tools": TOOLS}
        status, whole = await post(main_server, request)
        assert status == 200, whole
        assert [i["type"] for i in whole["output"]] == ["message", "function_call",
                                                        "function_call"]
        assert whole["output"][0]["content"][0]["text"] == "Let me check."
        assert _calls(whole["output"]) == EXPECTED_CALLS
        assert whole["tools"] == [{**t, "description": t.get("description")} for t in TOOLS]
        _, events = await post(main_server, {**request, "stream": True})
        assert squeeze([e["type"] for e in events]) == [
            "response.created", "response.in_progress", *TEXT_EVENTS, *CALL_EVENTS,
            *CALL_EVENTS, "response.completed"]
        final = events[-1]["response"]["output"]
        assert _calls(final) == EXPECTED_CALLS
        assert final[0]["content"][0]["text"] == "Let me check."
        for event in events:
            if event["type"] == "response.output_item.added" and event["output_index"]:
                assert event["item"]["arguments"] == ""
        _, plain = await post(main_server, {**request, "tool_choice": "none"})
        assert [i["type"] for i in plain["output"]] == ["message"]
        assert plain["output"][0]["content"][0]["text"] == CALLS_TEXT
        async with main_server.client() as client:  # strict flat tools: parsed arguments
            async with client.responses.stream(model="streamy", input=CALLS_TEXT,
                                               tools=TOOLS) as stream:
                response = await stream.get_final_response()
        calls = [o for o in response.output if o.type == "function_call"]
        assert [(c.name, c.parsed_arguments) for c in calls] == EXPECTED_CALLS
    run(body())


def test_function_call_history_and_its_errors(main_server):
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time",
            "arguments": "{\"zone\": \"utc\"}", "id": "fc_1", "status": "completed"}
    answer = {"type": "function_call_output", "call_id": "call_1", "output": "noon"}

    async def body():
        async with main_server.client() as client:
            ok = await client.responses.create(
                model="streamy", tools=TOOLS, input=[{"role": "user", "content": "time?"},
                                                     call, answer])
            assert ok.output_text == "noon"  # echo: the last message, the tool's output
            for items, param in [
                    ([call, {**answer, "call_id": "call_9"}], "input[1].call_id"),
                    ([call, {k: v for k, v in answer.items() if k != "call_id"}],
                     "input[1].call_id"),
                    ([{"type": "web_search_call", "id": "x"}], "input[0].type"),
                    ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
                    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
                     "input[0].content[0].type"),
                    ([{"role": "critic", "content": "x"}], "input[0].role"),
                    ([call, {**answer, "output": [{"type": "input_image",
                                                   "image_url": "data:,"}]}],
                     "input[1].output[0].type")]:
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.responses.create(model="streamy", input=items)
                assert caught.value.body["param"] == param, (items, caught.value.body)
    run(body())


def test_store_previous_response_get_and_delete(main_server):
    async def body():
        async with main_server.client() as client:
            first = await client.responses.create(model="streamy", input="remember me")
            got = await client.responses.retrieve(first.id)
            assert got.id == first.id and got.output_text == "remember me"
            second = await client.responses.create(model="streamy", input="next",
                                                   previous_response_id=first.id)
            assert second.previous_response_id == first.id and second.output_text == "next"
            calls = await client.responses.create(model="streamy", input=CALLS_TEXT,
                                                  tools=TOOLS)
            call_id = calls.output[1].call_id  # answered in the next request alone
            answered = await client.responses.create(
                model="streamy", tools=TOOLS, previous_response_id=calls.id, input=[
                    {"type": "function_call_output", "call_id": call_id, "output": "rain"}])
            assert answered.output_text == "rain"
            await client.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(first.id)
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(model="streamy", input="again",
                                              previous_response_id=first.id)
            assert caught.value.body["param"] == "previous_response_id"
            assert caught.value.body["code"] == "previous_response_not_found"
            unkept = await client.responses.create(model="streamy", input="x", store=False)
            assert unkept.store is False
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(unkept.id)
            with pytest.raises(openai.NotFoundError):
                await client.responses.delete(unkept.id)
    run(body())


@pytest.mark.parametrize("change, param", [
    ({"model": "speech"}, "model"),
    ({"input": None}, "input"),
    ({"input": 5}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string",
                                               "pattern": "(?<=a)b"}}}}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {
        "type": "json_object"}}}, "tool_choice"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input[0].content[1]"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"seed": -1}, "seed"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
])
def test_bad_requests_are_400s_naming_the_field(main_server, change, param):
    async def body():
        request = {k: v for k, v in {"model": "streamy", "input": "hi", **change}.items()
                   if v is not None}
        status, error = await post(main_server, request)
        assert status == 400, error
        assert_error_object(error, type_="invalid_request_error", param=param)
    run(body())
    assert main_server.in_flight("streamy")["requests"] == []


def test_failure_after_the_stream_started(main_server):
    async def body():
        status, events = await post(main_server, {"model": "midfail", "stream": True,
                                                  "input": "abcdef"})
        assert status == 200
        error, failed = events[-2], events[-1]
        assert error["type"] == "error" and "injected failure" in error["message"]
        assert error["error"]["message"] == error["message"] and error["code"]
        assert failed["type"] == "response.failed"
        assert failed["response"]["status"] == "failed"
        assert "injected failure" in failed["response"]["error"]["message"]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        status, error = await post(main_server, {"model": "fail", "stream": True,
                                                 "input": "x"})
        assert status == 500  # failed before its first output: a status, not a stream
        assert_error_object(error, type_="server_error")
        async with main_server.client() as client:
            with pytest.raises(openai.APIError) as caught:
                async with client.responses.stream(model="midfail", input="abc") as stream:
                    async for _ in stream:
                        pass
        assert "injected failure" in caught.value.message
        assert not isinstance(caught.value, openai.APIStatusError)  # after the 200
    run(body())
    assert main_server.in_flight("midfail")["requests"] == []


def test_stream_disconnect_aborts_the_request(main_server):
    async def body():
        session = main_server.session()
        try:
            resp = await session.post(URL, json={"model": "slow", "stream": True,
                                                  "input": "x" * 40})
            assert resp.status == 200
            while b"output_text.delta" not in await asyncio.wait_for(
                    resp.content.readline(), 5.0):
                pass
            assert len(main_server.in_flight("slow")["requests"]) == 1
            resp.close()
        finally:
            await session.close()
        state = await main_server.wait_idle("slow", 2.0)  # it would take 4 s by itself
        assert state["requests"] == [] and not any(state["outstanding"].values()), state
    run(body())
