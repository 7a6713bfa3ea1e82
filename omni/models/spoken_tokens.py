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
        self.held: list[tuple[int, str]] = []
        self.in_call = False

    def push(self, ids: list[int], final: bool = False) -> list[int]:
        """The ids heard, of those pushed so far, not returned before."""
        return [t for t, heard in self.decide(ids, final) if heard]

    def decide(self, ids: list[int], final: bool = False) -> list[tuple[int, bool]]:
        """(id, heard) for every token decided by now, in answer order: a talker fed one
        row per token (Qwen2.5-Omni's) pairs them with its rows."""
        self.held += [(t, self.piece(t)) for t in ids]
        out: list[tuple[int, bool]] = []
        while self.held:
            text = "".join(p for _, p in self.held)
            if self.in_call:
                end = text.find(CALL_CLOSE)
                if end < 0:  # inside the call: what cannot begin its close tag goes
                    out += self._take_before(len(text) if final else
                                             len(text) - len(CALL_CLOSE) + 1, False, False)
                    return out
                out += self._take_before(end + len(CALL_CLOSE), False, True)
                self.in_call = False
                continue
            at = text.find(CALL_OPEN)
            if at < 0:
                keep = 0 if final else partial_tag(text, CALL_OPEN)
                out += self._take_before(len(text) - keep, True, False)
                return out
            out += self._take_before(at, True, False)
            self.in_call = True
        return out

    def _take_before(self, limit: int, heard: bool, straddling: bool) -> list[tuple[int, bool]]:
        """The leading tokens whose text ends at or before character `limit` (with
        `straddling`, also the one across it), marked heard or not."""
        out, start = [], 0
        while self.held:
            end = start + len(self.held[0][1])
            if end > limit and not (straddling and start < limit):
                break
            out.append((self.held.pop(0)[0], heard))
            start = end
        return out


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
