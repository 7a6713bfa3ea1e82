"""The Hermes tool-call format (omni/models/tool_calls.py): the reader gives the same calls
and content however the text is split into deltas; the prompt a ChatML template without
tools gets; the call grammar."""

from __future__ import annotations

import json
import random

import pytest
from llguidance import LLMatcher

from omni.api.tools import CallStream
from omni.models.tool_calls import (
    ToolCallReader,
    call_grammar,
    hermes_messages,
    tool_format,
)

TWO_CALLS = ('Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Pa\\"ris}", "days": [1, {"x": 2}]}}\n</tool_call>\n<tool_call>\n'
             '{"name": "get_time", "arguments": {}}\n</tool_call>')


def read(pieces: list[str]) -> tuple[str, list[dict], list]:
    reader, events = ToolCallReader(), []
    for piece in pieces:
        events += reader.feed(piece)
    events += reader.finish()
    content = "".join(e.content for e in events)
    return content, reader.calls, events


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(40, len(text) - 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("seed", range(30))
def test_calls_are_the_same_however_the_text_is_split(seed):
    content, calls, events = read(splits(TWO_CALLS, random.Random(seed)))
    assert content == "Checking both.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": 'Pa"ris}', "days": [1, {"x": 2}]}), ("get_time", {})]
    # the arguments went out as written, fragment by fragment, after the call's name
    per_call: dict[int, str] = {}
    for event in events:
        if event.index is not None:
            assert (event.name is not None) == (event.index not in per_call)
            per_call[event.index] = per_call.get(event.index, "") + event.arguments
    assert [per_call[0], per_call[1]] == [c["arguments"] for c in calls]


def test_every_single_character_split():
    content, calls, _ = read(list(TWO_CALLS))
    assert content == "Checking both.\n" and len(calls) == 2


@pytest.mark.parametrize("text, content, calls", [
    ("no calls here, just <tool and text", "no calls here, just <tool and text", []),
    ("ends with a tag start <tool_ca", "ends with a tag start <tool_ca", []),
    ('<tool_call>\n{"arguments": {"a": 1}, "name": "late"}\n</tool_call>', "",
     [("late", {"a": 1})]),  # name after the arguments: read when the call closes
    ('<tool_call>\n{"name": "s", "arguments": "{\\"a\\": 1}"}\n</tool_call>', "",
     [("s", {"a": 1})]),  # arguments as a JSON string, as some models write them
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ('<tool_call>\n{"name": "cut", "arguments": {"a": ', "", [("cut", None)]),
])
def test_edge_cases(text, content, calls):
    got_content, got_calls, _ = read([text[:7], text[7:]])
    assert got_content == content
    assert [(c["name"], json.loads(c["arguments"]) if calls and calls[0][1] is not None
             else None) for c in got_calls] == calls


def test_call_stream_shapes_chat_deltas():
    stream = CallStream()
    parts = [p for piece in splits(TWO_CALLS, random.Random(7)) for p in stream.feed(piece)]
    parts += stream.finish()
    deltas = [p["tool_call"] for p in parts if "tool_call" in p]
    firsts = [d for d in deltas if "id" in d]
    assert [d["function"]["name"] for d in firsts] == ["get_weather", "get_time"]
    assert all(d["type"] == "function" and d["id"].startswith("call_") for d in firsts)
    assert all("name" not in d["function"] and "id" not in d for d in deltas
               if d not in firsts)
    assert [d["index"] for d in deltas] == sorted(d["index"] for d in deltas)
    whole = stream.tool_calls
    assert [c["id"] for c in whole] == [d["id"] for d in firsts]
    assert json.loads(whole[1]["function"]["arguments"]) == {}


