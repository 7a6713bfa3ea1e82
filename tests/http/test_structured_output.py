"""response_format (json_object, json_schema) over HTTP on the real AR engine (tiny
random Qwen3), through the unmodified openai SDK: answers parse and validate whatever the
weights, streamed deltas concatenate to the same JSON, refused schemas are 400s."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from httputil import assert_error_object, run
from pydantic import BaseModel, Field

HELLO = [{"role": "user", "content": "Describe a pet as JSON"}]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "kind": {"enum": ["cat", "dog", "fish"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3}},
    "required": ["name", "age", "kind", "tags"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA,
                                                 "strict": True}}


class Pet(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]


def test_chat_json_schema_validates_and_n_choices_vary(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=HELLO, n=4, temperature=1.0, seed=3, max_tokens=300,
                response_format=FORMAT)
        answers = []
        for choice in chat.choices:
            assert choice.finish_reason == "stop", choice.message.content
            answers.append(json.loads(choice.message.content))
            jsonschema.validate(answers[-1], SCHEMA)
        assert len({json.dumps(a) for a in answers}) > 1
    run(body())


def test_completion_json_schema_and_free_text_together(ar_server):
    async def body():
        import asyncio
        async with ar_server.client() as client:
            constrained, free = await asyncio.gather(
                client.completions.create(model="qwen3", prompt="A pet:", max_tokens=300,
                                          temperature=0, extra_body={"response_format": FORMAT}),
                client.completions.create(model="qwen3", prompt="A pet:", max_tokens=8,
                                          temperature=0, extra_body={"ignore_eos": True}))
        jsonschema.validate(json.loads(constrained.choices[0].text), SCHEMA)
        assert constrained.choices[0].finish_reason == "stop"
        assert not free.choices[0].text.startswith("{") and free.usage.completion_tokens == 8
    run(body())


def test_streamed_deltas_concatenate_to_valid_json(ar_server):
    async def body():
        async with ar_server.client() as client:
            stream = await client.chat.completions.create(
                model="qwen3", messages=HELLO, stream=True, temperature=0, max_tokens=300,
                response_format=FORMAT)
            chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
        assert chunks[-1].choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
    run(body())


def test_json_object(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=HELLO, n=4, temperature=1.0, seed=1, max_tokens=60,
                response_format={"type": "json_object"})
        for choice in chat.choices:
            text = choice.message.content
            assert text.startswith("{"), text
            if choice.finish_reason == "stop":
                assert isinstance(json.loads(text), dict)
    run(body())


def test_sdk_parse_with_a_pydantic_model(ar_server):
    async def body():
        async with ar_server.client() as client:
            done = await client.beta.chat.completions.parse(
                model="qwen3", messages=HELLO, temperature=0, max_tokens=300, response_format=Pet)
        pet = done.choices[0].message.parsed
        assert isinstance(pet, Pet) and pet.kind in ("cat", "dog", "fish")
    run(body())


@pytest.mark.parametrize("response_format, needle", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "(?<=a)b"}}}, "look-behind"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}},
     "nope"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "description": "x" * 40_000}}}, "at most"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "xml"}, "must be one of"),
])
def test_bad_response_format_is_a_400(ar_server, response_format, needle):
    async def body():
        async with ar_server.session() as session:
            for path, extra in (("/v1/chat/completions", {"messages": HELLO}),
                                ("/v1/completions", {"prompt": "hi"})):
                async with session.post(path, json={"model": "qwen3", **extra,
                                                    "response_format": response_format}) as r:
                    assert r.status == 400
                    error = assert_error_object(await r.json())
                    assert error["param"].startswith("response_format"), error
                    assert needle.lower() in error["message"].lower(), error
        assert not (await ar_server.wait_idle("qwen3"))["requests"]
    run(body())


def test_sdk_sees_the_400(ar_server):
    async def body():
        async with ar_server.client() as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(
                    model="qwen3", messages=HELLO, response_format={
                        "type": "json_schema", "json_schema": {"name": "x", "schema": {
                            "type": "string", "pattern": "(?<=a)b"}}})
        assert caught.value.body["param"] == "response_format"
    run(body())


def test_json_with_a_spoken_answer_is_a_400(ar_server):
    async def body():
        async with ar_server.session() as session:
            async with session.post("/v1/chat/completions", json={
                    "model": "qwen3", "messages": HELLO, "modalities": ["text", "audio"],
                    "audio": {"voice": "alloy", "format": "wav"},
                    "response_format": {"type": "json_object"}}) as r:
                assert r.status == 400
                assert_error_object(await r.json(), param="response_format")
    run(body())
