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
        self.held += [(t, self.piece(t)) for t in ids]
        heard: list[int] = []
        while self.held:
            text = "".join(p for _, p in self.held)
            if self.in_call:
                end = text.find(CALL_CLOSE)
                if end < 0:  # inside the call: what cannot begin its close tag goes
                    if final:
                        self.held = []
                    else:
                        self._forget_before(len(text) - len(CALL_CLOSE) + 1, False)
                    return heard
                self._forget_before(end + len(CALL_CLOSE), True)
                self.in_call = False
                continue
            at = text.find(CALL_OPEN)
            if at < 0:
                keep = 0 if final else partial_tag(text, CALL_OPEN)
                heard += self._release_before(len(text) - keep)
                return heard
            heard += self._release_before(at)
            self.in_call = True
        return heard

    def _release_before(self, limit: int) -> list[int]:
        """Take out the leading tokens whose text ends at or before character `limit`."""
        out, end = [], 0
        while self.held and end + len(self.held[0][1]) <= limit:
            end += len(self.held[0][1])
            out.append(self.held.pop(0)[0])
        return out

    def _forget_before(self, limit: int, overlapping: bool) -> None:
        """Drop the leading tokens of a call that end before character `limit` (with
        `overlapping`, also the one that straddles it: it holds part of the call)."""
        start = 0
        while self.held:
            end = start + len(self.held[0][1])
            if end > limit and not (overlapping and start < limit):
                return
            self.held.pop(0)
            start = end
