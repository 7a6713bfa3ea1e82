"""POST /v1/responses on the real AR engine (tiny random Qwen3), through the unmodified
openai SDK: ``tool_choice`` required / named give schema-valid function_call items and
``text.format`` json_schema parses, whatever the weights (the answer is constrained);
past calls and their outputs, and a stored conversation, reach the prompt; the length
limit makes an incomplete response. The fixed-text cases are in test_responses.py."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import openai
from httputil import parse_sse, run
from pydantic import BaseModel, Field
from test_responses import CALL_EVENTS, TOOLS, squeeze
from toolutil import SCHEMAS

ASK = "What is the weather in Paris?"


def _valid_calls(response) -> list[tuple[str, dict]]:
    calls = []
    for item in response.output:
        assert item.type == "function_call", item  # constrained: calls only
        assert item.id.startswith("fc_") and item.call_id.startswith("call_")
        arguments = json.loads(item.arguments)
        jsonschema.validate(arguments, SCHEMAS[item.name])
        calls.append((item.name, arguments))
    assert calls
    return calls


async def _each_seed(client, seeds, **kwargs) -> list:
    return await asyncio.gather(*(client.responses.create(
        model="qwen3", temperature=1.0, extra_body={"seed": s}, **kwargs) for s in seeds))


def test_required_and_named_give_schema_valid_calls(ar_server):
    async def body():
        async with ar_server.client() as client:
            required = await _each_seed(client, range(4), input=ASK, tools=TOOLS,
                                        tool_choice="required", max_output_tokens=400)
            named = await _each_seed(client, range(2), input=ASK, tools=TOOLS,
                                     tool_choice={"type": "function", "name": "get_time"},
                                     max_output_tokens=300)
            single = await _each_seed(client, range(2), input=ASK, tools=TOOLS,
                                      tool_choice="required", parallel_tool_calls=False,
                                      max_output_tokens=300)
        seen = []
        for response in required:
            assert response.status == "completed", response
            seen += _valid_calls(response)
        assert len({json.dumps(c) for c in seen}) > 1  # the random model's calls vary
        for response in named:
            assert {name for name, _ in _valid_calls(response)} == {"get_time"}
        for response in single:
            assert len(_valid_calls(response)) == 1 and response.parallel_tool_calls is False
    run(body())


class Weather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)


def test_streamed_calls_assemble_in_the_sdk(ar_server):
    async def body():
        async with ar_server.client() as client:
            async with client.responses.stream(
                    model="qwen3", input=ASK, temperature=1.0, max_output_tokens=300,
                    tool_choice="required", extra_body={"seed": 3},
                    tools=[openai.pydantic_function_tool(Weather, name="get_weather")]
                    ) as stream:
                events = [event async for event in stream]
                final = await stream.get_final_response()
        types = [e.type for e in events]
        body = squeeze(types[2:-1])
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] == "response.completed"
        assert body == CALL_EVENTS * (len(body) // len(CALL_EVENTS)) and body, types
        assert types.count("response.function_call_arguments.delta") > len(body) // 4
        assert [e.sequence_number for e in events] == list(range(len(events)))
        for call in final.output:
            assert call.type == "function_call" and isinstance(call.parsed_arguments, Weather)
    run(body())


class Pet(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]


def test_text_format_json_schema_parses_whatever_the_weights(ar_server):
    async def body():
        async with ar_server.client() as client:
            parsed = await asyncio.gather(*(client.responses.parse(
                model="qwen3", input="Describe a pet as JSON", text_format=Pet,
                temperature=1.0, max_output_tokens=300, extra_body={"seed": s})
                for s in range(3)))
            async with client.responses.stream(
                    model="qwen3", input="A pet?", text_format=Pet, temperature=1.0,
                    max_output_tokens=300, extra_body={"seed": 7}) as stream:
                streamed = await stream.get_final_response()
        for response in [*parsed, streamed]:
            assert response.status == "completed", response.output_text
            assert isinstance(response.output_parsed, Pet)
            assert response.text.format.type == "json_schema"
        assert len({p.output_text for p in parsed}) > 1
    run(body())


def test_past_calls_and_stored_conversations_reach_the_prompt(ar_server):
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Paris\", \"unit\": \"c\", \"days\": 1}"}
    result = {"type": "function_call_output", "call_id": "call_1",
              "output": "sunny, 21 C, light wind from the west"}

    async def body():
        async with ar_server.client() as client:
            ask = dict(model="qwen3", tools=TOOLS, max_output_tokens=4, temperature=0)
            plain = await client.responses.create(input=ASK, **ask)
            turn = await client.responses.create(
                input=[{"role": "user", "content": ASK}, call, result], **ask)
            assert turn.status in ("completed", "incomplete")
            assert turn.usage.input_tokens > plain.usage.input_tokens + 10  # call + result
            follow = await client.responses.create(input="And tomorrow?",
                                                   previous_response_id=turn.id, **ask)
            fresh = await client.responses.create(input="And tomorrow?", **ask)
        # the follow-up's prompt holds the whole stored turn before its own question
        assert follow.usage.input_tokens > turn.usage.input_tokens
        assert follow.usage.input_tokens > fresh.usage.input_tokens + 10
    run(body())


def test_length_limit_makes_an_incomplete_response(ar_server):
    async def body():
        request = {"model": "qwen3", "input": ASK, "max_output_tokens": 3}
        async with ar_server.client() as client:
            whole = await client.responses.create(**request, extra_body={"ignore_eos": True})
        assert whole.status == "incomplete"
        assert whole.incomplete_details.reason == "max_output_tokens"
        assert whole.usage.output_tokens == 3 and whole.output[0].status == "incomplete"
        async with ar_server.session() as session:
            async with session.post("/v1/responses", json={**request, "stream": True,
                                                                  "ignore_eos": True}) as r:
                events = parse_sse(await r.read())
        assert events[-1]["type"] == "response.incomplete"
        assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        assert events[-2]["item"]["status"] == "incomplete"
    run(body())
