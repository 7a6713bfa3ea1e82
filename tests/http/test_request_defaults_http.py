"""Request defaults over HTTP (tiny random Qwen3, the unmodified openai SDK): /v1/models
shows each text stage's defaults (the model's generation_config.json, then the pipeline's),
and a request that sets nothing gets them; a view keeps only its stages' params."""

from __future__ import annotations

import pytest
from httputil import run

from omni.fixtures.tiny_models import ensure_tiny_model

HELLO = [{"role": "user", "content": "Tell me a story"}]
# the fixture's generation_config.json: temperature 0.6, top_k 20, top_p 0.95
MODEL_DEFAULTS = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("qwen3", tmp_path_factory.mktemp("models"))
    return start_server({"tiny": f"""\
        name: tiny
        stages:
          - name: llm
            engine: ar
            model: hf_causal
            model_dir: {model_dir}
            params: {{max_tokens: 9, top_k: 5}}
            final_output: text
        defaults:
          text:
            llm: {{max_tokens: 4}}
        views:
          plain: {{stages: [llm]}}
        """})


def _cards(server) -> dict:
    async def listing():
        return {m.id: m.model_extra async for m in server.client().models.list()}
    return run(listing())


def _completion_tokens(server, model: str) -> int:
    async def call():
        return await server.client(timeout=60.0).chat.completions.create(
            model=model, messages=HELLO, extra_body={"ignore_eos": True})
    return run(call()).usage.completion_tokens


def test_models_show_each_text_stages_defaults(server):
    cards = _cards(server)
    assert cards["tiny"]["defaults"] == {
        "text": {"llm": {**MODEL_DEFAULTS, "max_tokens": 4, "top_k": 5}}}
    assert cards["plain"]["defaults"] == {
        "text": {"llm": {**MODEL_DEFAULTS, "max_tokens": 9, "top_k": 5}}}

    async def one():
        return (await server.client().models.retrieve("tiny")).model_extra
    assert run(one())["defaults"] == cards["tiny"]["defaults"]
    # the stage's card says what its KV cache holds (issue #44: budgets users can reason
    # about): on CPU the default 256 MiB cache, far more than the tiny model's context
    llm = cards["tiny"]["stages"]["llm"]
    assert llm["engine"] == "ar" and llm["device"] == "cpu" and llm["max_num_seqs"] == 64
    assert llm["full_context_sequences"] == llm["kv_tokens"] // llm["max_context"] > 0


def test_a_request_that_sets_nothing_gets_them(server):
    assert _completion_tokens(server, "tiny") == 4
    assert _completion_tokens(server, "plain") == 9

    async def asked():
        return await server.client(timeout=60.0).chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=2, extra_body={"ignore_eos": True})
    assert run(asked()).usage.completion_tokens == 2
