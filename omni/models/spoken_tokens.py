"""Which tokens of a streamed answer a voice may read, for talkers that hear the answer as
token ids (Qwen3-Omni's): its tool calls are left out, tags included, since a call is for
the client, not the listener. The same rule as ``tool_calls.spoken_text`` (which serves
text-fed voices such as Piper), at the grain of tokens: a token whose text overlaps a
call is not heard, and tokens that could begin a call's tag wait until the text decides.

A tag may be one special token (Qwen's tokenizers have ``<tool_call>`` as one) or several
ordinary ones (a byte-level BPE without it), so the filter reads each token's text, not
its id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from omni.models.tool_calls import CALL_CLOSE, CALL_OPEN, partial_tag


class SpokenTokens:
    """One answer's filter: push() the answer's token ids as they come, get back those
    the voice may hear, in order; push([], final=True) at the end releases what was held
    for a tag that never came (an unclosed call is dropped)."""

    def __init__(self, piece: Callable[[int], str]) -> None:
        self.piece = piece  # one token id's text
        self.held: list[tuple[int, str]] = []  # tokens not decided yet
        # the held tokens' text is judged character by character (a token may hold one
        # call's close tag and the next one's open): whether each judged character lies in
        # a call, and the text after them, not judged yet
        self.marks: list[bool] = []
        self.pending = ""
        self.in_call = False

    def push(self, ids: list[int], final: bool = False) -> list[int]:
        """The ids heard, of those pushed so far, not returned before."""
        return [t for t, heard in self.decide(ids, final) if heard]

    def decide(self, ids: list[int], final: bool = False) -> list[tuple[int, bool]]:
        """(id, heard) for every token decided by now, in answer order: a talker fed one
        row per token (Qwen2.5-Omni's) pairs them with its rows. A token is heard when
        none of its characters lies in a call, tags included."""
        pieces = [(t, self.piece(t)) for t in ids]
        self.held += pieces
        self.pending += "".join(p for _, p in pieces)
        self._judge(final)
        out: list[tuple[int, bool]] = []
        while self.held:
            token, text = self.held[0]
            if text and len(text) <= len(self.marks):
                in_call = any(self.marks[:len(text)])
            elif not text and (self.marks or final):  # no text: as the character after it
                in_call = self.marks[0] if self.marks else self.in_call
            else:
                break
            self.held.pop(0)
            out.append((token, not in_call))
            del self.marks[:len(text)]
        return out

    def _judge(self, final: bool) -> None:
        """Mark the pending characters that can be judged now (a possible tag's start at
        the end waits for more text, unless the answer ended)."""
        while self.pending:
            tag = CALL_CLOSE if self.in_call else CALL_OPEN
            at = self.pending.find(tag)
            if at < 0:
                keep = 0 if final else partial_tag(self.pending, tag)
                self._mark(len(self.pending) - keep, self.in_call)
                return
            self._mark(at, self.in_call)
            self._mark(len(tag), True)  # the tag itself is the call's
            self.in_call = not self.in_call

    def _mark(self, n: int, in_call: bool) -> None:
        self.marks += [in_call] * n
        self.pending = self.pending[n:]


def token_text(model_dir: str | Path) -> Callable[[int], str]:
    """A token id's text, by the tokenizer of a release directory (its thinker's)."""
    from transformers import AutoTokenizer

    from omni.engines.base import EngineLoadError

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {model_dir}: the talker reads the thinker's "
                              f"tokenizer (to leave tool calls unspoken): {e}") from e
    return lru_cache(maxsize=65536)(lambda t: tokenizer.decode([t]))
