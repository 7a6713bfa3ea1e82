"""The talker's code predictor over a static KV cache: compiled, graphed, no recomputing.

A frame's 15 predictor passes (omni/models/qwen3_omni_predictor.py) either recompute the
frame's earlier positions in every pass (predict_uncached: 135 positions a row a frame)
or read them from transformers' cache (predict_cached: 15). In CUDA graphs on an H100,
Qwen3-TTS's release shapes (bench/results/qwen3-tts-gpu.md): uncached 19.5 ms a frame at
64 rows with eager layers, 10.5 with them compiled; cached 13.5 with eager layers and 13.5
"compiled" too: the compiled layers took transformers' cache object, whose layer list
torch.compile guards on (`len(past_key_values.layers) == 3`), so they hit its recompile
limit and ran eagerly.

Here each layer writes its keys and values into a buffer of the frame's length (16
positions) allocated once per call, so every pass's shapes are fixed by the batch size and
the pass, and a layer step is a plain function of tensors that torch.compile fuses (the
norms, rotary and residual adds around the matmuls and one SDPA call). The arithmetic is
transformers' decoder layer (Qwen3's: q/k norms on the head dim, rotate-half rotary,
grouped-query SDPA, SwiGLU MLP); the same codes as predict_cached
(tests/unit/test_code_predictor.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P = 50, 0.8  # transformers' generate() values


def pick(logits: torch.Tensor, draws: torch.Tensor, greedy: torch.Tensor,
         top_k: int = CODE_PREDICTOR_TOP_K, top_p: float = CODE_PREDICTOR_TOP_P,
         temperature: float = 1.0) -> torch.Tensor:
    """One code per row: argmax where greedy, else temperature, top-k, then top-p sampling
    by inverse CDF with the row's uniform draw (transformers' generate() warpers, in their
    order). No host syncs."""
    top = logits.topk(min(top_k or logits.shape[-1], logits.shape[-1]), dim=-1)
    probs = (top.values / temperature).softmax(-1)
    if top_p < 1.0:
        probs = probs * (probs.cumsum(-1) - probs < top_p)
    cdf = probs.cumsum(-1)
    index = (cdf < draws[:, None] * cdf[:, -1:]).sum(-1).clamp_(max=probs.shape[-1] - 1)
    sampled = top.indices.gather(1, index[:, None])[:, 0]
    return torch.where(greedy, logits.argmax(-1), sampled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def layer_step(layer: Any, x: torch.Tensor, cos_all: torch.Tensor, sin_all: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, start: int,
               causal: bool) -> torch.Tensor:
    """One decoder layer over the frame's positions start .. start + T (x: (B, T, H)),
    its keys and values written into ``keys`` / ``values`` (B, kv heads, length, head dim),
    attending over every position up to its own. ``causal`` (T > 1) comes in as a Python
    bool: computed from T inside torch.compile, where T is a dynamic size after the first
    pass, it was a symbolic bool that SDPA refuses, a graph break in every layer step. The
    projections are the layer's modules: in the AR engine, slices of one fused q/k/v and
    gate/up matmul each (omni/engines/ar/fused_projections.py), so q, k, v are called in
    that order. The rotary tables come whole (the frame's positions) and are sliced here:
    a slice made outside arrived as a view, and torch 2.11's dynamo guarded on its offset
    into the table, a recompile per pass until its limit of 8 left the rest eager (an H100
    stage's log, session 15)."""
    attn = layer.self_attn
    end = start + x.shape[1]
    cos, sin = cos_all[:, start:end], sin_all[:, start:end]
    h = layer.input_layernorm(x)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys[:, :, start:end] = k
    values[:, :, start:end] = v
    # several new positions only in the first pass (start 0): causal among themselves
    out = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end],
                                         is_causal=causal, scale=attn.scaling,
                                         enable_gqa=q.shape[1] != k.shape[1])
    x = x + attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def pass_tail(norm: Any, head: Any, embedding: torch.Tensor, x: torch.Tensor,
              draws: torch.Tensor, start: int, greedy: torch.Tensor,
              sampling: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """A pass's end: the code group's logits (``head``: its lm_head), its pick, and the
    picked code's embedding (``embedding``: the group's table). A function of its own so
    that torch.compile fuses the norm, the cast and pick's ~10 small kernels a pass; the
    table goes in as a tensor so that one compile serves all groups. The pass's last
    position and its draws are sliced here, as layer_step's rotary tables are; ``draws``
    are indexed by the pass's first position (predict_static), not by its group (an int
    argument of 0 or 1 is a compile of its own: the first two groups would be two), and
    through a slice (an index by the int specialized its first value: one compile more)."""
    logits = head(norm(x[:, -1])).float()
    code = pick(logits, draws[:, start:start + 1][:, 0], greedy, **sampling)
    return code, F.embedding(code, embedding)


def one_pass(layers: list[Any], buffers: list[tuple[torch.Tensor, torch.Tensor]],
             x: torch.Tensor, cos_all: torch.Tensor, sin_all: torch.Tensor, start: int,
             causal: bool, norm: Any, head: Any, embedding: torch.Tensor, draws: torch.Tensor,
             greedy: torch.Tensor, sampling: dict[str, Any], project: Any = None,
             step: Any = layer_step, tail: Any = pass_tail) -> tuple[torch.Tensor, torch.Tensor]:
    """One predictor pass over the new positions ``x``: (code, its embedding). Compiled
    whole (PredictorGraphs' compile_unit "pass"), torch.compile also fuses across the
    layer boundaries (a layer's residual add with the next one's norm)."""
    x = x if project is None else project(x)
    for layer, (keys, values) in zip(layers, buffers, strict=True):
        x = step(layer, x, cos_all, sin_all, keys, values, start, causal)
    return tail(norm, head, embedding, x, draws, start, greedy, sampling)


def supported(cp: Any) -> bool:
    """Whether the predictor's layers have the parts layer_step calls (attention biases
    need nothing: they live inside the projections) and no sliding window shorter than a
    frame; where not, the talkers keep the uncached loop."""
    layers = list(cp.model.layers)
    need = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
    attn_parts = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "head_dim",
                  "scaling")
    return bool(layers) and all(
        all(hasattr(layer, n) for n in need)
        and all(hasattr(layer.self_attn, n) for n in attn_parts)
        and (getattr(layer.self_attn, "sliding_window", None) or 1 << 30) >= 64
        for layer in layers)


