"""What a voice reads of an LLM's streamed answer that holds tool calls
(omni/models/tool_calls.py spoken_text, used by Piper's split_stream): the words, never a
call, wherever the stream's pieces happen to cut the tags."""

from __future__ import annotations

import pytest

from omni.models.tool_calls import spoken_text

CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "cet"}}\n</tool_call>'


def read_aloud(pieces: list[str]) -> str:
    """The pieces streamed as a speech stage takes them: what is held goes back in."""
    said, held = "", ""
    for i, piece in enumerate(pieces):
        spoken, held = spoken_text(held + piece, final=i == len(pieces) - 1)
        said += spoken
    assert held == ""
    return " ".join(said.split())


@pytest.mark.parametrize("text, heard", [
    (f"Let me check.\n{CALL}\n{CALL}", "Let me check."),
    (f"{CALL} Done.", "Done."),
    (f"Wait{CALL}here.", "Wait here."),  # the words around a call stay apart
    (CALL, ""),
    (f"Cut short. {CALL[:30]}", "Cut short."),  # an unfinished call is never read
    ("Less <tool is not a tag.", "Less <tool is not a tag."),
    ("Ends with <tool_c", "Ends with <tool_c"),  # a tag's start that never became one
])
def test_every_cut_of_the_stream_reads_the_words_only(text, heard):
    assert read_aloud([text]) == heard
    for cut in range(1, len(text)):
        assert read_aloud([text[:cut], text[cut:]]) == heard, cut
    for step in (1, 3):
        assert read_aloud([text[i:i + step] for i in range(0, len(text), step)]) == heard


def test_an_open_call_is_held_until_it_closes():
    assert spoken_text(f"Hi. {CALL[:20]}", final=False) == ("Hi. ", CALL[:20])
    assert spoken_text("Hi. <tool", final=False) == ("Hi. ", "<tool")
