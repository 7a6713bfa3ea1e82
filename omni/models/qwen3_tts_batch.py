"""Qwen3-TTS's talker as a running batch that sentences join and leave step by step.

qwen-tts's ``generate`` runs one batch of sentences from one prefill to the end of the
longest. Here each step advances every active sentence by one frame with one batched
talker forward, sentences prefilled since the last step join it, and ended ones leave:

- the batch is one left-padded KV cache (the layout qwen-tts's own batched generate uses):
  sentences that join together are prefilled by the talker alone (qwen-tts's prompt, from
  its generate: qwen3_tts_stream.capture_prefill), then their cache and the batch's are padded
  on the left to one length and concatenated; the attention mask hides the padding. Rows
  that leave are dropped, and columns that are padding in every row are cut;
- positions: the talker takes a decode step's rotary position as ``cache_position +
  rope_deltas`` (its own attribute, set from the prefill's mask): here it is set before each
  step to each row's real length minus the cache's, so a row sees the positions it would
  alone. While some row has padding, the step's mask goes in 4D, as transformers would
  build it from the 2D one (the query sees every unpadded column), which spares it
  building one each step;
- the trailing text: the talker adds ``trailing_text_hidden[:, generation_step]`` (one step
  counter for the batch) or the pad embedding after its end; here each row keeps its own
  step, and the step's (B, 1, H) slice is handed over with generation_step 0;
- sampling is batched over all rows with transformers' processors in generate's order
  (logits_processors): each row's token history is left-padded with a suppressed id
  (penalized by the repetition penalty, then suppressed: no effect), and the two-token
  minimum reads each row's own count. A request with a ``seed`` draws from its own
  generator, the talker's token and the code predictor's 15 codes alike (RowDraws), in the
  order qwen-tts's generate draws them, so its codes equal qwen-tts's for it alone after
  ``torch.manual_seed(seed)``, whatever the batch; other rows draw from the global RNG.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.models.qwen3_tts_predictor import predicting_with

# the talker's prefill keywords that stay the same for every step (the rest is state)
_STATE_KEYS = frozenset({"inputs_embeds", "position_ids", "attention_mask", "cache_position",
                         "past_key_values", "past_hidden", "trailing_text_hidden",
                         "tts_pad_embed", "generation_step", "input_ids"})


def logits_processors(gen: dict[str, Any], eos: int, vocab: int,
                      device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """transformers' processors for the talker's generate, in generate's order, as the
    ones before and after its two-token minimum (qwen-tts's min_new_tokens=2), which
    TalkerBatch applies per row (rows have histories of their own lengths). ``device``
    is the logits': the suppressed ids' tensor lives there (transformers' default, the
    CPU, fails ``isin`` against CUDA logits)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    before, after = LogitsProcessorList(), LogitsProcessorList()
    if gen["repetition_penalty"] not in (None, 1.0):
        before.append(RepetitionPenaltyLogitsProcessor(penalty=gen["repetition_penalty"]))
    after.append(SuppressTokensLogitsProcessor(suppressed(eos, vocab), device=device))
    if gen["do_sample"]:
        after.extend(warpers(gen["temperature"], gen["top_k"], gen["top_p"]))
    return before, after


def suppressed(eos: int, vocab: int) -> list[int]:
    """The codec's special ids the talker never samples (all but end-of-speech)."""
    return [i for i in range(vocab - 1024, vocab) if i != eos]


def warpers(temperature: float | None, top_k: int | None, top_p: float | None) -> list[Any]:
    """transformers' sampling warpers for these arguments, as its generate adds them."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list[Any] = []
    if temperature is not None and temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k:
        out.append(TopKLogitsWarper(top_k=top_k))
    if top_p is not None and top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=top_p))
    return out


def draw(scores: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row as transformers samples it (softmax, multinomial): a row with a
    generator draws alone from it (as a batch of one would from the global RNG), the
    others together from the global RNG."""
    probs = torch.softmax(scores, dim=-1)
    shared = [i for i, g in enumerate(generators) if g is None]
    if len(shared) == len(generators):
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    token = torch.empty(len(generators), dtype=torch.long, device=scores.device)
    if shared:
        token[shared] = torch.multinomial(probs[shared], num_samples=1).squeeze(1)
    for i, g in enumerate(generators):
        if g is not None:
            token[i] = torch.multinomial(probs[i:i + 1], num_samples=1, generator=g)[0, 0]
    return token


class RowDraws:
    """A logits processor for the code predictor's generate, run greedy: it warps and
    draws each row's code itself (draw()) and leaves only that code possible, so the
    greedy pick is the per-row sample."""

    def __init__(self, warps: list[Any], generators: list[torch.Generator | None]) -> None:
        self.warps = warps
        self.generators = generators

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warp in self.warps:
            scores = warp(input_ids, scores)
        token = draw(scores, self.generators)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, token[:, None], 0.0)


