"""Qwen3-TTS audio streamed within a sentence: our decode loop over qwen-tts's modules.

qwen-tts's ``generate_*`` run the talker to the end of a sentence (transformers'
``generate``), then decode every codec frame at once; the first audio waits for the
whole sentence. Here the same sentence runs step by step, and its frames are decoded in
chunks as they come:

- the prompt is qwen-tts's own: its wrapper is called as usual, and the talker's first
  forward call (the prefill: prompt embeddings, mask, trailing text, empty KV cache) is
  taken from a forward pre-hook, which then stops the wrapper before anything runs. So
  speakers, languages, instructions and voice-clone prompts are built by qwen-tts;
- the talker runs as one batch that sentences join and leave step by step
  (qwen3_tts_batch.TalkerBatch): each step is the talker's own forward for every active
  sentence (it runs the code predictor for the previous token's residual codebooks), then
  transformers' sampling with the processors its ``generate`` would use for qwen-tts's
  arguments, in the same order. A sentence's codes equal qwen-tts's for it alone (greedy;
  sampled with a request ``seed``: its own generator), whenever it joined;
- a frame is complete one step after its first code (its residual codes come with the
  next forward); a row ends at end-of-speech or ``max_new_tokens``, as qwen-tts cuts it,
  and leaves the talker's batch;
- frames are decoded by the codec's decoder in chunks with ``LEFT_CONTEXT`` earlier
  frames (25, as qwen-tts's own ``chunked_decode``), their samples dropped, rows of one
  shape in one decoder call: the decoder is
  causal, so a chunk's audio equals that part of a whole decode where its reach back is
  within the context. A voice-clone row in in-context mode starts with its reference's
  codes as context, as qwen-tts decodes reference + new codes and cuts the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from omni.models.code2wav_shapes import pow2
from omni.models.qwen3_tts_batch import Row, TalkerBatch

LEFT_CONTEXT = 25  # frames, qwen-tts's chunked_decode default


class _Prefill(Exception):
    """Carries the talker's first forward call out of qwen-tts's generate."""


def capture_prefill(talker: torch.nn.Module, call: Callable[[], Any]) -> dict[str, Any]:
    """The keyword arguments of the talker's first forward call made by ``call``."""
    def stop(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        raise _Prefill(kwargs)

    handle = talker.register_forward_pre_hook(stop, with_kwargs=True)
    return _until_stopped(call, handle.remove)


def capture_talker_inputs(talker: torch.nn.Module, call: Callable[[], Any]) -> dict[str, Any]:
    """The keyword arguments ``call`` (qwen-tts's generate_*) gives the talker's
    ``generate``: the prompt embeddings, trailing text and pad embedding, as its first
    forward gets them, without transformers' generate setting up first (its config, its
    logits processors over the 1,024 suppressed codes: about a third of a request's prompt
    building on the dev VM). For a caller that needs only those tensors, not the forward's
    own arguments (cache, positions), as capture_prefill gives them."""
    def stop(**kwargs: Any) -> None:
        raise _Prefill(kwargs)

    talker.generate = stop  # the instance's attribute, over GenerationMixin's method
    return _until_stopped(call, lambda: delattr(talker, "generate"))


class _ConfigSnapshot:
    """A read-only stand-in for a transformers config that keeps each attribute after its
    first read (nested configs the same way). Why: transformers 4.57's
    PretrainedConfig.__getattribute__ costs about a microsecond a read, and qwen-tts's
    generate builds its 1,023-code suppress list reading two config attributes per code:
    half of a request's prompt building on the dev VM (1.2-1.7 -> 0.59-0.66 ms with this,
    the same tensors). Only for the prompt capture, which stops before transformers'
    generate would receive the config."""

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._config, name)
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a nested config
            value = _ConfigSnapshot(value)
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the config is read-only during a prompt capture ({name})")


@contextmanager
def snapshot_config(model: torch.nn.Module) -> Iterator[None]:
    """model.config read through a _ConfigSnapshot for the block; restored after."""
    config = model.config
    object.__setattr__(model, "config", _ConfigSnapshot(config))
    try:
        yield
    finally:
        object.__setattr__(model, "config", config)


