"""Which answer tokens a token-fed voice hears (omni/models/spoken_tokens.py): tool calls
are left out whether their tags are one token or several, tokens that may begin a tag wait,
and an unclosed call at the end is dropped."""

from __future__ import annotations

import pytest

from omni.models.spoken_tokens import SpokenTokens


def heard(pieces: list[str], chunks: list[int] | None = None) -> str:
    """Push the pieces' ids in chunks of the given sizes (default one at a time); the
    text of the ids heard."""
    spoken = SpokenTokens(lambda t: pieces[t])
    ids, out, at = list(range(len(pieces))), [], 0
    for size in chunks or [1] * len(ids):
        out += spoken.push(ids[at:at + size])
        at += size
    out += spoken.push([], final=True)
    assert out == sorted(out)  # in order, each once
    return "".join(pieces[t] for t in out)


CALL = ["<tool_call>", "\n", '{"name": "f", "arguments": {}}', "\n", "</tool_call>"]
SPLIT_CALL = ["<", "tool", "_call", ">\n{", '"name": "f"}', "\n</", "tool_", "call", ">"]


@pytest.mark.parametrize("call", [CALL, SPLIT_CALL], ids=["special", "split"])
@pytest.mark.parametrize("chunks", [None, "whole"])
def test_a_call_is_not_heard_and_the_words_around_it_are(call, chunks):
    pieces = ["Let", " me", " check.", " ", *call, " It", " is", " noon."]
    sizes = [len(pieces)] if chunks == "whole" else None
    assert heard(pieces, sizes) == "Let me check.  It is noon."


def test_text_that_only_looks_like_a_tag_is_heard_once_it_is_not_one():
    assert heard(["a", " <", "tool", "box", ">"]) == "a <toolbox>"
    assert heard(["x", " <", "tool"]) == "x <tool"  # the end: a tag's start that never was


def test_an_unclosed_call_is_dropped_and_two_calls_both_go():
    assert heard(["Hi.", *CALL[:3]]) == "Hi."
    assert heard(["A", *CALL, "B", *SPLIT_CALL, "C"]) == "ABC"


def test_tokens_that_may_begin_a_tag_wait_for_the_text_to_decide():
    spoken = SpokenTokens(["ok", " <", "tool", "_call>", "{}", "</tool_call>", "!"].__getitem__)
    assert spoken.push([0, 1]) == [0]  # " <" may begin a call
    assert spoken.push([2]) == []
    assert spoken.push([3, 4]) == []  # a call: held until it closes
    assert spoken.push([5, 6]) == [6]
    assert spoken.held == []


@pytest.mark.parametrize("chunks", [None, "whole"])
def test_a_token_across_one_call_s_close_and_the_next_s_open_leaves_both_unheard(chunks):
    # a byte-level BPE may join the text between two calls to their tags (">\n<"): the
    # second call's open tag begins inside the token that ends the first
    pieces = ["A", "<tool_call>", "{}", "</tool_call", ">\n<", "tool_call", ">", '{"x": 1}',
              "</tool_call>", "B"]
    sizes = [len(pieces)] if chunks == "whole" else None
    assert heard(pieces, sizes) == "AB"
    assert heard(["A", "<tool_call>{}</tool_call>\n<tool_call>", '{"x": 1}', "</tool_call>",
                  "B"], sizes) == "AB"


def test_a_close_tag_before_an_open_one_in_one_token_does_not_end_the_call():
    pieces = ["A", " </tool_call><tool", "_call>", '{"x": 1}', "</tool_call>", "B"]
    assert heard(pieces) == "AB"


def test_a_token_without_text_inside_a_call_is_not_heard():
    pieces = ["A", "<tool_call>", "", "{}", "</tool_call>", "", "B"]
    spoken = SpokenTokens(pieces.__getitem__)
    assert spoken.push(list(range(len(pieces)))) + spoken.push([], final=True) == [0, 5, 6]
