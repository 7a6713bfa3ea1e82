"""What the AR engine (engine.py) keeps per sequence and per launched step, and the output
record of one sampled token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni.engines.ar.detokenizer import IncrementalDetokenizer
from omni.engines.ar.inputs import check_prompt_length, logprobs_entry, take_chunk
from omni.engines.ar.sampling import SamplingParams, SequenceSampler
from omni.engines.ar.scheduler import Sequence


@dataclass
class SequenceState:
    """A sequence's own data (``Sequence.state``), which the scheduler carries but does
    not look at. The orchestrator's per-request record is omni/runtime/request_state.py's
    RequestState."""

    params: SamplingParams
    sampler: SequenceSampler
    detok: IncrementalDetokenizer
    started: bool = False
    stream_from: str | None = None  # the producer stage feeding this request's prompt
    stream_seq: int = 0  # next chunk number expected from it
    stream_text: str = ""  # text chunks, tokenized together when the stream ends
    hidden: list[torch.Tensor] | None = None  # exported hidden states not yet sent
    exported: int = 0  # positions whose hidden states were exported (a recompute skips them)
    finish: str | None = None  # the finish reason of the last recorded token
    session: str | None = None  # its KV blocks stay with this session (session_kv.py)


@dataclass
class Flight:
    """A launched step whose tokens are not sampled yet."""

    seqs: list[Sequence]  # the batch
    hidden: list[torch.Tensor] | None  # per sequence of the batch (export_hidden_layers)
    sampled: list[Sequence]  # the rows of logits
    logits: torch.Tensor
    started: float
    settle: Any = None  # a chained step's batch, counted as computed once its input is known
    next_ids: torch.Tensor | None = None  # greedy tokens picked on the device (chainable)
    host_ids: torch.Tensor | None = None  # their copy on the host
    event: Any = None  # recorded after that copy (CUDA)
    tokens: int = 0  # tokens the step fed (prompt chunks and decode rows)


def new_sequence(lm: Any, grammars: Any, capacity: int, rid: str, params: SamplingParams,
                 ids: list[int], embeds: Any, media: Any, *, producer: str | None,
                 session: str | None, field: str | None = None) -> Sequence:
    """A request's Sequence, its prompt checked against the KV cache's ``capacity`` (in
    tokens) and the model's context; ``producer``: the stage streaming its prompt in (the
    input stays open); ``grammars``: the engine's GrammarCompiler; ``field``: the request
    field the prompt came in, which a refusal names."""
    # the context too: media prompts grow (image tokens) after prompt_ids checked it
    check_prompt_length(len(ids), capacity, lm.max_positions, field)
    penalized = ids if embeds is None else []  # placeholder ids are not the prompt
    sampler = SequenceSampler(params, penalized, lm.device, grammars.matcher(params))
    state = SequenceState(params, sampler, IncrementalDetokenizer(lm.tokenizer, params.stop),
                          stream_from=producer, session=session)
    return Sequence(rid, ids, state, input_open=producer is not None, embeds=embeds,
                    media=media)


def take_stream_chunk(lm: Any, grammars: Any, seq: Sequence, producer: str, seq_no: int,
                      data: dict[str, Any], last: bool) -> None:
    """One APPEND chunk of a prompt that ``producer`` streams in (inputs.take_chunk); the
    last one closes the input. ValueError: a chunk from another producer, after the
    end, or out of order."""
    state: SequenceState = seq.state
    if producer != state.stream_from or not seq.input_open:
        raise ValueError(f"unexpected stream input from '{producer}'")
    if seq_no != state.stream_seq:
        raise ValueError(f"chunk {seq_no} from '{producer}', expected {state.stream_seq}")
    state.stream_seq += 1
    state.stream_text += take_chunk(lm, seq.prompt, data)
    if last:
        _close_stream(lm, grammars, seq)


def _close_stream(lm: Any, grammars: Any, seq: Sequence) -> None:
    """The streamed prompt is whole: its text tokenized, its sampler made over it (the
    repetition penalties see the prompt)."""
    state: SequenceState = seq.state
    if state.stream_text:
        seq.prompt += lm.tokenizer(state.stream_text)["input_ids"]
    if not seq.prompt:
        raise ValueError("the stream ended without any prompt")
    seq.input_open = False
    state.sampler = SequenceSampler(state.params, seq.prompt, lm.device,
                                    grammars.matcher(state.params))


def exported_rows(batch: Any, rows: torch.Tensor, prompt_only: bool) -> list[Any]:
    """Each sequence's exported rows of a packed step: the positions not exported before
    (a preempted sequence's recompute feeds them again) and, prompt_only, in its prompt;
    None where there are none."""
    out: list[Any] = []
    for seq, start, r in zip(batch.seqs, batch.starts, split_rows(batch.counts, rows),
                             strict=True):
        stop = start + len(r)
        end = min(stop, len(seq.prompt)) if prompt_only else stop
        lo = max(start, seq.state.exported)
        out.append(r[lo - start:end - start] if end > lo else None)
        seq.state.exported = max(seq.state.exported, end)
    return out


def split_rows(counts: list[int], chosen: torch.Tensor) -> list[torch.Tensor]:
    """Each sequence's rows of a packed (tokens, ...) tensor, copied (a graph reuses its
    output buffer at the next replay)."""
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    return [chosen[a:b].clone() for a, b in zip(starts, starts[1:], strict=False)]


def finish_reason(seq: Sequence, token: int, eos_ids: set[int],
                  max_positions: int | None) -> str | None:
    """Why the sequence ends with this (already appended) token, if it does."""
    p: SamplingParams = seq.state.params
    n = len(seq.output)
    if n >= p.min_tokens and (token in p.stop_token_ids or (
            not p.ignore_eos and token in eos_ids)):
        return "stop"
    grammar = seq.state.sampler.grammar
    if grammar is not None and grammar.done:  # the value is complete: nothing may follow
        return "stop"
    if n >= p.max_tokens:
        return "length"
    if max_positions is not None and len(seq.prompt) + n >= max_positions:
        return "length"
    return None


def token_output(seq: Sequence, result: Any, text: str, finish: str | None, tokenizer: Any,
                 exporting: bool) -> dict[str, Any]:
    """The output data of one sampled token (usage with the first and the last)."""
    state: SequenceState = seq.state
    data: dict[str, Any] = {"token_ids": [result.token], "text": text, "finish_reason": finish}
    if state.params.logprobs is not None:
        data["logprobs"] = [logprobs_entry(tokenizer, result.logprobs)]
    if state.hidden:
        data["hidden_states"] = torch.cat(state.hidden)
        state.hidden = None
    if not state.started:
        state.started = True
        data["prompt_tokens"] = len(seq.prompt)
        if exporting:  # the consumer needs to know the positions
            data["prompt_token_ids"] = list(seq.prompt)
            data.update(seq.media.exports if seq.media else {})
        data["cached_tokens"] = seq.blocks.cached_tokens
    if finish is not None:
        data["completion_tokens"] = len(seq.output)
    return data
