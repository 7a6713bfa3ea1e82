"""Autoregressive engine: one transformers DynamicCache per request, one token per step.

Simple and correct on purpose: each step() runs every request in turn (the first step
of a request is its prefill). Paged KV and batched decode replace the internals later;
the request lifecycle, sampling and streaming contract stay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.engines.base import Engine, EngineRequest, StepOutput
from omni.models.hf_causal import apply_chat_template, load_causal_lm

DEFAULT_MAX_TOKENS = 16


def _num(params: Mapping, name: str, default: float) -> float:
    v = params.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def _int(params: Mapping, name: str, default: int | None) -> int | None:
    v = params.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return v


def validate_sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise sampling params; raise ValueError naming the bad field. Unknown keys are ignored."""
    max_tokens = _int(params, "max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    temperature = _num(params, "temperature", 1.0)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params['temperature']}")
    top_p = _num(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params['top_p']}")
    top_k = _int(params, "top_k", 0)
    if top_k < -1:
        raise ValueError(f"top_k must be >= 1, or 0 / -1 to disable, got {top_k}")
    seed = _int(params, "seed", None)
    stop = params.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
    stop_ids = params.get("stop_token_ids") or []
    if not isinstance(stop_ids, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in stop_ids):
        raise ValueError(f"stop_token_ids must be a list of non-negative integers, got {stop_ids!r}")
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"ignore_eos must be a boolean, got {ignore_eos!r}")
    return {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": max(top_k, 0), "seed": seed, "stop": list(stop),
            "stop_token_ids": list(stop_ids), "ignore_eos": ignore_eos}


def sample_token(logits: torch.Tensor, p: Mapping[str, Any],
                 generator: torch.Generator | None) -> int:
    """One token from 1-D logits: greedy at temperature 0, else temperature/top-k/top-p."""
    if p["temperature"] == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / p["temperature"]
    if 0 < p["top_k"] < logits.numel():
        kth = torch.topk(logits, p["top_k"]).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p["top_p"] < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs > p["top_p"]  # keep the token crossing top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class _Request:
    id: str
    prompt_ids: list[int]
    params: dict[str, Any]
    generator: torch.Generator | None
    cache: Any = None
    output_ids: list[int] = field(default_factory=list)
    # incremental detokenisation: decode output_ids[prefix:], emit past the text of
    # output_ids[prefix:read]; prefix/read only move to points where the text is complete
    prefix: int = 0
    read: int = 0
    text: str = ""  # decoded (and stop-truncated) text so far
    sent: int = 0  # chars of `text` already emitted


