"""One step's forward over its packed batch, the eager way (AREngine._forward): each
sequence's slice of tokens and positions laid end to end, the rows whose logits are
sampled (a sequence's last fed token, when it reaches the end of its known tokens),
prompt embeddings spliced over the ids where a sequence feeds them, which logits the
model keeps, and the hidden-state rows exported. A decode-only step that a captured graph
covers (graph_covers) replays the graph instead (decode_graphs.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni.engines.ar.media import step_media, whole_delta
from omni.engines.ar.paged_attention import build_layout
from omni.engines.ar.scheduler import ScheduledBatch, Sequence
from omni.engines.ar.state import exported_rows


def graph_covers(graphs: Any, batch: ScheduledBatch, chained: bool = False) -> bool:
    """A decode-only step that a captured graph covers (a chained step is one)."""
    return (graphs is not None and all(n == 1 for n in batch.counts)
            and all((chained or (s.samples_next and s.pending == 1))
                    and whole_delta(s.media) is not None for s in batch.seqs)
            and graphs.fits(len(batch.seqs), max(batch.starts) + 1))


def graph_forward(graphs: Any, batch: ScheduledBatch, inputs: Any, prompt_only: bool
                  ) -> tuple[list[Sequence], torch.Tensor, Any]:
    """A step that graph_covers, replayed: ``inputs`` are what the graphs feed (each
    sequence's last token, or a chained step's ids on the device); the same triple as
    eager_forward."""
    seqs = batch.seqs
    logits = graphs.run(inputs, list(batch.starts), [s.blocks.table for s in seqs],
                        [whole_delta(s.media) for s in seqs])
    hidden = None if graphs.export_layers is None else exported_rows(
        batch, graphs.hidden[:len(seqs)], prompt_only)
    return seqs, logits, hidden


def eager_forward(lm: Any, cache: Any, batch: ScheduledBatch, fed: torch.Tensor | None,
                  packed_inputs: Callable[[ScheduledBatch, torch.Tensor], dict[str, Any]],
                  export_layers: Any, prompt_only: bool
                  ) -> tuple[list[Sequence], torch.Tensor, Any]:
    """The sequences sampled, their logits and (export_layers) each one's exported rows.
    fed: a chained step's token ids (steps.py); packed_inputs: the engine's hook that
    makes the model's inputs of the packed ids (AREngine._packed_inputs)."""
    ids, positions, last, sampled = pack_tokens(batch, chained=fed is not None)
    dev = lm.device
    exporting = exports_step(export_layers, prompt_only, batch)
    layout = build_layout(cache, [s.blocks.table for s in batch.seqs], batch.starts,
                          batch.counts, dev)
    inputs = packed_inputs(batch, torch.tensor([ids], device=dev) if fed is None
                           else fed[None])
    position_ids, media = step_media(lm, batch, torch.tensor(positions, device=dev))
    with media:  # a multimodal prompt's rotary positions and vision features
        out = lm.model(**inputs, position_ids=position_ids, use_cache=False,
                       omni_batch=layout,
                       output_hidden_states=exporting, **keep_logits(lm, last))
    hidden = None if not exporting else exported_rows(batch, torch.stack(
        [out.hidden_states[i][0] for i in export_layers], dim=1), prompt_only)
    return sampled, kept_logits(lm, out.logits, last), hidden


def pack_tokens(batch: ScheduledBatch, chained: bool
                ) -> tuple[list[int], list[int], list[int], list[Sequence]]:
    """The packed token ids and positions, the packed index of each sampled row, and the
    sequences sampled (every one in a chained step)."""
    ids, positions, last, sampled = [], [], [], []
    for seq, start, n in zip(batch.seqs, batch.starts, batch.counts, strict=True):
        ids += seq.token_slice(start, start + n)
        positions += range(start, start + n)
        if chained or start + n == len(seq.prompt) + len(seq.output):
            last.append(len(positions) - 1)
            sampled.append(seq)
    return ids, positions, last, sampled


def exports_step(export_layers: Any, prompt_only: bool, batch: ScheduledBatch) -> bool:
    """Whether the step asks the model for hidden states (a prompt-only export: only a
    step that feeds prompt tokens)."""
    return export_layers is not None and (not prompt_only or any(
        start < len(s.prompt) for s, start in zip(batch.seqs, batch.starts, strict=True)))


def prompt_embeds_inputs(lm: Any, batch: ScheduledBatch, ids: torch.Tensor) -> dict[str, Any]:
    """input_ids, or inputs_embeds when a sequence feeds prompt embeddings this step."""
    if all(s.embeds is None or start >= len(s.prompt)
           for s, start in zip(batch.seqs, batch.starts, strict=True)):
        return {"input_ids": ids}
    embeds = lm.model.get_input_embeddings()(ids)[0]
    offset = 0
    for seq, start, n in zip(batch.seqs, batch.starts, batch.counts, strict=True):
        if seq.embeds is not None and start < len(seq.prompt):
            upto = min(start + n, len(seq.prompt))
            embeds[offset:offset + upto - start] = seq.embeds[start:upto]
        offset += n
    return {"inputs_embeds": embeds.unsqueeze(0)}


def keep_logits(lm: Any, last: list[int]) -> dict[str, Any]:
    """The forward's logits_to_keep: the sampled rows only, for a model that takes it."""
    if not lm.keeps_logits:
        return {}
    return {"logits_to_keep": torch.tensor(last, dtype=torch.long, device=lm.device)}


def kept_logits(lm: Any, logits: torch.Tensor, last: list[int]) -> torch.Tensor:
    """The sampled rows' logits, picked here when the model returned every position's."""
    if not lm.keeps_logits:
        return logits[0, torch.tensor(last, dtype=torch.long, device=lm.device)]
    return logits[0]
