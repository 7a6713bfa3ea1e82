"""The OpenAI Agents SDK (openai-agents, protocols.md §10.9) driving /v1/responses: a
whole tool loop (the model's calls run, their outputs replayed as function_call and
function_call_output items, the next answer read), plain and streamed.

On the echo model the loop is fixed text: it answers with the user's message, which holds
two Hermes calls, and then with the last tool output. On the tiny random Qwen3 a required
call is constrained to the tool's schema (a Literal, so the random model finishes it).
Skipped where the Agents SDK is not installed (it is not among the test extras)."""

from __future__ import annotations

from typing import Literal

import pytest
from httputil import one_stage, run
from test_responses import CALLS_TEXT

from omni.fixtures.tiny_models import ensure_tiny_model

agents = pytest.importorskip("agents")


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    # not the shared server: its 1 KiB request limit is less than an agent's request
    qwen3 = ensure_tiny_model("qwen3", tmp_path_factory.mktemp("models"))
    return start_server({"streamy": one_stage("streamy", params="{chunks: 4}"),
                         "qwen3": str(qwen3)})


def _agent(server, client, model: str, tools: list, **kwargs):
    from agents import Agent, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    return Agent(name="tester", instructions="be brief", tools=tools,
                 model=OpenAIResponsesModel(model=model, openai_client=client), **kwargs)


async def _both_ways(agent, question: str) -> list:
    """The final output of a plain run, then of a streamed one."""
    from agents import Runner

    plain = await Runner.run(agent, question)
    streamed = Runner.run_streamed(agent, question)
    async for _ in streamed.stream_events():
        pass
    return [plain.final_output, streamed.final_output]


def test_a_tool_loop_on_fixed_text(server):
    from agents import function_tool
    ran = []

    @function_tool
    def get_weather(city: str, unit: str, days: int) -> str:
        """The weather."""
        ran.append(("get_weather", city, unit, days))
        return "sunny"

    @function_tool
    def get_time(zone: str) -> str:
        """The time."""
        ran.append(("get_time", zone))
        return "noon"

    async def body():
        async with server.client() as client:
            agent = _agent(server, client, "streamy", [get_weather, get_time])
            return await _both_ways(agent, CALLS_TEXT)
    assert run(body()) == ["noon", "noon"]  # the echo of the last function_call_output
    assert ran == [("get_weather", "Paris", "c", 2), ("get_time", "cet")] * 2


def test_a_required_call_on_random_weights(server):
    from agents import ModelSettings, function_tool
    zones = []

    @function_tool
    def get_time(zone: Literal["utc", "cet"]) -> str:
        """The time."""
        zones.append(zone)
        return "noon"

    async def body():
        async with server.client() as client:
            agent = _agent(server, client, "qwen3", [get_time],
                           tool_use_behavior="stop_on_first_tool",
                           model_settings=ModelSettings(
                               tool_choice="required", parallel_tool_calls=False,
                               max_tokens=100, temperature=1.0))
            return await _both_ways(agent, "What time is it?")
    assert run(body()) == ["noon", "noon"]
    assert len(zones) == 2 and set(zones) <= {"utc", "cet"}
