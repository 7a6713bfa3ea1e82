"""Qwen3-TTS audio streamed within a sentence: our decode loop over qwen-tts's modules.

qwen-tts's ``generate_*`` run the talker to the end of a sentence (transformers'
``generate``), then decode every codec frame at once; the first audio waits for the
whole sentence. Here the same sentence runs step by step, and its frames are decoded in
chunks as they come:

- the prompt is qwen-tts's own: its wrapper is called as usual, and the talker's first
  forward call (the prefill: prompt embeddings, mask, trailing text, empty KV cache) is
  taken from a forward pre-hook, which then stops the wrapper before anything runs. So
  speakers, languages, instructions and voice-clone prompts are built by qwen-tts;
- each step is the talker's own forward (it runs the code predictor for the previous
  token's residual codebooks) and then transformers' sampling with the logits
  processors its ``generate`` would use for qwen-tts's arguments, in the same order
  (repetition penalty, at least 2 tokens, the codec's special ids suppressed except
  end-of-speech, then temperature / top-k / top-p when sampling). With the same seed the
  codes equal qwen-tts's: every forward and every draw happen in the same order;
- a frame is complete one step after its first code (its residual codes come with the
  next forward); a row ends at end-of-speech or ``max_new_tokens``, as qwen-tts cuts it;
- frames are decoded by the codec's decoder in chunks with ``LEFT_CONTEXT`` earlier
  frames (25, as qwen-tts's own ``chunked_decode``), their samples dropped, rows of one
  shape in one decoder call: the decoder is
  causal, so a chunk's audio equals that part of a whole decode where its reach back is
  within the context. A voice-clone row in in-context mode starts with its reference's
  codes as context, as qwen-tts decodes reference + new codes and cuts the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

LEFT_CONTEXT = 25  # frames, qwen-tts's chunked_decode default


class _Prefill(Exception):
    """Carries the talker's first forward call out of qwen-tts's generate."""


def capture_prefill(talker: torch.nn.Module, call: Callable[[], Any]) -> dict[str, Any]:
    """The keyword arguments of the talker's first forward call made by ``call``."""
    def stop(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        raise _Prefill(kwargs)

    handle = talker.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        call()
    except _Prefill as prefill:
        return prefill.args[0]
    finally:
        handle.remove()
    raise RuntimeError("qwen-tts's generate returned without running the talker")


def logits_processors(gen: dict[str, Any], eos: int, vocab: int) -> Any:
    """transformers' processors for the talker's generate, in generate's order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out = LogitsProcessorList()
    if gen["repetition_penalty"] not in (None, 1.0):
        out.append(RepetitionPenaltyLogitsProcessor(penalty=gen["repetition_penalty"]))
    out.append(MinNewTokensLengthLogitsProcessor(0, 2, eos))  # qwen-tts: min_new_tokens=2
    out.append(SuppressTokensLogitsProcessor(
        [i for i in range(vocab - 1024, vocab) if i != eos]))
    if gen["do_sample"]:
        if gen["temperature"] not in (None, 1.0):
            out.append(TemperatureLogitsWarper(gen["temperature"]))
        if gen["top_k"]:
            out.append(TopKLogitsWarper(top_k=gen["top_k"]))
        if gen["top_p"] is not None and gen["top_p"] < 1.0:
            out.append(TopPLogitsWarper(top_p=gen["top_p"]))
    return out


@dataclass
class Row:
    """One sentence of a streamed call: its frames and how far they were decoded."""

    frames: list[torch.Tensor] = field(default_factory=list)  # (groups,) codes each
    context: torch.Tensor | None = None  # (T, groups) reference codes decoded before it
    decoded: int = 0  # frames already sent as audio
    chunks: int = 0  # chunks already sent
    ended: bool = False  # end of speech (or max_new_tokens) reached


class TalkerStream:
    """One batched call of qwen-tts's talker, advanced a step at a time."""

    def __init__(self, model: Any, prefill: dict[str, Any], gen: dict[str, Any],
                 contexts: list[torch.Tensor | None]) -> None:
        cfg = model.config.talker_config
        self.talker = model.talker
        self.eos = int(cfg.codec_eos_token_id)
        self.groups = int(cfg.num_code_groups)
        self.do_sample = bool(gen["do_sample"])
        self.max_new = int(gen["max_new_tokens"])
        self.processors = logits_processors(gen, self.eos, int(cfg.vocab_size))
        self.kwargs = prefill
        self.rows = [Row(context=c) for c in contexts]
        batch = len(self.rows)
        device = prefill["inputs_embeds"].device
        self.tokens = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.unfinished = torch.ones(batch, dtype=torch.long, device=device)
        self.out = self.talker(**prefill)  # the prefill, as generate's first call
        self._sample()

    @property
    def done(self) -> bool:
        return all(r.ended for r in self.rows)

    def step(self) -> None:
        """One talker forward: the previous token's frame completes; the next token."""
        out, kw = self.out, self.kwargs
        mask = torch.cat([kw["attention_mask"], kw["attention_mask"].new_ones(len(self.rows), 1)],
                         dim=-1)
        self.kwargs = {**{k: v for k, v in kw.items() if k not in ("inputs_embeds",
                                                                    "position_ids")},
                       "input_ids": self.tokens[:, -1:], "attention_mask": mask,
                       "cache_position": kw["cache_position"][-1:] + 1,
                       "past_key_values": out.past_key_values, "past_hidden": out.past_hidden,
                       "generation_step": out.generation_step,
                       "trailing_text_hidden": out.trailing_text_hidden,
                       "tts_pad_embed": out.tts_pad_embed}
        self.out = self.talker(**self.kwargs)
        codes = self.out.hidden_states[1]  # (B, groups): the previous token's frame
        for i, row in enumerate(self.rows):
            if not row.ended:
                row.frames.append(codes[i])
        self._sample()

    def _sample(self) -> None:
        logits = self.out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        scores = self.processors(self.tokens, logits)
        if self.do_sample:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = torch.argmax(scores, dim=-1)
        token = token * self.unfinished + self.eos * (1 - self.unfinished)
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=-1)
        self.unfinished = self.unfinished & (token != self.eos).long()
        last = self.tokens.shape[1] >= self.max_new
        hit = (token == self.eos).tolist()  # one device sync a step, not one a row
        for row, eos in zip(self.rows, hit, strict=True):
            # a row's frames end before its end-of-speech token; at max_new_tokens the
            # last token's frame is never completed (qwen-tts keeps the complete ones)
            row.ended = row.ended or eos or last


