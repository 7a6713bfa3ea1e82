"""AR engine for models whose next input is built from what they just produced plus a
side stream (e.g. a speech model: the codec frame it sampled + the next word of the text
stage feeding it).

The batching, paged KV cache, scheduling and sampling are AREngine's; a model adapter
(omni/models: AR_FEEDBACK_MODELS) supplies a "feed" that
- takes the producer stage's chunks (`take`) and builds the prompt embeddings (and their
  PromptLayout, for multi-axis rotary positions) once enough has arrived (`prefill`);
  until then the request waits in the scheduler;
- after each sampled token, computes the frame's extra outputs and the next input
  (`feedback`, one batched call per step);
- says whether decode step g can be fed yet (`ready`); a sequence whose side input has
  not arrived is held (no placeholder input, no guessed length) and resumes when it does;
- may batch the work of turning received side input into decode inputs over each step's
  sequences (`prepare`), instead of doing it per message on arrival;
- builds decode step g's input embedding (`decode_input`), or a step's inputs for all its
  sequences in one call (`decode_inputs(states, steps)`: a few kernels a step, not one or
  more a sequence);
- may capture its per-step work as CUDA graphs (`use_cuda_graphs`, option
  feed_cuda_graphs);
- may read the request itself, as a pipeline's first stage (`request_inputs`: the input
  keys it reads there, e.g. a speech request's text; the inputs are then its one chunk),
  check the request's params (`configure`), and read stage options of its own (the
  adapter's OPTIONS);
- turns each frame into its output (`frame_output(state, codes)`: per-request data may go
  with it, e.g. a voice clone's reference codes with the first frame).
Every fed embedding is kept, so a preempted sequence is recomputed exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from omni.engines.ar.defaults import request_sampling
from omni.engines.ar.engine import AR_OPTIONS, AREngine
from omni.engines.ar.inputs import stream_producer
from omni.engines.ar.sampling import SequenceSampler
from omni.engines.ar.scheduler import ScheduledBatch, Sequence
from omni.engines.ar.state import SequenceState
from omni.engines.base import EngineLoadError, EngineRequest, StepOutput, failed_output


class SilentDetokenizer:
    """Codec tokens carry no text."""

    text = ""
    stopped = False

    def push(self, token_ids: Any, final: bool = False) -> tuple[str, bool]:
        return "", False


@dataclass
class _FeedState(SequenceState):
    feed: Any = None  # the model feed's per-request state
    voice: str = ""
    fed: list[torch.Tensor] | None = None  # decode inputs fed so far (recompute on preemption)


class FeedbackAREngine(AREngine):
    def __init__(self, model: str, model_dir: str, **kwargs: Any) -> None:
        self.model_name = model
        super().__init__(model_dir, **kwargs)
        self.runner.chain = False  # its decode input is the feed's embedding, not the token

    def _known_options(self) -> frozenset[str]:
        from omni.models import adapter_options

        return AR_OPTIONS | adapter_options(self.model_name)

    def _load(self, model_dir: str, dtype: str, device: str) -> Any:
        from omni.models import build_feedback_lm

        if (self.options.get("load_format") or "auto") != "auto":  # its adapter loads it
            raise EngineLoadError(f"load_format {self.options['load_format']!r}: the "
                                  f"{self.model_name} adapter loads its own weights; dummy "
                                  "weights serve plain causal LMs and diffusion stages")

        self.lm, self.feed = build_feedback_lm(self.model_name, model_dir=model_dir,
                                               device=device, dtype=dtype,
                                               options=self.options)
        return self.lm

    def _make_graphs(self) -> Any:
        """Decode graphs fed with the feed's input embeddings (cuda_graphs), and the feed's
        own per-step work (feed_cuda_graphs, e.g. a code predictor), on CUDA."""
        max_seqs = self._opt("max_num_seqs", 64)
        reserve = getattr(self.feed, "reserve", None)
        if reserve is not None:  # static buffers the graphs write, sized once
            reserve(max_seqs)
        use = getattr(self.feed, "use_cuda_graphs", None)
        if self.options.get("feed_cuda_graphs", True) and use is not None:
            use(max_seqs)
        return super()._make_graphs(embeds=(self.lm.config.hidden_size, self.lm.dtype))

    def _warm_inputs(self, tokens: int) -> dict[str, torch.Tensor]:
        """This model is fed embeddings, not ids (see _packed_inputs)."""
        return {"inputs_embeds": torch.zeros(1, tokens, self.lm.config.hidden_size,
                                             dtype=self.lm.dtype, device=self.lm.device)}

    # -- contract ---------------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._seqs:
                raise ValueError(f"request id {rid!r} is already running")
            params = dict(request.params or {})
            voice = self.feed.voice(params.pop("voice", None))
            sampling = request_sampling(self.defaults, params)
            if sampling.ignore_eos:  # an end token here would be a step with no frame:
                sampling = replace(sampling, min_tokens=sampling.max_tokens)
            inputs = request.inputs or {}
            producer = stream_producer(inputs)
            full = {k: v for k, v in inputs.items() if k != "stream"}
            chunks = self._input_chunks(full) if producer is None else []
            feed = self.feed.new_state(sampling.seed, self.lm.device)
            configure = getattr(self.feed, "configure", None)
            if configure is not None:  # the request's own params, checked by the model
                configure(feed, params)
        except Exception as e:  # bad input (e.g. an unknown voice) fails this request only
            self._failed.append(failed_output(rid, e))
            return
        state = _FeedState(sampling, SequenceSampler(sampling, (), self.lm.device),
                           SilentDetokenizer(), stream_from=producer, feed=feed,
                           voice=voice, fed=[])
        seq = Sequence(rid, [], state, input_open=True)
        self._seqs[rid] = seq
        self.scheduler.add(seq)
        if producer is None:  # full delivery: every chunk is here already, and the
            # prompt is built and the hold decided once for all of them
            self._take(seq, chunks, last=True)

    def _input_chunks(self, full: dict[str, Any]) -> list[dict[str, Any]]:
        """A request's chunks when none stream in: an upstream stage's whole output, or
        the request's own inputs for a feed that reads them."""
        if full.keys() & getattr(self.feed, "request_inputs", frozenset()):
            return [full]  # the request's own inputs (else an upstream stage's output)
        if len(full) != 1 or not isinstance(next(iter(full.values())), list):
            raise ValueError("this stage takes its input from one upstream stage")
        return next(iter(full.values())) or [{}]

    def append(self, request_id: str, producer: str, seq_no: int, data: dict[str, Any] | None,
               last: bool) -> None:
        seq = self._seqs.get(request_id)
        if seq is None:
            return  # finished, aborted or failed: late chunks are dropped
        state: _FeedState = seq.state
        if producer != state.stream_from or seq_no != state.stream_seq:
            self._failed.append(self._fail(seq, f"bad stream input: chunk {seq_no} from "
                                                f"'{producer}', expected {state.stream_seq}"))
            return
        state.stream_seq += 1
        self._take(seq, [data], last)

    def _take(self, seq: Sequence, chunks: list[dict[str, Any] | None], last: bool) -> None:
        state: _FeedState = seq.state
        try:
            for data in chunks:
                self.feed.take(state.feed, data or {})
            state.feed.closed = last
            if seq.input_open:
                prompt = self.feed.prefill(state.feed, state.voice)
                if prompt is not None:
                    embeds, seq.media = prompt
                    seq.embeds, seq.prompt, seq.input_open = embeds, [0] * len(embeds), False
                elif last:  # the producer ended before there was anything to say
                    self._failed.append(self._finish(seq, "stop", ""))
                    return
            self._hold(seq)
        except Exception as e:
            self._failed.append(self._fail(seq, f"bad stream input: {type(e).__name__}: {e}"))

    def _hold(self, seq: Sequence) -> None:
        """Hold a sequence whose next decode input waits for the producer."""
        decoding = seq.output and seq.computed >= len(seq.prompt) + len(seq.output) - 1
        seq.held = bool(decoding) and not self.feed.ready(seq.state.feed, len(seq.output) - 1)

    def _before_launch(self) -> None:
        for seq in self._seqs.values():  # the step just recorded may need the next input
            self._hold(seq)

    def info(self) -> dict[str, Any]:
        return {**super().info(), **self.feed.info()}

    # -- one step -----------------------------------------------------------------------------
    def _packed_inputs(self, batch: ScheduledBatch, ids: torch.Tensor) -> dict[str, Any]:
        prepare = getattr(self.feed, "prepare", None)
        if prepare is not None:  # the feed's per-step input work, batched over the step
            prepare([seq.state.feed for seq in batch.seqs])
        self._due_inputs(batch)
        rows = []
        for seq, start, n in zip(batch.seqs, batch.starts, batch.counts, strict=True):
            state: _FeedState = seq.state
            for pos in range(start, start + n):
                if pos < len(seq.prompt):
                    rows.append(seq.embeds[pos])
                    continue
                step = pos - len(seq.prompt)
                if step == len(state.fed):
                    state.fed.append(self.feed.decode_input(state.feed, step))
                rows.append(state.fed[step])
        return {"inputs_embeds": torch.stack(rows)[None].to(self.lm.dtype)}

    def _due_inputs(self, batch: ScheduledBatch) -> None:
        """The step's first not yet built decode input of each sequence, from the feed's
        batched decode_inputs where it has one (else _packed_inputs builds them per row)."""
        batched = getattr(self.feed, "decode_inputs", None)
        if batched is None:
            return
        due = [seq.state for seq, start, n in zip(batch.seqs, batch.starts, batch.counts,
                                                 strict=True)
               if start <= len(seq.prompt) + len(seq.state.fed) < start + n]
        if due:
            built = batched([st.feed for st in due], [len(st.fed) for st in due])
            for state, row in zip(due, built, strict=True):
                state.fed.append(row)

    def _graph_inputs(self, batch: ScheduledBatch) -> Any:
        return self._packed_inputs(batch, None)["inputs_embeds"][0]

    def _sampled(self, seqs: list[Sequence], results: list[Any]) -> None:
        eos = self.lm.eos_token_ids
        rows = [i for i, r in enumerate(results) if r.token not in eos]
        self.feed.feedback([seqs[i].state.feed for i in rows],
                           [results[i].token for i in rows], rows,
                           [seqs[i].state.params.greedy for i in rows])

    def _emit(self, seq: Sequence, result: Any) -> StepOutput:
        codes = None if result.token in self.lm.eos_token_ids else seq.state.feed.codes
        out = super()._emit(seq, result)
        if codes is not None:
            out.data.update(self.feed.frame_output(seq.state.feed, codes))
        return out


def build_feedback_engine(model: str, model_dir: str | None, **kwargs: Any) -> FeedbackAREngine:
    if not model_dir:
        raise EngineLoadError(f"model '{model}' needs a model_dir")
    return FeedbackAREngine(model, model_dir, **kwargs)
