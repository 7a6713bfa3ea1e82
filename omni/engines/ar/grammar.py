"""Structured output: a request's JSON schema as a grammar whose token mask the sampler
applies (response_format json_object / json_schema; the API checks the schema first:
omni/api/schemas/response_format.py).

The library is llguidance (not xgrammar). bench/probes/grammar_mask.py walked 8
constrained rows through a 7-field schema's answer on a 2-core CPU: xgrammar filled the
8 rows' bitmasks faster (a median 0.012 ms per step against 0.092 ms with a 49k-token
vocabulary; 0.007 vs 0.079 ms with a 1k one; bench/results/structured.md), both well
under a decode step. But xgrammar 0.2.9 let a random model put raw control characters (U+000F) into a
string with a maxLength (its bounded-string rule excludes only the quote, the
backslash, CR and LF), which is not JSON:
json.loads refused the answer. llguidance refused the same token. Correct output first.
llguidance also checks a schema without a tokenizer and without importing torch, so the
API answers 400 before the request reaches an engine. Its own apply kernel is
torch.compile'd; the mask is applied here with plain torch ops on the logits' device.

Per request: a matcher copied from the schema's template matcher (built once per schema
text, an LRU of MAX_COMPILED); per step: each constrained row's bitmask is filled on the
host (llguidance's thread pool), then applied to the batch's logits at once, so
constrained and free rows share a step; the matcher takes each accepted token
(SequenceSampler.append). Once the value is complete the grammar stops and so does the
request (finish_reason "stop", state.finish_reason); a value that could go on (a top-level
number) allows the model's end tokens, which end it too.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

MAX_COMPILED = 64  # template matchers kept per engine, by schema / grammar text
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# the JSON the grammar emits: one line, OpenAI's separators (no whitespace for a random
# or small model to loop in)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NEG_INF = float("-inf")


def schema_grammar(schema: str) -> str:
    """The llguidance grammar of a JSON schema's text (json.loads errors are ValueErrors)."""
    import llguidance
    return llguidance.LLMatcher.grammar_from_json_schema(json.loads(schema),
                                                         defaults=dict(JSON_OPTIONS))


class GrammarCompiler:
    """The engine's llguidance tokenizer (built on the first constrained request: about a
    second for a large vocabulary) and a template matcher per schema."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int]) -> None:
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._stop_ids = sorted({int(t) for t in stop_ids if int(t) < vocab_size})
        self._lltok: Any = None
        self._templates: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()  # the media encoder's thread also admits requests

    def matcher(self, params: Any) -> RowGrammar | None:
        """A fresh matcher for a request's ``json_schema`` or ``grammar`` (Lark) param;
        None: unconstrained. What the library refuses is a ValueError naming it."""
        if params.json_schema is not None:
            key = ("json_schema", params.json_schema)
        elif params.grammar is not None:
            key = ("grammar", params.grammar)
        else:
            return None
        with self._lock:
            template = self._templates.get(key)
            if template is None:
                template = self._template(*key)
            self._templates.move_to_end(key)
            return RowGrammar(template.deep_copy())

    def _template(self, kind: str, text: str) -> Any:
        import llguidance
        import llguidance.hf
        if self._lltok is None:
            self._lltok = llguidance.hf.from_tokenizer(
                self._tokenizer, n_vocab=self._vocab_size, eos_token=self._stop_ids or None)
        grammar = (schema_grammar(text) if kind == "json_schema"
                   else llguidance.LLMatcher.grammar_from_lark(text))
        problem = llguidance.LLMatcher.validate_grammar(grammar)
        if problem:
            raise ValueError(f"{kind}: {problem}")
        template = llguidance.LLMatcher(self._lltok, grammar, log_level=0)
        if template.is_error():
            raise ValueError(f"{kind}: {template.get_error()}")
        self._templates[(kind, text)] = template
        if len(self._templates) > MAX_COMPILED:
            self._templates.popitem(last=False)
        return template


class RowGrammar:
    """One sequence's matcher: the mask of its next token, the tokens it took."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    @property
    def done(self) -> bool:
        """The value is complete (or the matcher failed): nothing more may follow."""
        return self.matcher.is_stopped()

    def accept(self, token: int) -> None:
        if not self.done:  # a refused token (it was masked out) stops the matcher
            self.matcher.consume_token(int(token))


def apply_grammars(logits: torch.Tensor, grammars: Sequence[RowGrammar | None]) -> None:
    """Mask, in place, every constrained row's logits to the tokens its grammar allows.

    The bitmasks are filled on the host before anything waits for the device: with
    overlapped steps (steps.py) this runs while the step's forward still computes, and
    always after the previous token was taken (the caller samples after recording it)."""
    rows = [i for i, g in enumerate(grammars) if g is not None and not g.done]
    if not rows:
        return
    import llguidance.torch as llt
    vocab = logits.shape[1]
    mask = torch.full(((len(rows)), (vocab + 31) // 32), -1, dtype=torch.int32)
    llt.fill_next_token_bitmask_par(_executor(), [(grammars[i].matcher, j)
                                                  for j, i in enumerate(rows)], mask)
    bias = refusal_bias(mask.to(logits.device, non_blocking=True), vocab)
    logits.index_add_(0, torch.tensor(rows, device=logits.device), bias)


_EXECUTOR: list[Any] = []


def _executor() -> Any:
    """llguidance's thread pool for the masks, one per process."""
    if not _EXECUTOR:
        import llguidance
        _EXECUTOR.append(llguidance.LLExecutor())
    return _EXECUTOR[0]


def refusal_bias(mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(R, ceil(V/32)) int32 words (bit b of word w set: token 32w + b allowed) -> (R, V)
    float32, 0 where allowed and -inf where refused, to add to the logits.

    Each byte of the words is looked up in a 256 x 8 table (an embedding lookup): on a
    2-core CPU, 8 rows of a 49k vocabulary took 0.27 ms this way against 3.1 ms for
    shifting out the bits and masked_fill (little-endian bytes: byte k of a word holds
    tokens 8k to 8k + 7)."""
    table = _bias_table(mask.device)
    rows = mask.shape[0]
    return torch.nn.functional.embedding(mask.view(torch.uint8).long(), table).reshape(
        rows, -1)[:, :vocab]


_TABLES: dict[torch.device, torch.Tensor] = {}


def _bias_table(device: torch.device) -> torch.Tensor:
    if device not in _TABLES:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        _TABLES[device] = torch.zeros(256, 8).masked_fill_(bits == 0, _NEG_INF).to(device)
    return _TABLES[device]