@contextlib.contextmanager
def drawing_per_row(predictor: Any, draws: RowDraws) -> Any:
    """The code predictor's generate with ``draws`` as its last logits processor (the
    talker's forward calls it with fixed arguments)."""
    from transformers.generation.logits_process import LogitsProcessorList

    predictor.generate = functools.partial(type(predictor).generate.__get__(predictor),
                                           logits_processor=LogitsProcessorList([draws]))
    try:
        yield
    finally:
        del predictor.generate  # the class's method again


@dataclass
class Row:
    """One sentence: its frames and how far they were decoded (qwen3_tts_stream.py)."""

    frames: list[torch.Tensor] = field(default_factory=list)  # (groups,) codes each
    context: torch.Tensor | None = None  # (T, groups) reference codes decoded before it
    generator: torch.Generator | None = None  # a seeded request's draws
    decoded: int = 0  # frames already sent as audio
    chunks: int = 0  # chunks already sent
    ended: bool = False  # end of speech (or max_new_tokens) reached


def _pad_left(t: torch.Tensor, dim: int, length: int, value: int = 0) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_full(shape, value), t], dim=dim)


def _pad_trailing(t: torch.Tensor, width: int, pad: torch.Tensor) -> torch.Tensor:
    """(b, w, H) -> (b, width, H), the new columns the pad embedding."""
    if t.shape[1] >= width:
        return t
    return torch.cat([t, pad.expand(t.shape[0], width - t.shape[1], -1)], dim=1)


