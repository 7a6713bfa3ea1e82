"""The OpenAI Agents SDK (openai-agents 0.24.0) on omni's /v1/responses, through
``OpenAIResponsesModel`` (the SDK's default model class): a required tool call whose
arguments the tool receives valid, replayed with its result as function_call and
function_call_output items in the next turn, whose answer is the agent's typed final
output (``output_type``: a json_schema ``text.format``, so random weights finish it;
free text would run to max_output_tokens, which the SDK treats as a failed turn), plain
and streamed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from clientutil import MODEL, QUESTION, Recorder, Weather
from openai import AsyncOpenAI
from test_agents_sdk import make_tools

set_tracing_disabled(True)  # no trace export (it would go to api.openai.com)


def responses_bodies(recorder: Recorder) -> list[dict[str, Any]]:
    return [b for b in recorder.bodies if "input" in b]


def run_agent(server, streamed: bool, seed: int) -> tuple[list, Any, list[dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    recorder = Recorder()
    get_weather, _ = make_tools(calls)
    client = AsyncOpenAI(base_url=server.base_url, api_key="x",
                         http_client=recorder.async_client())
    # "required" on the first turn; reset_tool_choice (the default) drops it once the
    # tool ran, so the second turn may answer in text and the run ends
    agent = Agent(name="forecaster", instructions="Use the tool, then answer.",
                  tools=[get_weather], output_type=Weather, model=OpenAIResponsesModel(model=MODEL,
                                                                  openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               max_tokens=200, extra_body={"seed": seed}))

    async def body() -> Any:
        if not streamed:
            return await Runner.run(agent, QUESTION, max_turns=3)
        run = Runner.run_streamed(agent, QUESTION, max_turns=3)
        async for _ in run.stream_events():
            pass
        return run
    return calls, asyncio.run(body()), responses_bodies(recorder)


def check_loop(calls, result, bodies, tool) -> None:
    assert len(calls) == 1, (calls, bodies)
    name, arguments = calls[0]
    assert name == "get_weather"
    jsonschema.validate(arguments, tool.params_json_schema)
    assert isinstance(result.final_output, Weather)
    first, second = bodies  # two turns, then the run finished
    assert first["tool_choice"] == "required" and first["parallel_tool_calls"] is False
    assert [t["name"] for t in first["tools"]] == ["get_weather"]  # the flat tool shape
    assert "tool_choice" not in second
    assert second["text"]["format"]["type"] == "json_schema"
    call, output = [i for i in second["input"] if i.get("type") in (
        "function_call", "function_call_output")]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == arguments
    assert output == {"call_id": call["call_id"], "type": "function_call_output",
                      "output": f"sunny in {arguments['city']} for {arguments['days']} days"}


def test_a_required_call_runs_and_its_output_goes_back(omni_server):
    calls, result, bodies = run_agent(omni_server, streamed=False, seed=7)
    check_loop(calls, result, bodies, make_tools([])[0])


def test_the_same_loop_streamed(omni_server):
    calls, result, bodies = run_agent(omni_server, streamed=True, seed=8)
    check_loop(calls, result, bodies, make_tools([])[0])
    assert all(b.get("stream") is True for b in bodies)
