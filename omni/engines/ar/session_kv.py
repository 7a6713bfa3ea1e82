"""A session's KV blocks, held by the AR engine between its turns.

A request that names a session (param ``session``) does not give its blocks back when it
finishes: the session keeps them, with the tokens whose KV they hold (the prompt and the
answer, all but the last sampled token, which was never fed). The blocks stay referenced,
so no other request's prefix-cache pressure can evict them; only the session layer can,
through ``release`` (close, reset, or its byte budget: omni/session/manager.py).

The next turn's prompt (the conversation so far, rendered again, plus the new message)
shares a long prefix with those tokens. ``attach`` hands the blocks of that common prefix
to the new sequence, which then prefills only what follows. The full blocks are taken as
they are (their content never changes, and the prefix cache may share them); a partly
matching last block is copied into a fresh block (copy on write), because positions past
the match are about to be overwritten and the old block may be shared.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens
from dataclasses import dataclass
from typing import Any

from omni.engines.ar.kv_cache import OutOfBlocksError, PagedKVCache, SequenceBlocks
from omni.engines.ar.scheduler import Sequence


@dataclass
class HeldKV:
    tokens: list[int]  # their KV is in blocks, in this order
    blocks: SequenceBlocks


class SessionKV:
    """Every session's held blocks in one engine (a collaborator of AREngine): a request's
    ``session`` param read at admission, the session's blocks attached to its new turn and
    held again when the turn leaves the scheduler, released when the session layer says."""

    def __init__(self, cache: PagedKVCache, exporting: bool) -> None:
        self.cache = cache
        self.exporting = exporting  # the engine exports hidden states (no session KV then)
        self.held: dict[str, HeldKV] = {}
        self.reused_tokens = 0  # prompt tokens a session turn did not recompute

    def __contains__(self, session: str) -> bool:
        return session in self.held

    def session_of(self, params: dict[str, Any]) -> str | None:
        """The session a request belongs to, where its KV can be held: not with hidden
        states exported (a reused prefix would not be exported again)."""
        session = params.get("session")
        if session is None or self.exporting:
            return None
        if not isinstance(session, str) or not session:
            raise ValueError(f"param session must be a non-empty string, got {session!r}")
        return session

    def attach(self, seq: Sequence) -> int:
        """A new turn of its session takes the session's held blocks; the tokens reused."""
        session = _holder(seq)
        return 0 if session is None else self._attach(session, seq)

    def hold(self, seq: Sequence) -> None:
        """A turn leaving the scheduler (finished or aborted) leaves its blocks to its
        session, if it has one."""
        session = _holder(seq)
        if session is not None:
            self._hold(session, seq)

    def _hold(self, session: str, seq: Sequence) -> None:
        """A finished (or aborted) turn: its computed tokens' blocks move to the session,
        replacing any older context of it. A sequence without blocks (already held, or
        preempted) changes nothing."""
        if not seq.blocks.table:
            return
        self.release(session)
        computed = min(seq.computed, len(seq.prompt) + len(seq.output))
        blocks = seq.blocks
        seq.blocks = SequenceBlocks()  # the scheduler's remove() now frees nothing
        keep = self.cache.blocks_for(computed)
        for block in blocks.table[keep:]:
            self.cache.pool.release(block)
        del blocks.table[keep:]
        del blocks.hashes[keep:]
        if computed == 0:
            return
        self.held[session] = HeldKV(seq.tokens[:computed], blocks)

    def _attach(self, session: str, seq: Sequence) -> int:
        """Give a new turn the session's blocks of its longest common prefix (all but the
        prompt's last token, whose logits are needed); returns the tokens reused."""
        held = self.held.pop(session, None)
        if held is None:
            return 0
        size = self.cache.block_size
        common = _common_prefix(held.tokens, seq.prompt, len(seq.prompt) - 1)
        full, rest = divmod(common, size)
        table = held.blocks.table
        seq.blocks.table = table[:full]
        seq.blocks.hashes = held.blocks.hashes[:full]
        if rest:
            try:
                copy = self.cache.pool.allocate()
            except OutOfBlocksError:
                rest, common = 0, full * size
            else:
                self._copy_rows(table[full], copy, rest)
                seq.blocks.table.append(copy)
        for block in table[full:]:
            self.cache.pool.release(block)
        seq.blocks.cached_tokens = seq.computed = common
        self.reused_tokens += common
        return common

    def _copy_rows(self, source: int, target: int, rows: int) -> None:
        size = self.cache.block_size
        src, dst = slice(source * size, source * size + rows), slice(target * size,
                                                                     target * size + rows)
        for k, v in zip(self.cache.k, self.cache.v, strict=True):
            k[dst] = k[src]
            v[dst] = v[src]

    def release(self, session: str) -> bool:
        held = self.held.pop(session, None)
        if held is None:
            return False
        self.cache.free(held.blocks)
        return True

    def release_all(self) -> None:
        for session in list(self.held):
            self.release(session)

    def nbytes(self) -> dict[str, int]:
        """Bytes held per session (whole blocks)."""
        per_block = self.cache.block_bytes
        return {s: len(h.blocks.table) * per_block for s, h in self.held.items()}


def _common_prefix(a: Tokens[int], b: Tokens[int], limit: int) -> int:
    n = min(len(a), len(b), max(limit, 0))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _holder(seq: Sequence) -> str | None:
    """The session that may keep a sequence's blocks: only a prompt of token ids (one of
    embeddings or media holds placeholder ids, which a later prompt cannot match)."""
    if seq.embeds is None and seq.media is None:
        return seq.state.session
    return None
