"""Several Cosmos 3 requests in ONE transformer call: packed sequences, attention per sample.

The transformer takes one packed sequence (all text tokens, then all generation tokens)
and attends over all of it with no mask: two requests packed naively would attend to
each other. Packing is otherwise supported (its per-item lists of vision / action tokens
and index tensors), so the batch is built as [text of A, text of B, ..., generation
tokens of A, of B, ...] with every index shifted to its place, and the attention
processor below runs attention per sample over that sample's slices (text causal;
generation over the sample's text + generation keys), as the stock processor does for
one sample. Projections, MLPs and norms, the bulk of the work, run once over the whole
packed sequence. Per-sample attention calls, not a dense block-diagonal mask: a mask is
O(tokens^2) memory, too much at real sizes (several thousand tokens per sample).

With one sample the processor computes exactly what the stock one does; with several,
the batched matmuls may round differently (a trial: 4e-7 in the velocity; frames within
one uint8 level).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_LISTS = ("vision_token_shapes", "vision_noisy_frame_indexes", "action_token_shapes",
          "action_noisy_frame_indexes")
_GEN_INDEXES = ("vision_sequence_indexes", "vision_mse_loss_indexes",
                "action_sequence_indexes", "action_mse_loss_indexes")


class PerSampleAttention:
    """Cosmos3AttnProcessor's math with attention restricted to each sample's tokens;
    ``lengths`` [(text, generation), ...] is set before each call (one sample: stock)."""

    def __init__(self) -> None:
        self.lengths: list[tuple[int, int]] = []

    def __call__(self, attn: Any, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                 rotary_emb: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.models.transformers.transformer_cosmos3 import _rotate_half

        heads, kv, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        q_und = attn.norm_q(attn.to_q(und_seq).view(-1, heads, dim))
        k_und = attn.norm_k(attn.to_k(und_seq).view(-1, kv, dim))
        v_und = attn.to_v(und_seq).view(-1, kv, dim)
        k_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None \
            else k_und
        q_gen = attn.norm_added_q(attn.add_q_proj(gen_seq).view(-1, heads, dim))
        k_gen = attn.norm_added_k(attn.add_k_proj(gen_seq).view(-1, kv, dim))
        v_gen = attn.add_v_proj(gen_seq).view(-1, kv, dim)
        cos_und, sin_und, cos_gen, sin_gen = (r.unsqueeze(1) for r in rotary_emb)

        def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            return x * cos + _rotate_half(x) * sin

        q_und, k_und = rope(q_und, cos_und, sin_und), rope(k_und, cos_und, sin_und)
        k_for_gen = rope(k_for_gen, cos_und, sin_und)
        q_gen, k_gen = rope(q_gen, cos_gen, sin_gen), rope(k_gen, cos_gen, sin_gen)
        lengths = self.lengths or [(und_seq.shape[0], gen_seq.shape[0])]
        und_out, gen_out, u0, g0 = [], [], 0, 0
        for u, g in lengths:
            und = slice(u0, u0 + u)
            gen = slice(g0, g0 + g)
            und_out.append(_sdpa(q_und[und], k_und[und], v_und[und], causal=True))
            gen_out.append(_sdpa(q_gen[gen], torch.cat([k_for_gen[und], k_gen[gen]]),
                                 torch.cat([v_und[und], v_gen[gen]]), causal=False))
            u0, g0 = u0 + u, g0 + g
        return attn.to_out(torch.cat(und_out)), attn.to_add_out(torch.cat(gen_out))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """(tokens, heads, dim) in, (tokens, heads * dim) out, as the stock processor's call."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], is_causal=causal,
                                         enable_gqa=True)
    return out[0].transpose(0, 1).flatten(-2, -1)


def install(transformer: Any) -> PerSampleAttention:
    """One shared processor on every attention layer of ``transformer``."""
    processor = PerSampleAttention()
    transformer.set_attn_processor(processor)
    return processor


def pack(calls: list[dict[str, Any]]) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """Transformer kwargs of single-sample calls -> one packed call + each sample's
    (text, generation) lengths."""
    und = [c["und_len"] for c in calls]
    gen = [c["sequence_length"] - c["und_len"] for c in calls]
    total_und = sum(und)
    packed: dict[str, Any] = {
        "input_ids": torch.cat([c["input_ids"] for c in calls]),
        "text_indexes": torch.arange(total_und, device=calls[0]["input_ids"].device),
        "und_len": total_und, "sequence_length": total_und + sum(gen),
        "position_ids": torch.cat(
            [c["position_ids"][:, :u] for c, u in zip(calls, und, strict=True)]
            + [c["position_ids"][:, u:] for c, u in zip(calls, und, strict=True)], 1),
        "vision_timesteps": torch.cat([c["vision_timesteps"] for c in calls]),
        "return_dict": False}
    for name in ("vision_tokens", "action_domain_ids", *_LISTS):
        packed[name] = [x for c in calls for x in (c.get(name) or [])] or None
    packed["vision_tokens"] = packed["vision_tokens"] or []
    has_actions = calls[0].get("action_tokens") is not None
    packed["action_tokens"] = [x for c in calls for x in c["action_tokens"]] \
        if has_actions else None
    packed["action_timesteps"] = torch.cat([c["action_timesteps"] for c in calls]) \
        if has_actions else None
    offset = total_und
    shifted: dict[str, list[torch.Tensor]] = {name: [] for name in _GEN_INDEXES}
    for call, u, g in zip(calls, und, gen, strict=True):
        for name in _GEN_INDEXES:
            if call.get(name) is not None:
                shifted[name].append(call[name] - u + offset)
        offset += g
    for name in _GEN_INDEXES:
        packed[name] = torch.cat(shifted[name]) if shifted[name] else None
    for name in ("sound_tokens", "sound_token_shapes", "sound_sequence_indexes",
                 "sound_mse_loss_indexes", "sound_timesteps", "sound_noisy_frame_indexes"):
        packed[name] = None
    return packed, list(zip(und, gen, strict=True))
