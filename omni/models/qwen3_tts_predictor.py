"""Qwen3-TTS's code predictor as one CUDA graph per step (the residual codes of a frame).

qwen-tts's talker forward runs its code predictor through transformers' ``generate``:
per frame 15 dependent passes of a 5-layer model, each a few hundred small kernels plus
generate's own Python around them. On a GPU that loop is bound by per-call overhead, not
arithmetic, at any batch size. Qwen3-TTS's talker is Qwen3-Omni's design (a codec
embedding and an lm_head per code group), so Qwen3-Omni's graphed loop
(qwen3_omni_predictor.predict_uncached: no KV cache, every shape fixed by the batch size,
sampling inside the graph) serves it, given qwen-tts's projection into the predictor's
width and the stage's subtalker sampling.

GraphedPredictor.generate stands in for the predictor's ``generate`` while the talker
batch steps (``predicting_with``): the talker forward reads only ``.sequences`` (B, 15)
from it. Greedy codes are the same as generate's (argmax of the same logits, recomputed
without a cache); sampled codes follow the same warpers (temperature, top-k, top-p) but
draw by inverse CDF from uniform numbers, so they are not the draws of transformers'
multinomial: a batch with a seeded row (its own generator, qwen-tts's draws) keeps
generate. A batch larger than the largest graph also keeps generate.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

from omni.models.qwen3_omni_predictor import PredictorGraphs, make_graphs


class GraphedPredictor:
    """A talker's code predictor ``cp`` (talker width ``hidden_size``, ``groups`` codes a
    frame), captured per padded batch size (capture=False: the same static buffers run
    eagerly, for CPU tests of the arithmetic); ``kv_cache``: the static-KV loop
    (predictor_kv.predict_static), else the uncached one."""

    def __init__(self, cp: Any, hidden_size: int, groups: int, gen: dict[str, Any],
                 max_batch: int, capture: bool = True, kv_cache: bool = False) -> None:
        weight = cp.lm_head[0].weight
        self.groups = groups
        self.device = weight.device
        sampling = {"top_k": int(gen.get("subtalker_top_k") or 0),
                    "top_p": float(gen.get("subtalker_top_p") or 1.0),
                    "temperature": float(gen.get("subtalker_temperature") or 1.0)}
        args = (cp, hidden_size, groups, weight.dtype, self.device, max_batch)
        options = {"project": cp.small_to_mtp_projection, "sampling": sampling,
                   "kv_cache": kv_cache}
        self.graphs: PredictorGraphs | None = (
            make_graphs(*args, **options) if capture
            else PredictorGraphs(*args, capture=False, **options))

    @classmethod
    def of(cls, model: Any, gen: dict[str, Any], max_batch: int,
           capture: bool = True) -> GraphedPredictor:
        """The graphed predictor of qwen-tts's model (its talker's)."""
        cfg = model.config.talker_config
        return cls(model.talker.code_predictor, int(cfg.hidden_size),
                   int(cfg.num_code_groups), gen, max_batch, capture)

    def generate(self, inputs_embeds: torch.Tensor, do_sample: bool = False,
                 **_: Any) -> Any:
        """generate's result for the talker: ``.sequences``, the 15 residual codes a row;
        None where no graph holds the batch."""
        rows = inputs_embeds.shape[0]
        if self.graphs is None:
            return None
        draws = (torch.rand(rows, self.groups - 1, device=self.device) if do_sample
                 else torch.zeros(rows, self.groups - 1, device=self.device))
        greedy = torch.full((rows,), not do_sample, dtype=torch.bool, device=self.device)
        out = self.graphs.run(inputs_embeds[:, 0], inputs_embeds[:, 1], draws, greedy)
        return None if out is None else SimpleNamespace(sequences=out[0])


@contextlib.contextmanager
def predicting_with(predictor: Any, graphed: GraphedPredictor | None) -> Any:
    """The talker's forward calls within use ``graphed`` for the code predictor's
    generate, falling back to generate itself where it returns None."""
    if graphed is None:
        yield
        return
    original, own = predictor.generate, predictor.__dict__.get("generate")

    def generate(*args: Any, **kwargs: Any) -> Any:
        return graphed.generate(*args, **kwargs) or original(*args, **kwargs)

    predictor.generate = generate
    try:
        yield
    finally:
        if own is None:
            del predictor.generate  # the class's method again
        else:
            predictor.generate = own