def test_hermes_prompt_for_a_template_without_tools():
    tools = [{"name": "get_time", "parameters": {"type": "object"}}]
    messages = hermes_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "c2", "content": "13:00"}], tools)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(tools[0]) in messages[0]["content"]
    assert messages[2]["content"] == ('<tool_call>\n{"name": "get_time", "arguments": '
                                      '{"zone": "utc"}}\n</tool_call>')
    assert messages[3]["content"] == ("<tool_response>\n12:00\n</tool_response>\n"
                                      "<tool_response>\n13:00\n</tool_response>")


def test_call_grammar_is_valid_and_families_are_known():
    grammar = call_grammar([{"name": "a", "parameters": {"type": "object"}},
                            {"name": "b"}], parallel=True)
    assert LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) == ""
    assert tool_format("qwen3", None) == "hermes"
    assert tool_format("llama", "<|im_start|>{{ m }}") == "hermes"
    assert tool_format("llama", "[INST] {{ m }}") is None


# a template that writes tools itself (as Qwen2.5's and Qwen3's do): it gets `tools=` and
# the calls' arguments as objects (templates write them with tojson)
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n")


def test_a_template_that_knows_tools_gets_them(tmp_path):
    from transformers import AutoTokenizer

    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models.hf_causal import apply_chat_template
    tok = AutoTokenizer.from_pretrained(ensure_tiny_model("qwen3", tmp_path))
    tok.chat_template = NATIVE_TEMPLATE
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    messages = [{"role": "user", "content": "time?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    text = tok.decode(apply_chat_template(tok, messages, tools))
    assert "TOOLS:get_time;" in text
    assert 'CALL get_time {"zone": "utc"}' in text  # an object, not a quoted string
    assert "<|im_start|>tool\n12:00" in text


AUTO_TEXTS = {
    "Hello there.": (True, False),  # (accepted by the auto grammar, by the required one)
    '<tool_call>\n{"name": "f", "arguments": {"a": 3}}\n</tool_call>': (True, True),
    ('Sure. <tool_call>\n{"name": "f", "arguments": {"a": 3}}\n</tool_call>\n<tool_call>\n'
     '{"name": "f", "arguments": {"a": 4}}\n</tool_call>'): (True, False),
    'Sure <tool_call>\n{"name": "f", "arguments": {"a": "x"}}': (False, False),
    '<tool_call>\n{"name": "g", "arguments": {"a": 3}}': (False, False),
}


@pytest.mark.parametrize("text", list(AUTO_TEXTS))
def test_auto_grammar_lets_text_through_but_holds_calls_to_the_schema(text, tmp_path_factory):
    import llguidance.hf
    from transformers import AutoTokenizer

    from omni.fixtures.tiny_models import ensure_tiny_model
    tok = AutoTokenizer.from_pretrained(ensure_tiny_model("qwen3", tmp_path_factory.mktemp("m")))
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}}]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for optional, expected in zip((True, False), AUTO_TEXTS[text], strict=True):
        matcher = LLMatcher(lltok, LLMatcher.grammar_from_lark(
            call_grammar(tools, parallel=optional, optional=optional)), log_level=0)
        taken = all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()
        assert taken == expected, (optional, text)


@pytest.mark.parametrize("text, taken", [
    ('{"city": "Paris"}', True),  # the answer's schema
    ('<tool_call>\n{"name": "f", "arguments": {"a": 3}}\n</tool_call>', True),
    ("Paris.", False),  # free text is neither
    ('{"town": "Paris"}', False),
])
def test_auto_with_an_answer_schema_is_that_json_or_calls(text, taken, tmp_path_factory):
    import llguidance.hf
    from transformers import AutoTokenizer

    from omni.fixtures.tiny_models import ensure_tiny_model
    tok = AutoTokenizer.from_pretrained(ensure_tiny_model("qwen3", tmp_path_factory.mktemp("m")))
    answer = json.dumps({"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False})
    grammar = call_grammar([{"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}}], True, optional=True,
        answer_schema=answer)
    matcher = LLMatcher(llguidance.hf.from_tokenizer(tok, n_vocab=len(tok)),
                        LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert (all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()) == taken
