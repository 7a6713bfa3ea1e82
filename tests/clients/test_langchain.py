"""langchain-openai (1.8.1) ``ChatOpenAI`` on omni's chat completions: ``bind_tools``
with a forced call gives ``AIMessage.tool_calls`` with schema-valid args (also streamed),
and ``with_structured_output`` (json_schema, strict) gives the pydantic object."""

from __future__ import annotations

from typing import Annotated, Literal

import jsonschema
from clientutil import MODEL, QUESTION, WEATHER_SCHEMA, Recorder, Weather
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import Field


@tool
def get_weather(city: Annotated[str, Field(max_length=10)], unit: Literal["c", "f"],
                days: Annotated[int, Field(ge=1, le=7)]) -> str:
    """The weather forecast for a city."""
    return f"sunny in {city}"


def chat(server, recorder: Recorder, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.base_url, api_key="x", model=MODEL, max_tokens=300,
                      http_client=recorder.client(), http_async_client=recorder.async_client(),
                      **kwargs)


def test_bind_tools_with_a_forced_call_gives_valid_tool_calls(omni_server):
    recorder = Recorder()
    llm = chat(omni_server, recorder, temperature=1.0, seed=4)
    # strict=True: additionalProperties false, so the call holds exactly the tool's args
    named = llm.bind_tools([get_weather], tool_choice="get_weather", strict=True)
    required = llm.bind_tools([get_weather], tool_choice="required", strict=True,
                              parallel_tool_calls=False, seed=9)
    messages = [named.invoke(QUESTION), required.invoke(QUESTION)]
    chunks = list(named.stream(QUESTION))

    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk  # langchain merges the tool_call_chunks by index
    assert len(chunks) > 3  # the arguments came in pieces
    for message in [*messages, streamed]:
        assert isinstance(message, AIMessage) and message.tool_calls, message
        assert not message.invalid_tool_calls
        assert message.response_metadata["finish_reason"] == "tool_calls"
        for call in message.tool_calls:
            assert call["name"] == "get_weather" and call["id"].startswith("call_")
            jsonschema.validate(call["args"], WEATHER_SCHEMA)
    assert len(messages[1].tool_calls) == 1  # parallel_tool_calls=False
    # the same request streamed (same seed) assembles into the same calls; another seed
    # gives other ones: they come from the weights, not a stub
    assert [c["args"] for c in streamed.tool_calls] == [c["args"] for c in messages[0].tool_calls]
    assert messages[0].tool_calls[0]["args"] != messages[1].tool_calls[0]["args"]
    sent = recorder.chat_bodies()
    assert sent[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent[1]["tool_choice"] == "required" and sent[1]["parallel_tool_calls"] is False
    assert sent[2]["stream"] is True


def test_with_structured_output_json_schema_gives_the_object(omni_server):
    recorder = Recorder()
    llm = chat(omni_server, recorder, temperature=1.0, seed=6)
    structured = llm.with_structured_output(Weather, method="json_schema", strict=True)
    answers = structured.batch([QUESTION, "And in Rome?"])
    assert all(isinstance(a, Weather) for a in answers), answers
    assert answers[0] != answers[1]
    for sent in recorder.chat_bodies():
        assert sent["response_format"]["type"] == "json_schema"
        assert sent["response_format"]["json_schema"]["strict"] is True
