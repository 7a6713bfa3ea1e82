"""Multimodal prompts in the AR engine's packed forward: rotary positions and deepstack.

A prompt with images is not a plain token sequence: many vision-language models give its
tokens multi-axis rotary positions (time, height, width: an image's
tokens share a time and spread over a grid), and some add vision features to the hidden
states of their first layers at the image tokens ("deepstack"). The model's media
encoder describes this in a `PromptLayout`; here the engine slices it per step, since a
prompt may be prefilled over several steps and packed with other requests:
- positions: the layout's rotary positions for prompt tokens; after the prompt, each axis
  is the cache position + `rope_delta` (the text after an image starts past the image's
  largest position, not at its token count). Requests without a layout use their cache
  positions on every axis. The cache position (slots, causality) never changes.
- deepstack: the visual tokens of this step and their features, one tensor per layer.
How positions and deepstack features enter the forward is the model's (its adapter's
`rope` object in omni/models).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence as Seq
from typing import Any

import torch

from omni.engines.base import PromptLayout


def rotary_positions(layouts: Seq[PromptLayout | None], starts: Seq[int], counts: Seq[int],
                     axes: int) -> torch.Tensor:
    """(axes, tokens) rotary positions of a packed step."""
    rows = []
    for layout, start, n in zip(layouts, starts, counts, strict=True):
        pos = torch.arange(start, start + n)
        if layout is None:
            rows.append(pos.expand(axes, n))
            continue
        prompt_len = layout.rope.shape[1]
        inside = pos[pos < prompt_len]
        after = pos[pos >= prompt_len] + layout.rope_delta
        rows.append(torch.cat((layout.rope[:, inside].cpu(), after.expand(axes, len(after))), 1))
    return torch.cat(rows, 1)  # float if any layout's positions are


def whole_delta(layout: PromptLayout | None) -> int | None:
    """The layout's rope delta as an int (0 without a layout); None when fractional (a
    decode graph's position buffer holds integers: such a sequence decodes eagerly)."""
    if layout is None:
        return 0
    delta = float(layout.rope_delta)
    return int(delta) if delta.is_integer() else None


def deepstack_inputs(layouts: Seq[PromptLayout | None], starts: Seq[int],
                     counts: Seq[int]) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """(mask over the packed tokens, per-layer features of the masked tokens) of a step,
    or None when no visual token is fed in it."""
    masks, feats = [], []
    for layout, start, n in zip(layouts, starts, counts, strict=True):
        mask = torch.zeros(n, dtype=torch.bool)
        if layout is not None and layout.deepstack is not None:
            end = min(start + n, len(layout.visual_before))
            if start < end:
                mask[:end - start] = layout.visual_mask[start:end].cpu()
                first = layout.visual_before[start]
                taken = int(mask.sum())
                if taken:
                    feats.append([f[first:first + taken] for f in layout.deepstack])
        masks.append(mask)
    if not feats:
        return None
    per_layer = [torch.cat([f[i] for f in feats]) for i in range(len(feats[0]))]
    return torch.cat(masks), per_layer


def step_media(lm: Any, batch: Any, text: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """(position_ids, context manager adding the deepstack features) of a packed step of
    `batch` (a ScheduledBatch) whose tokens sit at cache positions `text`. A model
    without a `rope` object, or a step without a layout, takes (1, tokens) cache
    positions; otherwise the model's form of the rotary positions."""
    media = [s.media for s in batch.seqs]
    if lm.rope is None or all(m is None for m in media):
        return text[None], contextlib.nullcontext()
    axes = rotary_positions(media, batch.starts, batch.counts, lm.rope.axes)
    deepstack = None if lm.deepstack is None else deepstack_inputs(media, batch.starts,
                                                                   batch.counts)
    inject = lm.deepstack.inject(deepstack) if deepstack else contextlib.nullcontext()
    return lm.rope.position_ids(text, axes.to(text.device)), inject