def chunk_codes(row: Row) -> tuple[torch.Tensor, int]:
    """The codes that decode ``row``'s new frames: (T, groups), and how many of them are
    left context (their audio dropped); the new frames count as decoded."""
    new = torch.stack(row.frames[row.decoded:])  # (n, groups)
    history = torch.stack(row.frames[max(0, row.decoded - LEFT_CONTEXT):row.decoded]) \
        if row.decoded else new[:0]
    if row.context is not None and len(history) < LEFT_CONTEXT:  # reference codes first
        ref = row.context[max(0, len(row.context) - (LEFT_CONTEXT - len(history))):]
        history = torch.cat([ref.to(new.device), history])
    row.decoded = len(row.frames)
    return torch.cat([history, new]).clamp(min=0), len(history)


def decode_chunks(decoder: Any, chunks: list[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
    """Each chunk's new audio; chunks of one shape share a decoder call (the decoder is
    causal and per row: a batch row's audio is its own)."""
    out: list[torch.Tensor | None] = [None] * len(chunks)
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, (codes, context) in enumerate(chunks):
        shapes.setdefault((len(codes), context), []).append(i)
    for (_, context), rows in shapes.items():
        codes = torch.stack([chunks[i][0] for i in rows]).transpose(1, 2)  # (B, groups, T)
        wavs = decoder(codes).reshape(len(rows), -1)
        for i, wav in zip(rows, wavs, strict=True):
            out[i] = wav[context * decoder.total_upsample:]
    return out


class SentenceStream:
    """The sentences of one streamed call: talker steps until some row has a chunk due,
    then each row's audio so far. ``advance`` gives per row ``(audio, tokens)`` or None
    (nothing yet) and whether the row's sentence is complete with it. Without a decoder
    (the split layout's talker stage) a chunk is its frames' codes, (groups, n), instead,
    one frame held back until the row ends: a sentence's last chunk is never empty, as a
    stream edge's chunks must not be; with them the tokens and, on an in-context clone's
    first chunk of a sentence, its reference codes (None otherwise)."""

    def __init__(self, talker: TalkerStream, decoder: Any, first_frames: int,
                 chunk_frames: int, text_tokens: list[int]) -> None:
        self.talker = talker
        self.decoder = decoder
        self.first_frames, self.chunk_frames = first_frames, chunk_frames
        self.tokens_left = list(text_tokens)  # usage: reported with a row's first chunk
        self.closed = [False] * len(talker.rows)

    @property
    def done(self) -> bool:
        return all(self.closed)

    def _pending(self, row: Row) -> int:
        return len(row.frames) - row.decoded

    def _ready(self, row: Row) -> int:
        """Frames a chunk may take now (codes mode keeps one back until the end)."""
        return self._pending(row) - (self.decoder is None and not row.ended)

    def _due(self, i: int) -> bool:
        """A row's next chunk is due at first_frames, then twice that, ... up to
        chunk_frames: a short first wait, then chunks long enough that the left context
        decoded again with each (LEFT_CONTEXT frames) costs little."""
        row = self.talker.rows[i]
        want = min(self.first_frames << min(row.chunks, 16), max(self.chunk_frames, 1))
        return not self.closed[i] and (row.ended or self._ready(row) >= want)

    def advance(self) -> list[tuple[tuple[torch.Tensor, int] | None, bool]]:
        while not any(self._due(i) for i in range(len(self.closed))):
            self.talker.step()
        rows = self.talker.rows
        due = [i for i in range(len(rows)) if self._due(i)]
        if self.decoder is None:
            return self._codes(due)
        with_frames = [i for i in due if self._pending(rows[i])]
        audio = dict(zip(with_frames, decode_chunks(
            self.decoder, [chunk_codes(rows[i]) for i in with_frames]), strict=True))
        out: list[tuple[tuple[torch.Tensor, int] | None, bool]] = [(None, False)] * len(rows)
        for i in due:
            rows[i].chunks += 1
            tokens, self.tokens_left[i] = self.tokens_left[i], 0
            self.closed[i] = rows[i].ended
            wav = audio.get(i, torch.zeros(0)).float().reshape(-1).cpu()  # as qwen-tts's numpy
            out[i] = ((wav, tokens), rows[i].ended)
        return out

    def _codes(self, due: list[int]) -> list[tuple[tuple[torch.Tensor, int] | None, bool]]:
        out: list[tuple[tuple[torch.Tensor, int] | None, bool]] = [(None, False)] * len(self.closed)
        for i in due:
            row = self.talker.rows[i]
            upto = row.decoded + self._ready(row)
            frames = row.frames[row.decoded:upto]
            codes = (torch.stack(frames).T.cpu() if frames  # (groups, n)
                     else torch.zeros(self.talker.groups, 0, dtype=torch.long))
            context = self._reference_context(row)
            row.decoded, row.chunks = upto, row.chunks + 1
            tokens, self.tokens_left[i] = self.tokens_left[i], 0
            self.closed[i] = row.ended
            out[i] = ((codes, tokens, context), row.ended)
        return out

    @staticmethod
    def _reference_context(row: Row) -> torch.Tensor | None:
        """An in-context clone's reference codes (groups, <= LEFT_CONTEXT), sent with a
        sentence's first chunk: the code2wav stage decodes them as the left context of its
        first frames, as qwen-tts decodes reference + new codes (chunk_codes here)."""
        if row.context is None or row.chunks:
            return None
        return row.context[-LEFT_CONTEXT:].T.contiguous().cpu().clamp(min=0)
