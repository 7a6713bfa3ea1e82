"""instructor (1.17.0) on omni's chat completions: ``response_model`` through
``Mode.JSON_SCHEMA`` (response_format json_schema) and ``Mode.TOOLS`` (a call to the
model's function, named in tool_choice), sync and async. (``Mode.TOOLS_STRICT`` is
deprecated in 1.17: it sends what ``Mode.TOOLS`` sends.)"""

from __future__ import annotations

import asyncio

import instructor
import pytest
from clientutil import MODEL, QUESTION, Recorder, Weather
from openai import AsyncOpenAI, OpenAI

FUNCTION_CHOICE = {"type": "function", "function": {"name": "Weather"}}


@pytest.mark.parametrize("mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS])
def test_response_model_comes_back_valid(omni_server, mode):
    recorder = Recorder()
    client = instructor.from_openai(
        OpenAI(base_url=omni_server.base_url, api_key="x", http_client=recorder.client()),
        mode=mode)
    answers = [client.chat.completions.create(
        model=MODEL, response_model=Weather, max_retries=0, max_tokens=300, temperature=1.0,
        seed=seed, messages=[{"role": "user", "content": QUESTION}]) for seed in (1, 2)]
    assert all(isinstance(a, Weather) for a in answers)
    assert answers[0] != answers[1]  # from the weights (two seeds), not a stub
    sent = recorder.chat_bodies()
    assert len(sent) == 2  # max_retries=0: each answer validated the first time
    if mode is instructor.Mode.JSON_SCHEMA:
        assert sent[0]["response_format"]["type"] == "json_schema"
    else:
        assert sent[0]["tool_choice"] == FUNCTION_CHOICE
        # Weather's extra="forbid" is what bounds the call: instructor sends no "strict"
        assert sent[0]["tools"][0]["function"]["parameters"]["additionalProperties"] is False


def test_async_client(omni_server):
    client = instructor.from_openai(AsyncOpenAI(base_url=omni_server.base_url, api_key="x"),
                                    mode=instructor.Mode.TOOLS)

    async def body() -> list[Weather]:
        return await asyncio.gather(*(client.chat.completions.create(
            model=MODEL, response_model=Weather, max_retries=0, max_tokens=300, seed=seed,
            messages=[{"role": "user", "content": QUESTION}]) for seed in (3, 4)))

    answers = asyncio.run(body())
    assert all(isinstance(a, Weather) for a in answers) and answers[0] != answers[1]
