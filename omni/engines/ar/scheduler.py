"""Continuous-batching scheduler for the AR engine: who runs in the next step, and how
many of their tokens.

Every step, running sequences come first (in arrival order): a decoding sequence adds
its one new token, a sequence still prefilling adds the next chunk of its prompt. Then
waiting sequences are admitted in arrival order while the step's token budget, the
sequence limit and the KV cache allow; a long prompt is prefilled in chunks across
steps (chunked prefill), so decodes never stall behind it for more than one step. While
any sequence decodes, prompt tokens per step can be held to a smaller share
(prefill_beside_decodes), so a stage whose decodes must keep a real-time pace (a talker
feeding a player) spreads new prompts over more, shorter steps.

KV memory (omni/engines/ar/kv_cache.py) is the hard limit. When a running sequence needs a
block and none is left, the most recently arrived running sequence is preempted: its
blocks are freed and it goes back to the front of the waiting queue with everything it
has generated so far, to be recomputed later (its cached prefix blocks usually survive).
A sequence that cannot fit even alone finishes with finish_reason "length" (the cache
is its length limit); nothing crashes and no other sequence is affected.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from omni.engines.ar.kv_cache import OutOfBlocksError, PagedKVCache, SequenceBlocks


@dataclass(eq=False)
class Sequence:
    """One request inside the AR engine."""

    id: str
    prompt: list[int]
    state: Any = None  # the engine's per-request data (sampler, detokenizer, ...)
    output: list[int] = field(default_factory=list)
    blocks: SequenceBlocks = field(default_factory=SequenceBlocks)
    computed: int = 0  # tokens whose KV is in the cache
    arrival: float = field(default_factory=time.monotonic)
    preemptions: int = 0
    input_open: bool = False  # stream input still arriving: sample nothing yet
    embeds: Any = None  # (prompt_len, hidden) prompt embeddings given instead of token ids
    media: Any = None  # a multimodal prompt's PromptLayout (omni/engines/ar/media.py)
    held: bool = False  # its next input depends on stream input that has not arrived
    limit: int | None = None  # the most outputs it may have made for now (Engine.limit)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output if self.output else self.prompt

    def token_slice(self, start: int, stop: int) -> list[int]:
        """tokens[start:stop] without building the whole list."""
        p = len(self.prompt)
        if stop <= p:
            return self.prompt[start:stop]
        if start >= p:
            return self.output[start - p:stop - p]
        return self.prompt[start:] + self.output[:stop - p]

    @property
    def last_token(self) -> int:
        """The last known token (tokens[-1] without building the whole list)."""
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def pending(self) -> int:
        """Tokens to feed now: the prompt left (while input is still arriving, all but
        the last token, whose logits are only wanted once the input is complete), or the
        last sampled token."""
        if self.held or (self.limit is not None and len(self.output) >= self.limit):
            return 0
        known = len(self.prompt) + len(self.output)
        return max(0, known - 1 - self.computed) if self.input_open else known - self.computed

    @property
    def samples_next(self) -> bool:
        """Feeding its pending tokens reaches the end of a complete input."""
        return not self.input_open


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    counts: list[int]  # new tokens fed per sequence
    starts: list[int]  # position of each sequence's first new token
    preempted: list[Sequence]
    overflowed: list[Sequence]  # cannot fit in the cache even alone: finish them

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)


class Scheduler:
    """Waiting and running queues over one PagedKVCache (see module docstring)."""

    def __init__(self, cache: PagedKVCache, max_num_seqs: int, max_batched_tokens: int,
                 prefix_salt: int | None = 0, prefill_beside_decodes: int | None = None) -> None:
        """prefix_salt None turns prefix caching off; prefill_beside_decodes: prompt tokens
        a step may carry while some sequence decodes (None: up to max_batched_tokens)."""
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.prefill_beside_decodes = prefill_beside_decodes or max_batched_tokens
        self.salt = prefix_salt
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Forget a sequence (finished, aborted or failed) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.free(seq.blocks)

    def has_work(self) -> bool:
        return any(s.pending > 0 for s in self.running) or any(
            s.pending > 0 for s in self.waiting)

    # -- one step -----------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [], [], [], [])
        budget = self.max_batched_tokens
        prompt_budget = budget
        if self.prefill_beside_decodes < budget and any(  # only when the option is set
                s.pending > 0 and s.computed >= len(s.prompt) for s in self.running):
            prompt_budget = self.prefill_beside_decodes
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted while making room for an earlier sequence
            prompt = seq.computed < len(seq.prompt)
            n = min(seq.pending, budget, prompt_budget if prompt else budget)
            if n < 1:
                continue
            if not self._make_room(seq, n, batch):
                continue
            self._take(batch, seq, n)
            budget -= n
            prompt_budget -= n if prompt else 0
        self._admit(batch, min(budget, prompt_budget))
        return batch

    def _make_room(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Grow seq's blocks for n more tokens, preempting later sequences if needed."""
        while True:
            try:
                self.cache.grow(seq.blocks, seq.computed + n)
                return True
            except OutOfBlocksError:
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    self.running.remove(seq)
                    batch.overflowed.append(seq)  # the whole cache is not enough for it
                    return False
                self._preempt(victim, batch)
                if victim is seq:
                    return False

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        if seq in batch.seqs:  # scheduled earlier in this step: take it back out
            i = batch.seqs.index(seq)
            for column in (batch.seqs, batch.counts, batch.starts):
                del column[i]
        self.running.remove(seq)
        self.cache.free(seq.blocks)
        seq.computed = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        skipped = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            if seq.pending < 1:  # its stream input has not brought enough tokens yet
                skipped.append(seq)
                continue
            if not seq.blocks.table and self.salt is not None and seq.embeds is None:
                # fresh, or preempted: reuse what the cache still has of its prefix
                seq.computed = self.cache.attach_prefix(seq.blocks, seq.tokens, self.salt)
            n = min(seq.pending, budget)
            try:
                self.cache.grow(seq.blocks, seq.computed + n)
            except OutOfBlocksError:
                self.cache.free(seq.blocks)  # its prefix stays cached for the retry
                seq.computed = 0
                if not self.running and not batch.seqs:
                    batch.overflowed.append(seq)  # alone and still too big
                else:
                    self.waiting.appendleft(seq)  # wait for running ones to finish
                break
            self.running.append(seq)
            self._take(batch, seq, n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    @staticmethod
    def _take(batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        batch.seqs.append(seq)
        batch.counts.append(n)
        batch.starts.append(seq.computed)

    def finish_step(self, batch: ScheduledBatch) -> None:
        """The step ran: its tokens' KV is written; full blocks become shareable."""
        for seq, n in zip(batch.seqs, batch.counts, strict=True):
            seq.computed += n
            # ids of embeds say nothing; and most decode steps fill no block: skip building
            # the token list then (it costs O(context) per sequence per step)
            if (self.salt is not None and seq.embeds is None
                    and seq.computed // self.cache.block_size > len(seq.blocks.hashes)):
                self.cache.publish_full(seq.blocks, seq.tokens[:seq.computed], self.salt)
