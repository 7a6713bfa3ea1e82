"""A text stage on vllm (`engine: vllm`) behind the same HTTP APIs, with the unmodified
openai SDK: the same answers as an `engine: ar` stage on the same model. Runs where vllm
is installed (tests/unit/test_vllm_engine.py says why that is its own environment)."""

from __future__ import annotations

import pytest
from httputil import run

from omni.engines.vllm.engine import available

pytestmark = pytest.mark.skipif(not available(), reason="vllm is not installed here")

PIPELINE = """\
name: {name}
stages:
  - name: llm
    engine: {engine}
    model_dir: {model_dir}
    memory: 256MiB
    final_output: text
    options: {options}
"""
OPTIONS = {"vllm": "{vllm_args: {max_model_len: 512}}", "ar": "{}"}  # vllm_args: vllm's alone
HELLO = [{"role": "user", "content": "Tell me a story"}]
FIXED = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    from omni.fixtures import build_tiny_qwen3

    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("m") / "q64", head_dim=64,
                                 initializer_range=0.5)  # greedy answers that vary
    # vllm compiles its model at load (44 s on a 2-core machine with a cold compile cache,
    # next to the ar stage loading): more than the default start timeout
    return start_server({name: PIPELINE.format(name=name, engine=name, model_dir=model_dir,
                                               options=OPTIONS[name])
                         for name in ("vllm", "ar")}, start_timeout_s=300.0)


def test_chat_and_completions_equal_the_ar_stage(server):
    async def body():
        async with server.client() as client:
            answers = {}
            for model in ("vllm", "ar"):
                chat = await client.chat.completions.create(model=model, messages=HELLO,
                                                            **FIXED)
                done = await client.completions.create(model=model, prompt="Once upon",
                                                       **FIXED)
                answers[model] = (chat.choices[0].message.content, chat.usage.prompt_tokens,
                                  chat.usage.completion_tokens, done.usage.completion_tokens,
                                  done.choices[0].text)
        assert answers["vllm"][:4] == answers["ar"][:4] == (answers["ar"][0], 15, 8, 8)
        # the random model's tokens here end inside a UTF-8 character: our detokenizer
        # flushes it as U+FFFD (as tokenizer.decode of all the ids does), vllm drops it
        assert answers["vllm"][4] == answers["ar"][4].replace("\ufffd", "")
    run(body())


def test_stream_with_usage_and_a_bad_value(server):
    async def body():
        async with server.client() as client:
            stream = await client.chat.completions.create(
                model="vllm", messages=HELLO, stream=True,
                stream_options={"include_usage": True}, **FIXED)
            chunks = [c async for c in stream]
            whole = await client.chat.completions.create(model="vllm", messages=HELLO, **FIXED)
            import openai

            with pytest.raises(openai.BadRequestError, match="top_p"):
                await client.chat.completions.create(model="vllm", messages=HELLO, top_p=7.0)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == 8
    run(body())