class AREngine(Engine):
    """Autoregressive decode over a transformers causal LM from a local HF directory.

    inputs: {"prompt": str} | {"prompt_token_ids": [int]} | {"messages": [{role, content}]}
        | {upstream_stage: [{"text": ...}, ...]} (the upstream text, joined, is the prompt)
    params: see validate_sampling_params. options: unused for now (reserved for the
    paged-KV engine: block size, max batch, ...).
    """

    def __init__(self, model_dir: str, *, dtype: str = "auto", device: str = "cpu",
                 options: Mapping[str, Any] | None = None):
        self.options = dict(options or {})
        self.lm = load_causal_lm(model_dir, dtype=dtype, device=device)
        self._running: dict[str, _Request] = {}
        self._failed: list[StepOutput] = []

    # -- contract ---------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._running:
                raise ValueError(f"request id {rid!r} is already running")
            params = validate_sampling_params(request.params or {})
            prompt_ids = self._prompt_ids(request.inputs or {})
        except Exception as e:  # bad input fails this request only, at the next step
            self._failed.append(StepOutput(rid, finished=True, error=f"{type(e).__name__}: {e}"))
            return
        gen = None
        if params["seed"] is not None:
            gen = torch.Generator(device=self.lm.device).manual_seed(params["seed"])
        self._running[rid] = _Request(rid, prompt_ids, params, gen)

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for rid in ids:
            self._running.pop(rid, None)  # drops the request's KV cache
        self._failed = [o for o in self._failed if o.request_id not in ids]

    def has_work(self) -> bool:
        return bool(self._running or self._failed)

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        outputs, self._failed = self._failed, []
        for req in list(self._running.values()):
            try:
                out = self._advance(req)
            except Exception as e:  # one request's failure never stops the others
                out = StepOutput(req.id, finished=True, error=f"{type(e).__name__}: {e}")
            if out.finished:
                self._running.pop(req.id, None)
            outputs.append(out)
        return outputs

    def info(self) -> dict[str, Any]:
        return {"model_dir": self.lm.model_dir, "random_weights": self.lm.random_weights,
                "dtype": str(self.lm.dtype).removeprefix("torch."), "device": str(self.lm.device),
                "vocab_size": self.lm.vocab_size}

    def stats(self) -> dict[str, Any]:
        return {"running": len(self._running)}

    def shutdown(self) -> None:
        self._running.clear()
        self._failed.clear()

    # -- internals --------------------------------------------------------------------
    def _prompt_ids(self, inputs: Mapping[str, Any]) -> list[int]:
        tok = self.lm.tokenizer
        if "prompt_token_ids" in inputs:
            ids = inputs["prompt_token_ids"]
            if not isinstance(ids, list | tuple) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError("prompt_token_ids must be a list of integers")
            bad = [i for i in ids if not 0 <= i < self.lm.vocab_size]
            if bad:
                raise ValueError(f"prompt_token_ids out of range [0, {self.lm.vocab_size}): {bad[:5]}")
            ids = list(ids)
        elif "messages" in inputs:
            ids = apply_chat_template(tok, inputs["messages"])
        elif "prompt" in inputs:
            if not isinstance(inputs["prompt"], str):
                raise ValueError("prompt must be a string")
            ids = tok(inputs["prompt"])["input_ids"]
        elif inputs and all(isinstance(v, list) for v in inputs.values()):
            # downstream of other stages (full delivery): their text is the prompt
            text = "".join(c.get("text", "") for chunks in inputs.values() for c in chunks
                           if isinstance(c, Mapping))
            ids = tok(text)["input_ids"]
        else:
            raise ValueError("inputs need one of 'prompt', 'prompt_token_ids' or 'messages'")
        if not ids:
            raise ValueError("the prompt is empty")
        limit = self.lm.max_positions
        if limit is not None and len(ids) >= limit:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's limit is {limit}")
        return [int(i) for i in ids]

    def _advance(self, req: _Request) -> StepOutput:
        first = req.cache is None
        if first:
            req.cache = self.lm.new_cache()
            ids = req.prompt_ids
        else:
            ids = req.output_ids[-1:]
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.lm.device)
        kwargs = {self.lm.cache_kwarg: req.cache}  # the cache is updated in place
        out = self.lm.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **kwargs)
        token = sample_token(out.logits[0, -1], req.params, req.generator)
        req.output_ids.append(token)

        p = req.params
        finish = None
        if (token in p["stop_token_ids"]
                or (not p["ignore_eos"] and token in self.lm.eos_token_ids)):
            finish = "stop"
        elif len(req.output_ids) >= p["max_tokens"]:
            finish = "length"
        elif (self.lm.max_positions is not None
              and len(req.prompt_ids) + len(req.output_ids) >= self.lm.max_positions):
            finish = "length"
        if self._detokenize(req, final=finish is not None):
            finish = "stop"  # a stop string appeared

        if finish is None and p["stop"]:
            hold = max(len(s) for s in p["stop"]) - 1  # a stop string may be starting
            end = max(req.sent, len(req.text) - hold)
        else:
            end = len(req.text)
        data: dict[str, Any] = {"token_ids": [token], "text": req.text[req.sent:end],
                                "finish_reason": finish}
        req.sent = end
        if first:
            data["prompt_tokens"] = len(req.prompt_ids)
        if finish is not None:
            data["completion_tokens"] = len(req.output_ids)
        return StepOutput(req.id, data=data, finished=finish is not None)

    def _detokenize(self, req: _Request, final: bool) -> bool:
        """Extend req.text with the newly complete text; True when a stop string hit."""
        def decode(ids: list[int]) -> str:
            return self.lm.tokenizer.decode(ids, skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False)

        ids = req.output_ids
        prefix_text = decode(ids[req.prefix:req.read])
        new_text = decode(ids[req.prefix:])
        # a trailing U+FFFD means a multi-byte character is still incomplete: wait
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd")):
            return False
        before = len(req.text)
        req.text += new_text[len(prefix_text):]
        req.prefix, req.read = req.read, len(ids)
        stops = req.params["stop"]
        if not stops:
            return False
        start = max(0, before - max(len(s) for s in stops) + 1)
        hits = [i for i in (req.text.find(s, start) for s in stops) if i >= 0]
        if hits:
            req.text = req.text[:min(hits)]
            return True
        return False
