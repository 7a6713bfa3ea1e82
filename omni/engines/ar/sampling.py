"""Sampling params and batched token sampling for AR engines (detokenization:
``omni.engines.ar.detokenizer``).

Logit processing order (matches transformers' generate, plus OpenAI's penalties):
repetition penalty (HF: prompt + generated tokens) -> presence/frequency penalty (OpenAI:
generated tokens only) -> min_tokens (eos and stop_token_ids masked) -> greedy argmax at
temperature 0, else temperature -> top_k -> top_p -> min_p -> sample from the softmax.

A request with a JSON schema (grammar.py) has its row masked to what the grammar allows
first, before the penalties (its min_tokens rule then yields to the grammar).

Logprobs describe the model's own distribution: log_softmax of the raw logits, before any
penalty or temperature (vLLM's default), so they do not depend on the sampling params.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from omni.engines.ar.grammar import RowGrammar, apply_grammars

MAX_STOPS = 16
MAX_LOGPROBS = 20
GREEDY_EPS = 1e-5  # lower temperatures are greedy: dividing would overflow (as vLLM)
_NEG_INF = float("-inf")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name: str, v: Any, low: int, high: int | None = None) -> None:
    if not _is_int(v) or v < low or (high is not None and v > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {v!r}")


def _check_float(name: str, v: Any, test: Callable[[float], bool], what: str) -> float:
    # the type is checked first, so `test` only ever sees a finite number
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not test(v):
        raise ValueError(f"{name} must be a finite number {what}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class SamplingParams:
    """Validated per-request sampling params; construction raises ValueError naming the field."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1 on input) = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives returned besides the sampled token
    json_schema: str | None = None  # structured output: the schema's JSON text (grammar.py)
    grammar: str | None = None  # or any grammar, in llguidance's Lark (tool calls: grammar.py)

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens "
                             f"({self.max_tokens})")
        self._set_floats()
        _check_int("top_k", self.top_k, -1)
        object.__setattr__(self, "top_k", max(self.top_k, 0))
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        object.__setattr__(self, "stop", _stop_tuple(self.stop))
        ids = self.stop_token_ids
        if not isinstance(ids, list | tuple) or not all(_is_int(i) and i >= 0 for i in ids):
            raise ValueError(f"stop_token_ids must be a list of integers >= 0, got {ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(ids))
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.json_schema is not None and (not isinstance(self.json_schema, str)
                                             or not self.json_schema):
            raise ValueError(f"json_schema must be a schema's JSON text, got {self.json_schema!r}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar
                                         or self.json_schema is not None):
            raise ValueError("grammar must be a Lark grammar's text, and not beside json_schema")

    def _set_floats(self) -> None:
        checks = {
            "temperature": (lambda x: x >= 0, ">= 0"),
            "top_p": (lambda x: 0 < x <= 1, "in (0, 1]"),
            "min_p": (lambda x: 0 <= x <= 1, "in [0, 1]"),
            "repetition_penalty": (lambda x: x > 0, "> 0"),
            "presence_penalty": (lambda x: -2 <= x <= 2, "in [-2, 2]"),
            "frequency_penalty": (lambda x: -2 <= x <= 2, "in [-2, 2]"),
        }
        for name, (test, what) in checks.items():
            object.__setattr__(self, name, _check_float(name, getattr(self, name), test, what))

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> SamplingParams:
        """From request params: unknown keys are ignored, None means the default."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known and v is not None})

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def _stop_tuple(stop: Any) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, list | tuple) or len(stops) > MAX_STOPS \
            or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a non-empty string or a list of up to {MAX_STOPS} "
                         f"of them, got {stop!r}")
    return tuple(stops)


class SequenceSampler:
    """Per-request sampling state: the seeded generator and what the penalties need."""

    def __init__(self, params: SamplingParams, prompt_ids: Iterable[int] = (),
                 device: torch.device | str | None = None, grammar: RowGrammar | None = None):
        self.params = params
        self.grammar = grammar  # the matcher of params.json_schema / .grammar (the engine's)
        self.num_generated = 0
        self.counts: dict[int, int] = {}  # generated token -> count (presence/frequency)
        self._generator: torch.Generator | None = None
        if params.seed is not None and device is not None:
            self.generator(torch.device(device))
        # repetition penalty: ids seen in prompt + output, as a CPU tensor that only grows
        # when a new id appears, so a step costs one copy, not a rebuild from the prompt
        self._seen: set[int] = set()
        self._seen_ids = torch.empty(0, dtype=torch.long)
        self._new_seen: list[int] = []
        if params.repetition_penalty != 1.0:
            self._seen = {int(t) for t in prompt_ids}
            self._seen_ids = torch.tensor(sorted(self._seen), dtype=torch.long)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """The request's generator, created on first use on the logits' device."""
        if self.params.seed is None:
            return None
        if self._generator is None:
            self._generator = torch.Generator(device=device).manual_seed(self.params.seed)
        elif self._generator.device.type != device.type:
            raise ValueError(f"seeded request's generator is on {self._generator.device}, "
                             f"logits on {device}")
        return self._generator

    def append(self, token_id: int) -> None:
        """Record the token sampled this step."""
        token_id = int(token_id)
        self.num_generated += 1
        self.counts[token_id] = self.counts.get(token_id, 0) + 1
        if self.grammar is not None:
            self.grammar.accept(token_id)
        if self.params.repetition_penalty != 1.0 and token_id not in self._seen:
            self._seen.add(token_id)
            self._new_seen.append(token_id)

    def seen_ids(self) -> torch.Tensor:
        if self._new_seen:
            new = torch.tensor(self._new_seen, dtype=torch.long)
            self._seen_ids, self._new_seen = torch.cat([self._seen_ids, new]), []
        return self._seen_ids


@dataclass
class TokenLogprobs:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # by logprob, descending


@dataclass
class Sampled:
    token: int
    logprobs: TokenLogprobs | None = None


def _row_param(seqs: Sequence[SequenceSampler], name: str, device: torch.device,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor([getattr(s.params, name) for s in seqs], dtype=dtype, device=device)


def _apply_repetition(logits: torch.Tensor, seqs: Sequence[SequenceSampler]) -> None:
    rows = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
    if not rows:
        return
    ids = [seqs[i].seen_ids() for i in rows]
    lengths = torch.tensor([len(t) for t in ids])
    r = torch.repeat_interleave(torch.tensor(rows), lengths)
    t = torch.cat(ids)
    keep = t < logits.shape[1]  # ids past the logits' vocab can't be sampled (HF drops them)
    r, t = r[keep].to(logits.device), t[keep].to(logits.device)
    penalty = _row_param(seqs, "repetition_penalty", logits.device)[r]
    vals = logits[r, t]
    logits[r, t] = torch.where(vals < 0, vals * penalty, vals / penalty)


def _apply_presence_frequency(logits: torch.Tensor, seqs: Sequence[SequenceSampler]) -> None:
    rows, toks, counts = [], [], []
    for i, s in enumerate(seqs):
        p = s.params
        if p.presence_penalty or p.frequency_penalty:
            for tok, n in s.counts.items():
                if tok < logits.shape[1]:
                    rows.append(i)
                    toks.append(tok)
                    counts.append(n)
    if not rows:
        return
    dev = logits.device
    r = torch.tensor(rows, device=dev)
    t = torch.tensor(toks, device=dev)
    c = torch.tensor(counts, dtype=logits.dtype, device=dev)
    pres = _row_param(seqs, "presence_penalty", dev)[r]
    freq = _row_param(seqs, "frequency_penalty", dev)[r]
    logits.index_put_((r, t), -(pres + freq * c), accumulate=True)  # (row, tok) pairs unique


def _apply_min_tokens(logits: torch.Tensor, seqs: Sequence[SequenceSampler],
                      eos_ids: Iterable[int]) -> None:
    eos = [int(e) for e in eos_ids]
    for i, s in enumerate(seqs):
        if s.num_generated < s.params.min_tokens and s.grammar is None:
            banned = [t for t in (*eos, *s.params.stop_token_ids) if t < logits.shape[1]]
            if banned:
                logits[i, banned] = _NEG_INF


def _apply_warpers(logits: torch.Tensor, seqs: Sequence[SequenceSampler]) -> torch.Tensor:
    """temperature -> top_k -> top_p -> min_p per row, as transformers' warpers do them.

    Greedy rows are left alone (their argmax would not change). One descending sort
    serves top_k and top_p: masking below the k-th value keeps the sort order."""
    dev, vocab = logits.device, logits.shape[1]
    temp, top_k, top_p, min_p = (list(c) for c in zip(*(_warp_params(s.params, vocab)
                                                         for s in seqs), strict=True))
    if any(t != 1.0 for t in temp):
        logits = logits / torch.tensor(temp, device=dev)[:, None]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        logits = _top_k_top_p(logits, top_k, top_p)
    if any(min_p):
        probs = torch.softmax(logits, dim=-1)
        floor = torch.tensor(min_p, device=dev)[:, None] * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, _NEG_INF)  # the top token always stays
    return logits


def _warp_params(p: SamplingParams, vocab: int) -> tuple[float, int, float, float]:
    """(temperature, top_k, top_p, min_p) of a row; all neutral for a greedy row."""
    if p.greedy:
        return 1.0, vocab, 1.0, 0.0
    return p.temperature, min(p.top_k, vocab) or vocab, p.top_p, p.min_p


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    dev = logits.device
    desc, order = torch.sort(logits, dim=-1, descending=True)
    kth = desc.gather(1, torch.tensor(top_k, device=dev)[:, None] - 1)
    desc = desc.masked_fill(desc < kth, _NEG_INF)
    # top_p exactly as TopPLogitsWarper: ascending cumulative probs, drop those <= 1 - p,
    # always keep the top token. Same values in the same order -> the same float sums.
    asc = desc.flip(-1)
    cum = asc.softmax(dim=-1).cumsum(dim=-1)
    cut = torch.tensor([1 - p for p in top_p], device=dev)[:, None]
    drop_asc = (cum <= cut) & torch.tensor([p < 1.0 for p in top_p], device=dev)[:, None]
    drop_asc[:, -1] = False
    desc = desc.masked_fill(drop_asc.flip(-1), _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, desc)


def processed_logits(logits: torch.Tensor, seqs: Sequence[SequenceSampler],
                     eos_ids: Iterable[int] = ()) -> torch.Tensor:
    """Float32 (B, V) logits after penalties, min_tokens and the warpers: what is sampled
    from (greedy rows: argmax of it). Filtered tokens are -inf. The input is not changed."""
    if logits.dim() != 2 or logits.shape[0] != len(seqs):
        raise ValueError(f"logits must be (B, V) with B = {len(seqs)}, got {tuple(logits.shape)}")
    out = logits.float()
    out = out.clone() if out is logits else out
    apply_grammars(out, [s.grammar for s in seqs])
    _apply_repetition(out, seqs)
    _apply_presence_frequency(out, seqs)
    _apply_min_tokens(out, seqs, eos_ids)
    return _apply_warpers(out, seqs)


def _draw(processed: torch.Tensor, seqs: Sequence[SequenceSampler]) -> list[int]:
    dev = processed.device
    tokens = torch.empty(len(seqs), dtype=torch.long, device=dev)
    greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
    if greedy:
        idx = torch.tensor(greedy, device=dev)
        tokens[idx] = processed[idx].argmax(dim=-1)
    shared = [i for i, s in enumerate(seqs) if not s.params.greedy and s.params.seed is None]
    if shared:  # unseeded rows share the global RNG and one multinomial call
        idx = torch.tensor(shared, device=dev)
        tokens[idx] = torch.multinomial(torch.softmax(processed[idx], dim=-1), 1)[:, 0]
    for i, s in enumerate(seqs):
        if not s.params.greedy and s.params.seed is not None:
            # own generator per seeded row: its tokens do not depend on the batch around it
            probs = torch.softmax(processed[i:i + 1], dim=-1)
            tokens[i] = torch.multinomial(probs, 1, generator=s.generator(dev))[0, 0]
    return tokens.tolist()


def _logprobs(raw: torch.Tensor, seqs: Sequence[SequenceSampler],
              tokens: list[int]) -> list[TokenLogprobs | None]:
    out: list[TokenLogprobs | None] = [None] * len(seqs)
    rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    if not rows:
        return out
    dev = raw.device
    lp = torch.log_softmax(raw[torch.tensor(rows, device=dev)].float(), dim=-1)
    chosen = lp.gather(1, torch.tensor([[tokens[i]] for i in rows], device=dev))[:, 0].tolist()
    n = min(max(seqs[i].params.logprobs for i in rows), lp.shape[1])
    top_v, top_i = [[]] * len(rows), [[]] * len(rows)
    if n:
        values, indices = lp.topk(n, dim=-1)  # sorted, highest first
        top_v, top_i = values.tolist(), indices.tolist()
    for j, i in enumerate(rows):
        k = seqs[i].params.logprobs
        out[i] = TokenLogprobs(tokens[i], chosen[j], list(zip(top_i[j][:k], top_v[j][:k], strict=True)))
    return out


def plain_greedy(s: SequenceSampler) -> bool:
    """A row whose token is the argmax of its raw logits: the usual batch-wide case,
    taken without the float copy, the per-rule passes and the index round trips."""
    p = s.params
    return (p.greedy and p.logprobs is None and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty
            and s.num_generated >= p.min_tokens and s.grammar is None)


def sample(logits: torch.Tensor, seqs: Sequence[SequenceSampler],
           eos_ids: Iterable[int] = ()) -> list[Sampled]:
    """One token per row of (B, V) logits; the caller then calls seqs[i].append(token)."""
    if not seqs:
        return []
    if all(plain_greedy(s) for s in seqs):  # no penalty, filter or logprobs: one argmax
        return [Sampled(t, None) for t in logits.argmax(dim=-1).tolist()]
    eos_ids = tuple(eos_ids)
    tokens = _draw(processed_logits(logits, seqs, eos_ids), seqs)
    lps = _logprobs(logits, seqs, tokens)
    return [Sampled(t, lp) for t, lp in zip(tokens, lps, strict=True)]
