"""The Qwen3-Omni talker's code predictor: the residual codes of one codec frame.

Per frame the predictor (a small dense LM) runs once per residual code group (15 in the
release), each pass reading the frame's sequence so far: [talker hidden, first code,
residual codes ...]. Two ways to run that loop, same math:

  predict_cached    transformers' KV cache, one new position per pass (any batch size)
  predict_uncached  no cache: each pass re-reads the whole (at most 17-position) sequence.
                    Every shape is fixed by the batch size alone, so the whole loop,
                    sampling included, can be captured as one CUDA graph (PredictorGraphs).

On a GPU the loop is bound by per-call overhead, not by arithmetic (H200, release-size
predictor: 15 passes took ~75 ms a frame at any batch size, bench/results/archive/omni-h200.md);
one graph replay per step removes the Python and launch cost of ~1,000 small kernels
(same H200: 89 -> 14 ms a step at batch 1, 91 -> 19 ms at batch 32, greedy codes equal;
scripts/profile_talker_step.py --graphs).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from omni.graph_capture import capturing, forwards_replaced
from omni.models.predictor_kv import layer_step, one_pass, pass_tail, pick, predict_static

log = logging.getLogger("omni.models.qwen3_omni")

GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def predict_cached(cp: Any, cache_key: str, hidden: torch.Tensor, first: torch.Tensor,
                   draws: torch.Tensor, greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual codes (B, groups-1), sum of the frame's code embeddings (B, H)); `first`:
    the embedding of each row's first code, `hidden`: the talker's last hidden state."""
    embeds, cache, codes, total = torch.stack((hidden, first), dim=1), None, [], first
    for group in range(draws.shape[1]):
        out = cp.model(inputs_embeds=embeds, use_cache=True, **{cache_key: cache})
        cache = getattr(out, cache_key)
        logits = cp.lm_head[group](out.last_hidden_state[:, -1]).float()
        code = pick(logits, draws[:, group], greedy)
        codes.append(code)
        embeds = cp.model.get_input_embeddings()[group](code)[:, None]
        total = total + embeds[:, 0]
    return torch.stack(codes, dim=1), total