class TalkerBatch:
    """qwen-tts's talker over a batch of sentences that join and leave (module docstring)."""

    def __init__(self, model: Any, gen: dict[str, Any], graphed: Any = None) -> None:
        cfg = model.config.talker_config
        self.graphed = graphed  # qwen3_tts_predictor.GraphedPredictor, or None
        self.talker = model.talker
        self.eos = int(cfg.codec_eos_token_id)
        self.groups = int(cfg.num_code_groups)
        self.do_sample = bool(gen["do_sample"])
        self.max_new = int(gen["max_new_tokens"])
        vocab = int(cfg.vocab_size)
        device = next(model.talker.parameters()).device
        self.before_min, self.after_min = logits_processors(gen, self.eos, vocab, device)
        self.no_token = suppressed(self.eos, vocab)[0]  # pads a history: never sampled
        self.code_warps = warpers(gen["subtalker_temperature"], gen["subtalker_top_k"],
                                  gen["subtalker_top_p"])
        self.rows: list[Row] = []  # the active rows, in batch order
        self.fixed: dict[str, Any] = {}  # the prefill's keywords that every step repeats
        self._clear()

    def _clear(self) -> None:
        # cache (B, heads, T, dim) per layer, mask (B, T), past_hidden (B, 1, H), sampled
        # tokens (B, t; left-padded with no_token) and their count (B,), trailing text
        # (B, W, H; past a row's end the pad embedding), each row's step into it (B,), the
        # pad embedding (1, 1, H)
        self.cache = self.mask = self.past_hidden = self.tokens = self.counts = None
        self.trailing = self.steps = self.pad = None
        self.padded = False  # some row has padding (else transformers skips the mask)

    @property
    def active(self) -> bool:
        return bool(self.rows)

    def join(self, prefill: dict[str, Any], rows: list[Row]) -> None:
        """Prefill qwen-tts's prompt for ``rows`` and add them to the batch: they step
        with it from the next step on."""
        out = self.talker(**prefill)  # the prefill, as generate's first call
        self.fixed = self.fixed or {k: v for k, v in prefill.items() if k not in _STATE_KEYS}
        device = out.logits.device
        tokens = torch.zeros(len(rows), 0, dtype=torch.long, device=device)
        counts = torch.zeros(len(rows), dtype=torch.long, device=device)
        tokens, counts = self._sample(rows, out.logits[:, -1, :], tokens, counts)
        pad = prefill["tts_pad_embed"]
        trailing = prefill["trailing_text_hidden"]
        self._merge(rows, out.past_key_values, prefill["attention_mask"], out.past_hidden,
                    _pad_trailing(trailing, trailing.shape[1] + 1, pad), tokens, counts, pad)
        self._leave()

    def _merge(self, rows: list[Row], cache: Any, mask: torch.Tensor, past_hidden: torch.Tensor,
               trailing: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor,
               pad: torch.Tensor) -> None:
        steps = torch.zeros(len(rows), dtype=torch.long, device=mask.device)
        if not self.rows:
            self.cache, self.mask, self.past_hidden = cache, mask, past_hidden
            self.trailing, self.tokens, self.counts = trailing, tokens, counts
            self.steps, self.pad = steps, pad
            self.rows = list(rows)
            self.padded = not bool(mask.all())
            return
        length = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, 2, length),
                                   _pad_left(theirs.keys, 2, length)])
            mine.values = torch.cat([_pad_left(mine.values, 2, length),
                                     _pad_left(theirs.values, 2, length)])
        self.mask = torch.cat([_pad_left(self.mask, 1, length), _pad_left(mask, 1, length)])
        width = max(self.trailing.shape[1], trailing.shape[1])
        self.trailing = torch.cat([_pad_trailing(self.trailing, width, pad),
                                   _pad_trailing(trailing, width, pad)])
        width = max(self.tokens.shape[1], tokens.shape[1])
        self.tokens = torch.cat([_pad_left(self.tokens, 1, width, self.no_token),
                                 _pad_left(tokens, 1, width, self.no_token)])
        self.counts = torch.cat([self.counts, counts])
        self.past_hidden = torch.cat([self.past_hidden, past_hidden])
        self.steps = torch.cat([self.steps, steps])
        self.rows += rows
        self.padded = not bool(self.mask.all())

    def step(self) -> None:
        """One talker forward for every active row: the previous token's frame completes
        (appended to its row), then each row's next token."""
        batch, length = self.mask.shape
        # each row's rotary position: its real tokens so far (the talker adds the deltas
        # to the cache position, which counts the padding too)
        self.talker.rope_deltas = self.mask.sum(-1, keepdim=True) - length
        mask = torch.cat([self.mask, self.mask.new_ones(batch, 1)], dim=-1)
        at = self.steps.clamp(max=self.trailing.shape[1] - 1)
        trailing = self.trailing[torch.arange(batch, device=at.device), at][:, None]
        kwargs = {**self.fixed, "input_ids": self.tokens[:, -1:],
                  "attention_mask": mask[:, None, None, :].bool() if self.padded else mask,
                  "cache_position": torch.tensor([length], device=mask.device),
                  "past_key_values": self.cache, "past_hidden": self.past_hidden,
                  "trailing_text_hidden": trailing, "generation_step": 0,
                  "tts_pad_embed": self.pad}
        generators = [row.generator for row in self.rows]
        if kwargs.get("subtalker_dosample") and any(g is not None for g in generators):
            kwargs["subtalker_dosample"] = False  # RowDraws samples
            with drawing_per_row(self.talker.code_predictor,
                                 RowDraws(self.code_warps, generators)):
                out = self.talker(**kwargs)
        else:
            with predicting_with(self.talker.code_predictor, self.graphed):
                out = self.talker(**kwargs)
        self.mask, self.past_hidden, self.steps = mask, out.past_hidden, self.steps + 1
        codes = out.hidden_states[1]  # (B, groups): the previous token's frame
        for i, row in enumerate(self.rows):
            row.frames.append(codes[i])
        self.tokens, self.counts = self._sample(self.rows, out.logits[:, -1, :], self.tokens,
                                                self.counts)
        self._leave()

    def _sample(self, rows: list[Row], logits: torch.Tensor, tokens: torch.Tensor,
                counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next token after its history ``tokens`` (``counts`` real ones):
        (the history with it, the counts)."""
        scores = self.before_min(tokens, logits.to(copy=True, dtype=torch.float32))
        scores[counts < 2, self.eos] = float("-inf")  # at least two tokens (qwen-tts)
        scores = self.after_min(tokens, scores)
        if self.do_sample:
            token = draw(scores, [row.generator for row in rows])
        else:
            token = torch.argmax(scores, dim=-1)
        counts = counts + 1
        hit = ((token == self.eos) | (counts >= self.max_new)).tolist()  # one device sync
        for row, end in zip(rows, hit, strict=True):
            # a row's frames end before its end-of-speech token; at max_new_tokens the
            # last token's frame is never completed (qwen-tts keeps the complete ones)
            row.ended = row.ended or end
        return torch.cat([tokens, token[:, None]], dim=-1), counts

    def drop(self, rows: list[Row]) -> None:
        """Rows whose requests are gone leave the batch."""
        for row in rows:
            row.ended = True
        self._leave()

    def _leave(self) -> None:
        """Ended rows leave the batch; columns that are padding in every row go."""
        keep = [i for i, row in enumerate(self.rows) if not row.ended]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._clear()
            return
        index = torch.tensor(keep, device=self.mask.device)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.mask, self.past_hidden = self.mask[index], self.past_hidden[index]
        self.trailing, self.steps = self.trailing[index], self.steps[index]
        self.counts = self.counts[index]
        self.tokens = self.tokens[index, -int(self.counts.max()):]
        start = int(self.mask.any(0).long().argmax())  # the first column some row uses
        if start:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
        self.padded = not bool(self.mask.all())
