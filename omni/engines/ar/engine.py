"""Autoregressive engine: continuous batching over a paged KV cache.

Each step() is ONE forward call of the transformers model over a packed batch: every
prefilling sequence's next prompt chunk and every decoding sequence's last token
(scheduler.py decides who and how much). Attention uses the paged cache through
paged_attention.py's attention function, so any transformers decoder runs unchanged (the
dense and MoE fixtures are tested). Sequences whose last fed token ends their known
tokens are sampled together (sampling.py); a request joins at the next step.

Stream input: a request added with inputs {"stream": [producer]} waits in the scheduler
and takes its prompt from APPEND chunks ({"token_ids": [...]} or {"text": "..."}); token
ids are prefilled as they arrive (all but the last, whose logits count only once the
input is complete), text is tokenized when its stream ends. No placeholder tokens.

Hidden-state export: with stage option export_hidden_layers (indices into transformers'
hidden_states: 0 = embeddings, i = after decoder layer i, negative from the end), every
output carries "hidden_states", a (tokens, layers, hidden) tensor for the tokens fed
since the previous output (the whole prompt with the first token, then one per step),
which a stream edge hands to the next stage (one that reads its hidden states). With
"auto", a model whose next stage embeds the answer's token ids itself
(CausalLM.export_prompt_only) exports the prompt's rows only.

Elsewhere: the order of work in one step() (overlap_steps, chain_decode): steps.py; the
eager forward over a packed batch: forward.py; media prompts: encoder.py, media.py; KV
cache size: kv_cache.sized_cache; a new request's sequence: state.new_sequence; info and
stats: report.py; output limits (Engine.limit): omni/runtime/lead.py;
options: docs/pipeline.md.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from omni.engines.ar.budget import capacity_warning, measure_runtime_bytes
from omni.engines.ar.decode_graphs import decode_graphs_for
from omni.engines.ar.defaults import model_defaults, request_sampling, with_system_prompt
from omni.engines.ar.encoder import GATHER_MS, PromptEncoder
from omni.engines.ar.forward import eager_forward, graph_covers, graph_forward, prompt_embeds_inputs
from omni.engines.ar.fused_projections import fuse_projections
from omni.engines.ar.grammar import GrammarCompiler
from omni.engines.ar.inputs import (
    encode_prompt,
    encode_prompts,
    hidden_exports,
    prompt_field,
    stream_producer,
    wants_media,
)
from omni.engines.ar.kv_cache import sized_cache
from omni.engines.ar.paged_attention import ATTN_NAME, bind_cache, register
from omni.engines.ar.quantize import quantize
from omni.engines.ar.report import engine_info, engine_stats
from omni.engines.ar.sampling import SamplingParams
from omni.engines.ar.scheduler import ScheduledBatch, Scheduler, Sequence
from omni.engines.ar.session_kv import SessionKV
from omni.engines.ar.state import (
    SequenceState,
    finish_reason,
    new_sequence,
    take_stream_chunk,
    token_output,
)
from omni.engines.ar.step_budget import size_prefill_budget
from omni.engines.ar.steps import StepRunner
from omni.engines.ar.warm import warm_prefill
from omni.engines.base import (
    Engine,
    EngineLoadError,
    EngineRequest,
    StepOutput,
    check_options,
    failed_output,
    flag_option,
)
from omni.engines.gather import gap_option
from omni.models.hf_causal import load_causal_lm

log = logging.getLogger("omni.engines.ar.engine")

# every option an ar stage reads (docs/pipeline.md); any other is a typo: a load error
AR_OPTIONS = frozenset({
    "block_size", "kv_cache_blocks", "kv_cache_mb", "kv_cache_fraction", "max_num_seqs",
    "max_batched_tokens", "prefix_caching", "cuda_graphs", "compile_decode", "overlap_steps",
    "chain_decode", "max_graph_context", "attention_kernel", "experts_implementation",
    "export_hidden_layers", "feed_cuda_graphs", "fuse_projections", "warm_prefill",
    "prefill_beside_decodes", "max_model_len", "prefill_attention", "step_latency_ms",
    "quantization", "encode_gather_ms", "kv_cache_dtype", "load_format"})


class AREngine(Engine):
    """Continuous-batching AR engine over a transformers causal LM (see module doc)."""

    def __init__(self, model_dir: str, *, dtype: str = "auto", device: str = "cpu",
                 options: Mapping[str, Any] | None = None, memory_bytes: int | None = None):
        self.options = dict(options or {})
        check_options("ar engine", self.options, self._known_options())
        self.memory_bytes = memory_bytes  # the stage's `memory`: weights + KV cache
        self.lm = self._load(model_dir, dtype, device)
        if "max_model_len" in self.options:  # before the KV cache is sized from it
            self.lm.max_model_len = self._opt("max_model_len", 1)
        self.defaults = model_defaults(model_dir, self.lm.sampling_defaults)  # defaults.py
        if self.options.get("fuse_projections", True):  # q/k/v and gate/up: one matmul each
            fuse_projections(self.lm.model)
        register()
        self.lm.use_attention(ATTN_NAME)
        if self.options.get("experts_implementation", "auto") != "auto":  # MoE kernel
            self.lm.use_experts(str(self.options["experts_implementation"]))
        self.quantized = quantize(self.lm, self.options.get("quantization"))  # ar/quantize.py
        cuda = self.lm.device.type == "cuda"
        self.export_layers, self.export_prompt_only = hidden_exports(
            self.lm, self.options.get("export_hidden_layers"))
        self.runtime_bytes = 0  # graphs + a prefill step's peak, inside the budget (budget.py)
        kv_budget = memory_bytes
        if cuda and memory_bytes is not None and "kv_cache_blocks" not in self.options:
            self.runtime_bytes = measure_runtime_bytes(self, self._max_batched())
            kv_budget = memory_bytes - self.runtime_bytes
        self.serve_on(sized_cache(self.lm, self.options, kv_budget, self._opt))
        self.step_model = size_prefill_budget(self)  # prompt tokens beside decodes
        self._seqs: dict[str, Sequence] = {}
        self._failed: list[StepOutput] = []
        self._encoder = PromptEncoder(  # media prompts, batched; gathered (encoder.py)
            partial(encode_prompts, self.lm),
            gather_s=gap_option(self.options, "encode_gather_ms", GATHER_MS))
        self.grammars = GrammarCompiler(self.lm.tokenizer, self.lm.vocab_size,
                                        self.lm.eos_token_ids)  # json_schema requests
        # a weak reference: no engine <-> runner cycle keeps a dropped engine's GPU memory
        # alive until the next GC pass; outputs go out while the GPU runs the next step
        self.runner = StepRunner(
            weakref.proxy(self), self._seqs,
            overlap=flag_option(self.options, "overlap_steps", cuda),
            chain=flag_option(self.options, "chain_decode", cuda),
            exports_decode_rows=self.export_layers is not None and not self.export_prompt_only)

    def serve_on(self, cache: Any) -> None:
        """Bind the KV cache, make the scheduler over it, capture the decode graphs and run
        the warm-up prefill steps (CUDA)."""
        cuda = self.lm.device.type == "cuda"
        self.cache = cache
        self.blocks = bind_cache(self.lm.model, cache)  # the decoder layers
        self.session_kv = SessionKV(cache, exporting=self.export_layers is not None)
        # a cached prefix is not recomputed, so its hidden states could not be exported
        caching = self.options.get("prefix_caching", self.export_layers is None)
        batched = self._max_batched()
        self.scheduler = Scheduler(
            cache, max_num_seqs=self._opt("max_num_seqs", 64), max_batched_tokens=batched,
            prefix_salt=0 if caching else None,
            prefill_beside_decodes=self._opt("prefill_beside_decodes", batched))
        self.graphs = self._make_graphs() if cuda else None
        if self.options.get("warm_prefill", cuda):  # first-use costs at load (warm.py)
            self._warm_prefill()

    def drop_runtime(self) -> None:
        """Let go of the cache, graphs and scheduler serve_on made (a budget's probe)."""
        self.graphs = self.cache = self.blocks = self.session_kv = self.scheduler = None

    def _max_batched(self) -> int:
        return self._opt("max_batched_tokens", 8192 if self.lm.device.type == "cuda" else 512)

    def _known_options(self) -> frozenset[str]:
        """The stage options this engine reads (any other is a typo: a load error)."""
        return AR_OPTIONS

    def _load(self, model_dir: str, dtype: str, device: str) -> Any:
        return load_causal_lm(model_dir, dtype=dtype, device=device,
                              load_format=self.options.get("load_format") or "auto")

    def _warm_prefill(self) -> None:
        warm_prefill(self.lm, self.cache, self.scheduler.max_batched_tokens, self._warm_inputs)

    def _warm_inputs(self, tokens: int) -> dict[str, torch.Tensor]:
        """Model inputs for a warm-up step of `tokens` zero tokens."""
        return {"input_ids": torch.zeros(1, tokens, dtype=torch.long, device=self.lm.device)}

    def _opt(self, name: str, default: int) -> int:
        value = self.options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EngineLoadError(f"option {name} must be a positive integer, got {value!r}")
        return value

    def _make_graphs(self, embeds: tuple[int, torch.dtype] | None = None) -> Any:
        """Decode graphs (CUDA); embeds = (width, dtype) when decode feeds embeddings."""
        return decode_graphs_for(self, embeds) if self.options.get("cuda_graphs", True) else None

    # -- contract ---------------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._seqs or rid in self._encoder:
                raise ValueError(f"request id {rid!r} is already running")
            params = request_sampling(self.defaults, request.params or {})
            session = self.session_kv.session_of(request.params or {})
            inputs = with_system_prompt(request.inputs or {}, request.params or {})
            producer = stream_producer(inputs)
            if producer is None and wants_media(self.lm, inputs):  # off the step loop
                self._encoder.submit(rid, params, inputs)
                return
            prompt = ([], None, None) if producer else encode_prompt(self.lm, inputs)
            self._admit(rid, params, producer, *prompt, session=session,
                        field=prompt_field(inputs))
        except Exception as e:  # bad input fails this request only, at the next step
            self._failed.append(failed_output(rid, e))

    def _admit(self, rid: str, params: SamplingParams, producer: str | None, ids: list[int],
               embeds: Any, media: Any, session: str | None = None,
               field: str | None = None) -> None:
        """``field``: the request field the prompt came in (a refusal names it)."""
        capacity = self.cache.pool.num_blocks * self.cache.block_size
        seq = new_sequence(self.lm, self.grammars, capacity, rid, params, ids, embeds, media,
                           producer=producer, session=session, field=field)
        if producer is None:
            self.session_kv.attach(seq)
        self._seqs[rid] = seq
        self.scheduler.add(seq)

    def _idle(self) -> bool:
        """Nothing to step but media prompts encoding or gathering."""
        return not self._failed and self.runner.inflight is None and not self.scheduler.has_work()

    def gather_s(self) -> float:
        """Media prompts gather their encoder batch while nothing else runs: the process
        loop waits this long on its socket for the rest of a burst (encoder.py)."""
        left = self._encoder.wait_s()  # first: 0.0 at once unless a batch gathers
        return left if left and self._idle() else 0.0

    def _admit_encoded(self) -> None:
        """Requests whose media finished encoding join (waits briefly if idle)."""
        for rid, params, prompt, error in self._encoder.finished(wait=self._idle()):
            try:
                if error is not None:
                    raise error
                self._admit(rid, params, None, *prompt, field="messages")  # media: a chat
            except Exception as e:
                self._failed.append(failed_output(rid, e))

    def append(self, request_id: str, producer: str, seq_no: int, data: dict[str, Any] | None,
               last: bool) -> None:
        seq = self._seqs.get(request_id)
        if seq is None:
            return  # aborted or failed: late chunks in flight are dropped
        try:
            take_stream_chunk(self.lm, self.grammars, seq, producer, seq_no, data or {}, last)
        except ValueError as e:
            self._failed.append(self._fail(seq, f"bad stream input: {e}"))

    def limit(self, limits: Mapping[str, int | None]) -> None:
        """A request still encoding its media is held from the next limit sent (lead.py)."""
        for rid, most in limits.items():
            if rid in self._seqs:
                self._seqs[rid].limit = most

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self._encoder.drop(ids)
        for rid in ids:
            seq = self._seqs.pop(rid, None)
            if seq is not None:
                self._retire(seq)  # frees its KV blocks, or gives them to its session
        self._failed = [o for o in self._failed if o.request_id not in ids]

    def has_work(self) -> bool:
        return (bool(self._failed) or bool(self._encoder) or self.runner.inflight is not None
                or self.scheduler.has_work())

    def info(self) -> dict[str, Any]:
        return engine_info(self)

    def load_warnings(self) -> list[str]:
        """A memory budget short of max_num_seqs full-length sequences (budget.py)."""
        return [w for w in [capacity_warning(self.info(), self.memory_bytes)] if w]

    def stats(self) -> dict[str, Any]:
        return engine_stats(self)

    def shutdown(self) -> None:
        self._encoder.shutdown()
        self.runner.inflight = None
        for seq in list(self._seqs.values()):
            self.scheduler.remove(seq)
        self._seqs.clear()
        self._failed.clear()
        self.session_kv.release_all()

    def end_session(self, session: str, op: str) -> bool:
        """Drop what the engine holds for a session (close, reset, eviction alike)."""
        return self.session_kv.release(session)

    # -- one step -----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Requests whose media is encoded join; the order of the step's work: steps.py."""
        if self._encoder:
            self._admit_encoded()
        outputs, self._failed = self._failed, []
        return self.runner.step(outputs)

    def _forward(self, batch: ScheduledBatch, fed: torch.Tensor | None = None
                 ) -> tuple[list[Sequence], torch.Tensor, Any]:
        """Run the packed batch: the sequences that reach their last token, their logits,
        and (export_hidden_layers) each sequence's rows of the chosen layers. fed: a
        chained decode step's token ids, on the device, one per sequence (steps.py)."""
        if graph_covers(self.graphs, batch, chained=fed is not None):
            inputs = self._graph_inputs(batch) if fed is None else fed
            return graph_forward(self.graphs, batch, inputs, self.export_prompt_only)
        return eager_forward(self.lm, self.cache, batch, fed, self._packed_inputs,
                             self.export_layers, self.export_prompt_only)

    def _graph_inputs(self, batch: ScheduledBatch) -> Any:
        """What a graphed decode step feeds: each sequence's last token."""
        return [s.last_token for s in batch.seqs]

    def _before_launch(self) -> None:
        """Hook: the last step's tokens are recorded; the next step is not scheduled yet."""

    def _sampled(self, seqs: list[Sequence], results: list[Any]) -> None:
        """Hook: the step's tokens are sampled and not yet emitted."""

    def _packed_inputs(self, batch: ScheduledBatch, ids: torch.Tensor) -> dict[str, Any]:
        """input_ids, or inputs_embeds when a sequence feeds prompt embeddings this step."""
        return prompt_embeds_inputs(self.lm, batch, ids)

    def _stop_ids(self) -> set[int]:
        return set(self.lm.eos_token_ids)

    def _record(self, seq: Sequence, token: int) -> None:
        """A sampled token joins the sequence; a token that ends it (end token, length)
        takes it out of the scheduler at once, before its output is built."""
        seq.output.append(token)
        seq.state.sampler.append(token)
        seq.state.finish = finish_reason(seq, token, self.lm.eos_token_ids,
                                         self.lm.max_positions)
        if seq.state.finish is not None:
            self._retire(seq)

    def _emit(self, seq: Sequence, result: Any) -> StepOutput:
        state: SequenceState = seq.state
        finish = state.finish
        text, stopped = state.detok.push([result.token], final=finish is not None)
        if stopped:
            finish = "stop"
            text += state.detok.push([], final=True)[0]
        data = token_output(seq, result, text, finish, self.lm.tokenizer,
                            self.export_layers is not None)
        if finish is None:
            return StepOutput(seq.id, data=data)
        self._seqs.pop(seq.id, None)
        self._retire(seq)
        return StepOutput(seq.id, data=data, finished=True)

    def _finish(self, seq: Sequence, reason: str, text: str | None) -> StepOutput:
        self._seqs.pop(seq.id, None)
        self._retire(seq)
        rest = seq.state.detok.push([], final=True)[0] if text is None else text
        return StepOutput(seq.id, finished=True, data={
            "token_ids": [], "text": rest, "finish_reason": reason,
            "completion_tokens": len(seq.output), "prompt_tokens": len(seq.prompt)})

    def _retire(self, seq: Sequence) -> None:
        """Out of the scheduler; its blocks go to its session, if it has one."""
        self.session_kv.hold(seq)
        self.scheduler.remove(seq)

    def _fail(self, seq: Sequence, error: str) -> StepOutput:
        self._seqs.pop(seq.id, None)
        self.scheduler.remove(seq)
        return StepOutput(seq.id, finished=True, error=error)

