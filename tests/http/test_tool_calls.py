"""Tool calls in /v1/chat/completions through the unmodified openai SDK.

On the real AR engine (tiny random Qwen3): ``tool_choice`` "required" and a named function
give calls whose arguments follow the function's schema whatever the weights (the answer
is constrained), streamed as the SDK assembles them. ``auto`` cannot be tested on random
weights (they never choose a call), so it is tested on fixed text: the echo engine answers
with the user's message, which here holds Hermes-format calls, split over several chunks.
"""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from httputil import run
from pydantic import BaseModel, Field
from toolutil import CLOCK, SCHEMAS, WEATHER

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def tool(name: str, schema: dict, strict: bool = True) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                             "parameters": schema, "strict": strict}}


TOOLS = [tool("get_weather", WEATHER), tool("get_time", CLOCK)]


def _valid_calls(message) -> list[tuple[str, dict]]:
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)  # a JSON string, as OpenAI's
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


def test_required_gives_schema_valid_calls_whatever_the_weights(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=ASK, tools=TOOLS, tool_choice="required", n=4,
                temperature=1.0, seed=5, max_tokens=400)
        seen = []
        for choice in chat.choices:
            assert choice.finish_reason == "tool_calls", choice.message
            assert choice.message.content is None
            seen += _valid_calls(choice.message)
        assert len({json.dumps(c) for c in seen}) > 1  # the fixture's calls vary
    run(body())


def test_named_function_and_one_call_without_parallel(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=ASK, tools=TOOLS, n=3, temperature=1.0, seed=1,
                tool_choice={"type": "function", "function": {"name": "get_time"}},
                max_tokens=300)
            single = await client.chat.completions.create(
                model="qwen3", messages=ASK, tools=TOOLS, tool_choice="required", n=3,
                parallel_tool_calls=False, temperature=1.0, seed=2, max_tokens=300)
        for choice in chat.choices:
            assert [name for name, _ in _valid_calls(choice.message)] == ["get_time"] * len(
                choice.message.tool_calls)
        for choice in single.choices:
            assert len(_valid_calls(choice.message)) == 1
    run(body())


class Weather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)


def test_streamed_calls_assemble_in_the_sdk_with_parsed_arguments(ar_server):
    async def body():
        async with ar_server.client() as client:
            kwargs = dict(model="qwen3", messages=ASK, temperature=1.0, seed=11,
                          max_tokens=300, tool_choice="required",
                          tools=[openai.pydantic_function_tool(Weather, name="get_weather")])
            async with client.chat.completions.stream(**kwargs) as stream:
                chunks = [event.chunk async for event in stream if event.type == "chunk"]
                final = await stream.get_final_completion()
        fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls
                     or ()]
        assert len(fragments) > 2  # the arguments came in pieces
        by_index: dict[int, list] = {}
        for fragment in fragments:
            by_index.setdefault(fragment.index, []).append(fragment)
        assert sorted(by_index) == list(range(len(by_index)))
        for parts in by_index.values():  # id, type and name in the first fragment only
            assert parts[0].id and parts[0].type == "function" and parts[0].function.name
            assert all(p.id is None and p.function.name is None for p in parts[1:])
        message = final.choices[0].message
        assert final.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            assert isinstance(call.function.parsed_arguments, Weather)
    run(body())


def test_history_with_calls_and_tool_results_is_answered(ar_server):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]

    async def body():
        async with ar_server.client() as client:
            answer = await client.chat.completions.create(
                model="qwen3", messages=history, tools=TOOLS, max_tokens=5, temperature=0)
            assert answer.choices[0].message.role == "assistant"
            assert answer.usage.prompt_tokens > 60  # the tools and the result are in it
            bad = [*history[:2], {**history[2], "tool_call_id": "call_9"}]
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="qwen3", messages=bad,
                                                     max_tokens=5)
        assert caught.value.body["param"] == "messages[2].tool_call_id"
    run(body())


@pytest.mark.parametrize("change, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [tool("f", {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(?<=a)b"}}})]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tools": [tool("bad name!", CLOCK)]}, "tools[0].function.name"),
])
def test_bad_tools_are_400s_naming_the_field(ar_server, change, param):
    async def body():
        request = {"model": "qwen3", "messages": ASK, "tools": TOOLS, "max_tokens": 4,
                   **change}
        request = {k: v for k, v in request.items() if v is not None}
        async with ar_server.client() as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(**request)
        assert caught.value.body["param"] == param
    run(body())


CALLS_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris", "unit": "c", "days": 2}}\n</tool_call>\n<tool_call>\n'
              '{"name": "get_time", "arguments": {"zone": "cet"}}\n</tool_call>')


def test_auto_reads_calls_from_fixed_text(main_server):
    async def body():
        messages = [{"role": "user", "content": CALLS_TEXT}]
        async with main_server.client() as client:
            whole = await client.chat.completions.create(model="streamy", messages=messages,
                                                         tools=TOOLS)
            stream = await client.chat.completions.create(
                model="streamy", messages=messages, tools=TOOLS, stream=True)
            chunks = [c async for c in stream]
            plain = await client.chat.completions.create(
                model="streamy", messages=messages, tools=TOOLS, tool_choice="none")
        message = whole.choices[0].message
        assert whole.choices[0].finish_reason == "tool_calls"
        assert message.content == "Let me check."
        assert _valid_calls(message) == [("get_weather", {"city": "Paris", "unit": "c",
                                                          "days": 2}),
                                         ("get_time", {"zone": "cet"})]
        streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls
                    or ()]
        arguments = {}
        for fragment in streamed:
            arguments[fragment.index] = arguments.get(fragment.index, "") + (
                fragment.function.arguments or "")
        assert [json.loads(a) for a in arguments.values()] == [
            json.loads(c.function.arguments) for c in message.tool_calls]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert plain.choices[0].message.content == CALLS_TEXT  # none: nothing is read
        assert plain.choices[0].message.tool_calls is None
    run(body())


def test_tools_beside_a_response_format(ar_server):
    """required: the calls are the answer (the format is for a text answer); auto: the
    answer is the format's JSON or calls, whatever the weights."""
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "strict": True,
                                                  "schema": WEATHER}}

    async def body():
        async with ar_server.client() as client:
            required = await client.chat.completions.create(
                model="qwen3", messages=ASK, tools=TOOLS, tool_choice="required",
                response_format=fmt, max_tokens=300, seed=4)
            auto = await client.chat.completions.create(
                model="qwen3", messages=ASK, tools=TOOLS, response_format=fmt, n=4,
                temperature=1.0, max_tokens=300, seed=9)
        assert required.choices[0].finish_reason == "tool_calls"
        _valid_calls(required.choices[0].message)
        for choice in auto.choices:
            if choice.message.tool_calls:
                _valid_calls(choice.message)
            else:
                jsonschema.validate(json.loads(choice.message.content), WEATHER)
    run(body())


def test_objects_without_additional_properties_get_no_other_keys(ar_server):
    """A schema as instructor and pipecat send it (no additionalProperties): the calls
    hold only the listed keys, whatever the weights (objects are closed)."""
    open_schema = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                   "required": ["zone"]}

    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=ASK, n=4, temperature=1.0, seed=21, max_tokens=200,
                tools=[tool("get_time", open_schema, strict=False)], tool_choice="required")
        for choice in chat.choices:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert set(json.loads(call.function.arguments)) == {"zone"}
    run(body())