def _until_stopped(call: Callable[[], Any], undo: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call`` until a hook stops it with _Prefill; its keyword arguments. ``undo``
    removes the hook whatever happens."""
    try:
        call()
    except _Prefill as prefill:
        return prefill.args[0]
    finally:
        undo()
    raise RuntimeError("qwen-tts's generate returned without running the talker")


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


def decode_chunks(decoder: Any, chunks: list[tuple[torch.Tensor, int]],
                  fixed_upto: int = 0) -> list[torch.Tensor]:
    """Each chunk's new audio. The decoder is causal and per row (a batch row's audio is
    its own, and a frame's samples do not depend on later frames), so chunks of lengths
    within one power of two share a call, padded on the right to the longest (at most
    twice the frames; its padding's samples are cut). Calls of at most ``fixed_upto``
    frames (on a GPU: the shapes warm_decoder met at load) are padded to that power of two
    of frames and of rows (rows of code 0, their audio dropped): a few shapes instead of a
    new one at nearly every call, each of which costs the first time (cuDNN picks its
    convolutions' plans per shape). Longer calls (whole sentences) keep their lengths."""
    out: list[torch.Tensor | None] = [None] * len(chunks)
    buckets: dict[int, list[int]] = {}
    for i, (codes, _) in enumerate(chunks):
        buckets.setdefault((len(codes) - 1).bit_length(), []).append(i)
    up = decoder.total_upsample
    for bucket, rows in buckets.items():
        fixed = 1 << bucket <= fixed_upto
        longest = 1 << bucket if fixed else max(len(chunks[i][0]) for i in rows)
        codes = torch.stack([torch.nn.functional.pad(chunks[i][0],
                                                     (0, 0, 0, longest - len(chunks[i][0])))
                             for i in rows]).transpose(1, 2)  # (B, groups, T)
        if fixed:
            codes = torch.nn.functional.pad(codes, (0, 0, 0, 0, 0, pow2(len(rows)) - len(rows)))
        wavs = decoder(codes).reshape(len(codes), -1)
        for i, wav in zip(rows, wavs[:len(rows)], strict=True):
            codes_i, context = chunks[i]
            out[i] = wav[context * up:len(codes_i) * up]
    return out


def fixed_frames(most_frames: int) -> int:
    """decode_chunks' fixed_upto for chunks of up to ``most_frames`` (context included)."""
    return pow2(most_frames)


def warm_decoder(decoder: Any, groups: int, device: Any, fixed_upto: int,
                 most_rows: int) -> int:
    """One decoder call of each shape decode_chunks(fixed_upto=...) makes for up to
    ``most_rows`` rows: their first-use costs paid at load. Returns the calls made."""
    calls, frames = 0, 1
    with torch.inference_mode():
        while frames <= fixed_upto:
            rows = 1
            while rows <= pow2(most_rows):
                decoder(torch.zeros(rows, groups, frames, dtype=torch.long, device=device))
                calls, rows = calls + 1, rows * 2
            frames *= 2
    return calls


class SentenceStream:
    """The sentences of a running streamed call, numbered in the order they joined: each
    ``advance`` steps the talker once (every active sentence one frame), then gives each
    sentence with a chunk due ``(audio, tokens)`` and whether the sentence is complete with
    it. Without a decoder (the split layout's talker stage) a chunk is its frames' codes,
    (groups, n), instead, one frame held back until the row ends: a sentence's last chunk
    is never empty, as a stream edge's chunks must not be; with them the tokens and, on an
    in-context clone's first chunk of a sentence, its reference codes (None otherwise)."""

    def __init__(self, talker: TalkerBatch, decoder: Any, first_frames: int,
                 chunk_frames: int, fixed_upto: int = 0) -> None:
        self.talker = talker
        self.decoder = decoder
        self.fixed_upto = fixed_upto  # decode_chunks' (a GPU's)
        self.first_frames, self.chunk_frames = first_frames, chunk_frames
        self.rows: dict[int, Row] = {}  # open sentences by number
        self.tokens_left: dict[int, int] = {}  # usage: reported with a row's first chunk
        self.joined = 0  # sentences numbered so far

    @property
    def done(self) -> bool:
        return not self.rows

    def join(self, prefill: dict[str, Any], rows: list[Row], text_tokens: list[int]) -> None:
        """Sentences that step with the others from the next ``advance`` on."""
        self.talker.join(prefill, rows)
        for row, tokens in zip(rows, text_tokens, strict=True):
            self.rows[self.joined] = row
            self.tokens_left[self.joined] = tokens
            self.joined += 1

    def drop(self, numbers: list[int]) -> None:
        """Sentences nobody waits for any more: they leave the talker's batch."""
        rows = [self.rows.pop(n) for n in numbers if n in self.rows]
        for n in numbers:
            self.tokens_left.pop(n, None)
        self.talker.drop(rows)

    def _pending(self, row: Row) -> int:
        return len(row.frames) - row.decoded

    def _ready(self, row: Row) -> int:
        """Frames a chunk may take now (codes mode keeps one back until the end)."""
        return self._pending(row) - (self.decoder is None and not row.ended)

    def _want(self, row: Row) -> int:
        """A row's next chunk is due at first_frames, then twice that, ... up to
        chunk_frames: a short first wait, then chunks long enough that the left context
        decoded again with each (LEFT_CONTEXT frames) costs little."""
        return min(self.first_frames << min(row.chunks, 16), max(self.chunk_frames, 1))

    def _due(self) -> list[int]:
        """The rows whose chunk goes out now. (Letting rows halfway to theirs ride along
        with a due one, to share its decoder call, cost more than it saved: smaller chunks
        decode their left context more often; bench/probes/qwen3_tts_stagger.py.)"""
        return [n for n, row in self.rows.items()
                if row.ended or self._ready(row) >= self._want(row)]

    def advance(self) -> dict[int, tuple[Any, bool]]:
        if self.talker.active:
            self.talker.step()
        due = self._due()
        out = self._codes(due) if self.decoder is None else self._audio(due)
        for n in due:
            if self.rows[n].ended:
                del self.rows[n], self.tokens_left[n]
        return out

    def _audio(self, due: list[int]) -> dict[int, tuple[Any, bool]]:
        with_frames = [n for n in due if self._pending(self.rows[n])]
        audio = dict(zip(with_frames, decode_chunks(
            self.decoder, [chunk_codes(self.rows[n]) for n in with_frames],
            self.fixed_upto), strict=True))
        out = {}
        for n in due:
            row = self.rows[n]
            row.chunks += 1
            tokens, self.tokens_left[n] = self.tokens_left[n], 0
            wav = audio.get(n, torch.zeros(0)).float().reshape(-1).cpu()  # as qwen-tts's numpy
            out[n] = ((wav, tokens), row.ended)
        return out

    def _codes(self, due: list[int]) -> dict[int, tuple[Any, bool]]:
        out = {}
        for n in due:
            row = self.rows[n]
            upto = row.decoded + self._ready(row)
            frames = row.frames[row.decoded:upto]
            codes = (torch.stack(frames).T.cpu() if frames  # (groups, n)
                     else torch.zeros(self.talker.groups, 0, dtype=torch.long))
            context = self._reference_context(row)
            row.decoded, row.chunks = upto, row.chunks + 1
            tokens, self.tokens_left[n] = self.tokens_left[n], 0
            out[n] = ((codes, tokens, context), row.ended)
        return out

    @staticmethod
    def _reference_context(row: Row) -> torch.Tensor | None:
        """An in-context clone's reference codes (groups, <= LEFT_CONTEXT), sent with a
        sentence's first chunk: the code2wav stage decodes them as the left context of its
        first frames, as qwen-tts decodes reference + new codes (chunk_codes here)."""
        if row.context is None or row.chunks:
            return None
        return row.context[-LEFT_CONTEXT:].T.contiguous().cpu().clamp(min=0)