def predict_static(cp: Any, hidden: torch.Tensor, first: torch.Tensor, draws: torch.Tensor,
                   greedy: torch.Tensor, project: Any = None,
                   sampling: dict[str, Any] | None = None, step: Any = layer_step,
                   tail: Any = pass_tail,
                   run: Any = one_pass) -> tuple[torch.Tensor, torch.Tensor]:
    """predict_cached's (residual codes, sum of the frame's code embeddings) over static
    per-layer buffers; ``step`` / ``tail`` / ``run``: layer_step / pass_tail / one_pass or
    their compiled forms."""
    model = cp.model
    layers = list(model.layers)[: model.config.num_hidden_layers]
    passes, rows = draws.shape[1], hidden.shape[0]
    length = passes + 1  # the talker's hidden, the first code, the residual codes but the last
    head_dim = layers[0].self_attn.head_dim
    kv_heads = layers[0].self_attn.k_proj.out_features // head_dim
    buffers = [(hidden.new_empty(rows, kv_heads, length, head_dim),
                hidden.new_empty(rows, kv_heads, length, head_dim)) for _ in layers]
    positions = torch.arange(length, device=hidden.device)[None]
    cos_all, sin_all = model.rotary_emb(hidden, positions)
    embeddings = model.get_input_embeddings()
    x, start, codes, total = torch.stack((hidden, first), dim=1), 0, [], first
    # each pass's draws at its first position: the first pass starts at 0, group g >= 1's
    # at g + 1
    by_start = torch.cat((draws[:, :1], draws), dim=1)
    for group in range(passes):
        code, embed = run(layers, buffers, x, cos_all, sin_all, start, x.shape[1] > 1,
                          model.norm, cp.lm_head[group], embeddings[group].weight, by_start,
                          greedy, sampling or {}, project, step, tail)
        codes.append(code)
        total = total + embed
        x, start = embed[:, None], start + x.shape[1]
    return torch.stack(codes, dim=1), total
