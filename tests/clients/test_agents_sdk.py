"""The OpenAI Agents SDK (openai-agents 0.24.0) on omni's chat completions, through
``OpenAIChatCompletionsModel``: a forced tool call whose arguments the tool receives
valid, its result sent back in the next turn, a streamed run, and ``output_type``."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import jsonschema
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from clientutil import MODEL, QUESTION, Recorder, Weather
from openai import AsyncOpenAI
from pydantic import Field

set_tracing_disabled(True)  # no trace export (it would go to api.openai.com)


def make_tools(calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, Any]:
    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=10)], unit: Literal["c", "f"],
                    days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """The weather forecast for a city."""
        calls.append(("get_weather", {"city": city, "unit": unit, "days": days}))
        return f"sunny in {city} for {days} days"

    @function_tool
    def get_time(zone: Literal["utc", "cet"]) -> str:
        """The time in a time zone."""
        calls.append(("get_time", {"zone": zone}))
        return f"noon {zone}"

    return get_weather, get_time


def model(server, recorder: Recorder) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=server.base_url, api_key="x",
                         http_client=recorder.async_client())
    return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)


def test_a_required_tool_call_runs_and_its_result_goes_back(omni_server):
    calls: list[tuple[str, dict[str, Any]]] = []
    recorder = Recorder()
    get_weather, _ = make_tools(calls)
    # tool_choice "required" on the first turn; reset_tool_choice (the default) drops it
    # once the tool ran, so the second turn may answer in text and the run ends
    agent = Agent(name="forecaster", instructions="Use the tool, then answer.",
                  tools=[get_weather], model=model(omni_server, recorder),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               max_tokens=200, extra_args={"seed": 7}))
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))

    assert len(calls) == 1, (calls, result.new_items, recorder.bodies)
    name, arguments = calls[0]
    assert name == "get_weather"
    jsonschema.validate(arguments, get_weather.params_json_schema)
    assert isinstance(result.final_output, str) and result.final_output
    first, second = recorder.chat_bodies()  # two turns, then the run finished
    assert first["tool_choice"] == "required" and first["parallel_tool_calls"] is False
    assert first["max_tokens"] == 200
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather"]
    assert "tool_choice" not in second
    # the call as the server made it, then the tool's result, in the history
    call_message, tool_message = second["messages"][-2:]
    [call] = call_message["tool_calls"]
    assert call_message["role"] == "assistant" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == arguments
    assert tool_message == {"role": "tool", "tool_call_id": call["id"],
                            "content": f"sunny in {arguments['city']} for "
                                       f"{arguments['days']} days"}


def test_a_streamed_run_calls_the_named_tool_and_stops_on_it(omni_server):
    calls: list[tuple[str, dict[str, Any]]] = []
    recorder = Recorder()
    get_weather, get_time = make_tools(calls)
    agent = Agent(name="clock", instructions="Use a tool.", tools=[get_weather, get_time],
                  model=model(omni_server, recorder), tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="get_time", max_tokens=400,
                                               extra_args={"seed": 3}))

    async def body() -> tuple[Any, list[str]]:
        run = Runner.run_streamed(agent, QUESTION, max_turns=2)
        events = [e.name async for e in run.stream_events() if e.type == "run_item_stream_event"]
        return run, events

    run, events = asyncio.run(body())
    [body_sent] = recorder.chat_bodies()  # one turn: the first tool's result ends the run
    assert body_sent["stream"] is True
    assert body_sent["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert calls and all(name == "get_time" for name, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(arguments, get_time.params_json_schema)
    assert events.count("tool_called") == len(calls) and "tool_output" in events
    assert run.final_output == f"noon {calls[0][1]['zone']}"


def test_output_type_gives_the_pydantic_object(omni_server):
    recorder = Recorder()
    agent = Agent(name="form", instructions="Fill in the form.", output_type=Weather,
                  model=model(omni_server, recorder),
                  model_settings=ModelSettings(max_tokens=200, extra_args={"seed": 5}))
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=1))
    assert isinstance(result.final_output, Weather)
    [sent] = recorder.chat_bodies()
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["strict"] is True