def predict_uncached(cp: Any, hidden: torch.Tensor, first: torch.Tensor, draws: torch.Tensor,
                     greedy: torch.Tensor, project: Any = None,
                     sampling: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """predict_cached without a cache (see the module doc). ``project`` maps the sequence
    into the predictor's width first (Qwen3-TTS's small_to_mtp_projection), ``sampling``
    overrides pick's top_k / top_p / temperature."""
    seq, codes, total = torch.stack((hidden, first), dim=1), [], first
    for group in range(draws.shape[1]):
        out = cp.model(inputs_embeds=seq if project is None else project(seq), use_cache=False)
        logits = cp.lm_head[group](out.last_hidden_state[:, -1]).float()
        code = pick(logits, draws[:, group], greedy, **(sampling or {}))
        codes.append(code)
        embed = cp.model.get_input_embeddings()[group](code)
        total = total + embed
        seq = torch.cat((seq, embed[:, None]), dim=1)
    return torch.stack(codes, dim=1), total


class PredictorGraphs:
    """The predictor's loop for padded batch sizes (GRAPH_BATCHES), one CUDA graph each:
    predict_uncached, or with ``kv_cache`` predictor_kv.predict_static (stage option
    predictor_kv_cache).

    capture=False runs the same static buffers eagerly (CPU tests of the padding logic).
    A batch larger than the largest size returns None: the caller runs its own loop.
    """

    def __init__(self, cp: Any, hidden_size: int, groups: int, dtype: torch.dtype,
                 device: torch.device, max_batch: int, capture: bool = True,
                 compiled: bool = False, kv_cache: bool = False, compile_unit: str = "pass",
                 **options: Any) -> None:
        self.cp, self.capture, self.kv_cache = cp, capture, kv_cache
        # predict_static's layer step, pass tail and pass (compiled in _capture_all):
        # compile_unit "pass" compiles each pass whole, "layer" the layer step and the tail
        self.step, self.tail, self.run_pass = layer_step, pass_tail, one_pass
        self.compile_unit = compile_unit
        # torch.compile of the predictor's decoder layers (one dynamic-shape compile shared
        # by its layers, as the AR engine's decode graphs do): fuses the norms, rotary and
        # casts, most of the ~45 kernels a layer pass launches eagerly; captures run it
        self.compiled = compiled
        self.options = options  # the loop's project / sampling
        self.sizes = [b for b in GRAPH_BATCHES if b <= max_batch] or [1]
        top = self.sizes[-1]
        self.hidden = torch.zeros(top, hidden_size, dtype=dtype, device=device)
        self.first = torch.zeros_like(self.hidden)
        self.draws = torch.zeros(top, groups - 1, device=device)
        self.greedy = torch.zeros(top, dtype=torch.bool, device=device)
        self.graphs: dict[int, tuple[Any, tuple[torch.Tensor, torch.Tensor]]] = {}
        if capture:
            self._capture_all()

    def _inputs(self, b: int) -> tuple[torch.Tensor, ...]:
        return self.hidden[:b], self.first[:b], self.draws[:b], self.greedy[:b]

    def _loop(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kv_cache:
            return predict_static(self.cp, *self._inputs(b), step=self.step, tail=self.tail,
                                  run=self.run_pass, **self.options)
        return predict_uncached(self.cp, *self._inputs(b), **self.options)

    def _capture_all(self) -> None:
        layers = list(self.cp.model.layers) if self.compiled and not self.kv_cache else []
        compiled = [torch.compile(type(layer).forward.__get__(layer), dynamic=True)
                    for layer in layers]
        if self.compiled and self.kv_cache and self.compile_unit == "pass":
            self.run_pass = torch.compile(one_pass, dynamic=True)
        elif self.compiled and self.kv_cache:  # plain functions of tensors: one compile each
            self.step = torch.compile(layer_step, dynamic=True)
            self.tail = torch.compile(pass_tail, dynamic=True)
        with forwards_replaced(layers, compiled):
            self._capture_sizes()

    def _capture_sizes(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy inits must not happen in capture
            for b in self.sizes:
                self._loop(b)
        torch.cuda.current_stream().wait_stream(side)
        for b in reversed(self.sizes):  # largest first: the smaller ones reuse its pool
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, pool=pool):
                out = self._loop(b)
            self.graphs[b] = (graph, out)

    def run(self, hidden: torch.Tensor, first: torch.Tensor, draws: torch.Tensor,
            greedy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        n = hidden.shape[0]
        size = next((b for b in self.sizes if b >= n), None)
        if size is None:
            return None
        for static, value in zip(self._inputs(size), (hidden, first, draws, greedy),
                                 strict=True):
            static[:n].copy_(value)
            static[n:].zero_()  # padding rows: zeros in, ignored out
        if self.capture:
            graph, (codes, total) = self.graphs[size]
            graph.replay()
        else:
            codes, total = self._loop(size)
        return codes[:n].clone(), total[:n].clone()


def make_graphs(cp: Any, hidden_size: int, groups: int, dtype: torch.dtype,
                device: torch.device, max_batch: int, compiled: bool = False,
                **options: Any) -> PredictorGraphs | None:
    """Captured graphs on CUDA (compiled layers where asked, else or if that fails plain
    ones), or None (with a warning) when capture fails."""
    for compile_layers in (True, False) if compiled else (False,):
        try:
            return PredictorGraphs(cp, hidden_size, groups, dtype, device, max_batch,
                                   compiled=compile_layers, **options)
        except Exception as e:  # e.g. an op in transformers' forward that syncs with the host
            log.warning("code-predictor CUDA graphs%s failed (%s: %s)%s",
                        " with compiled layers" if compile_layers else "", type(e).__name__,
                        e, "; capturing them uncompiled" if compile_layers
                        else "; the predictor runs eagerly")
            torch.cuda.synchronize(device)
    return None
