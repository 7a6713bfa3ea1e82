"""The text APIs over the real AR engine (tiny random Qwen3) with the unmodified openai
SDK: n choices, logprobs in both shapes, penalties, seeds, streaming with usage, a
prompt beyond the context refused naming its field."""

from __future__ import annotations

import openai
import pytest
from httputil import run

from omni.fixtures.tiny_models import ensure_tiny_model

HELLO = [{"role": "user", "content": "Tell me a story"}]
FIXED = {"temperature": 0, "max_tokens": 6, "extra_body": {"ignore_eos": True}}


def test_n_choices_and_usage(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=HELLO, n=3, temperature=1.0, seed=5, max_tokens=8,
                extra_body={"ignore_eos": True})
            again = await client.chat.completions.create(
                model="qwen3", messages=HELLO, n=3, temperature=1.0, seed=5, max_tokens=8,
                extra_body={"ignore_eos": True})
        assert [c.index for c in chat.choices] == [0, 1, 2]
        texts = [c.message.content for c in chat.choices]
        assert texts == [c.message.content for c in again.choices]  # seeded: reproducible
        assert len(set(texts)) > 1  # choice i uses seed + i
        assert chat.usage.completion_tokens == 24
        assert chat.usage.total_tokens == chat.usage.prompt_tokens + 24
    run(body())


def test_chat_logprobs(ar_server):
    async def body():
        async with ar_server.client() as client:
            chat = await client.chat.completions.create(
                model="qwen3", messages=HELLO, logprobs=True, top_logprobs=3, **FIXED)
        content = chat.choices[0].logprobs.content
        assert len(content) == 6
        assert "".join(t.token for t in content) == chat.choices[0].message.content
        for t in content:
            assert t.logprob <= 0 and len(t.top_logprobs) == 3
            assert t.top_logprobs[0].token == t.token  # greedy takes the most likely
            assert t.bytes == list(t.token.encode())
    run(body())


def test_completion_logprobs_and_penalties(ar_server):
    async def body():
        async with ar_server.client() as client:
            done = await client.completions.create(
                model="qwen3", prompt="Once upon a time", logprobs=2, presence_penalty=1.5,
                frequency_penalty=0.5, **FIXED)
            plain = await client.completions.create(model="qwen3", prompt="Once upon a time",
                                                    **FIXED)
            greedy = await client.completions.create(model="qwen3", prompt="Once upon a time",
                                                     logprobs=1, **FIXED)
        lp = done.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
        assert lp.text_offset[0] == 0 and all(len(d) <= 2 for d in lp.top_logprobs)
        assert plain.choices[0].logprobs is None
        assert done.usage.completion_tokens == 6
        # the penalties changed what was said: greedy alone repeats itself on this fixture,
        # penalised it may not repeat a token it used
        assert plain.choices[0].text == greedy.choices[0].text
        assert done.choices[0].text != plain.choices[0].text
        assert len(set(lp.tokens)) > len(set(greedy.choices[0].logprobs.tokens))
    run(body())


def test_stream_n_choices_with_usage(ar_server):
    async def body():
        async with ar_server.client() as client:
            stream = await client.chat.completions.create(
                model="qwen3", messages=HELLO, n=2, stream=True,
                stream_options={"include_usage": True}, **FIXED)
            chunks = [c async for c in stream]
            whole = await client.chat.completions.create(model="qwen3", messages=HELLO,
                                                         n=2, **FIXED)
        text = {0: "", 1: ""}
        finishes = {}
        for chunk in chunks:
            for c in chunk.choices:
                text[c.index] += c.delta.content or ""
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
        assert finishes == {0: "length", 1: "length"}
        assert text == {i: whole.choices[i].message.content for i in (0, 1)}
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    run(body())


def test_engine_gauges_in_metrics(ar_server):
    async def body():
        async with ar_server.client() as client:
            await client.completions.create(model="qwen3", prompt="Hi", **FIXED)
        async with ar_server.session() as session:
            async with session.get("/metrics") as resp:
                text = await resp.text()
        for metric in ("omni_replica_kv_blocks_total", "omni_replica_kv_blocks_used",
                       "omni_replica_prefix_cache_hits", "omni_replica_running",
                       "omni_replica_encoder_batches", "omni_replica_encoder_prompts",
                       "omni_replica_encoder_seconds"):
            assert any(line.startswith(metric + "{") for line in text.splitlines()), metric
    run(body())


def test_qwen3_omni_release_serves_chat_through_its_thinker(start_server, tmp_path_factory):
    omni_dir = ensure_tiny_model("qwen3_omni", tmp_path_factory.mktemp("omni"))
    server = start_server({"omni": str(omni_dir)})

    async def body():
        async with server.client() as client:
            chat = await client.chat.completions.create(model="omni", messages=HELLO, **FIXED)
        assert chat.usage.completion_tokens == 6 and chat.choices[0].finish_reason == "length"
    run(body())


def test_cached_tokens_of_a_shared_prefix(ar_server):
    """usage.prompt_tokens_details.cached_tokens: the prompt tokens the engine took from its
    prefix cache. A long system prompt, then two questions: the second reuses it."""
    system = {"role": "system", "content": " ".join(f"rule {i}: be brief." for i in range(60))}

    async def ask(client, question: str):
        return await client.chat.completions.create(
            model="qwen3", messages=[system, {"role": "user", "content": question}], **FIXED)

    async def body():
        async with ar_server.client() as client:
            first = await ask(client, "What is the sea?")
            second = await ask(client, "What is a mountain?")
        assert first.usage.prompt_tokens > 200
        # its system prompt was new: at most the chat template's opening was cached
        assert first.usage.prompt_tokens_details.cached_tokens < 16
        cached = second.usage.prompt_tokens_details.cached_tokens
        # the system prompt's whole blocks, never the differing question
        assert first.usage.prompt_tokens // 2 < cached < second.usage.prompt_tokens
    run(body())


def test_a_prompt_beyond_the_context_is_a_400_naming_its_field(ar_server):
    """A refusal of the whole prompt (longer than the model's context) names the request
    field it came in as the 400's param, as the API's own checks do: chat's ``messages``,
    the completions API's ``prompt`` (text or token ids), the Responses API's ``input``."""
    long_text = " ".join(f"w{i}" for i in range(2500))  # beyond the fixture's 2048 positions

    async def refused(create, **kwargs) -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as caught:
            await create(model="qwen3", **kwargs)
        return caught.value

    async def body():
        async with ar_server.client() as client:
            return [
                await refused(client.chat.completions.create, max_tokens=4,
                              messages=[{"role": "user", "content": long_text}]),
                await refused(client.completions.create, max_tokens=4, prompt=long_text),
                await refused(client.completions.create, max_tokens=4, prompt=[1] * 2500),
                await refused(client.responses.create, max_output_tokens=16,
                              input=long_text)]

    chat, text, ids, response = run(body())
    for error, param in ((chat, "messages"), (text, "prompt"), (ids, "prompt"),
                         (response, "input")):
        assert error.body["param"] == param, error.body
        assert f"{param}: prompt has" in error.message and "limit is 2048" in error.message
        assert error.code == "invalid_input"
