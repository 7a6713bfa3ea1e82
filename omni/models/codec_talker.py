"""A codec talker as the AR engine calls it: the part Qwen3-Omni's and Qwen3-TTS's talkers
share (the same design: a decoder LM over codec embeddings, ``codec_head`` for the first code
group, a code predictor for the rest, run by the stage's feed after each step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class CodecInputs:
    """The decode inputs of a codec talker's feed (omni/engines/ar/feedback.py): the last
    frame's code embeddings (``st.next_codec``) + the text embedding the step reads, which
    each feed says in ``text_input(st, step)``."""

    def text_input(self, st: Any, step: int) -> torch.Tensor:
        raise NotImplementedError

    def decode_input(self, st: Any, step: int) -> torch.Tensor:
        return st.next_codec + self.text_input(st, step)

    def decode_inputs(self, states: list[Any], steps: list[int]) -> list[torch.Tensor]:
        """A step's inputs as rows of one sum: three kernels (two stacks and the add) where
        decode_input per row launched one each (64 a step at 64 sequences); the same
        elementwise arithmetic, so the same values. The rows are views of the step's one
        tensor: a finished sequence's row is freed with the step's last row (a few KiB a
        row), which the engine keeps for recompute after preemption."""
        texts = [self.text_input(st, g) for st, g in zip(states, steps, strict=True)]
        return list(torch.stack([st.next_codec for st in states]) + torch.stack(texts))


@dataclass
class TalkerOut:
    logits: torch.Tensor


class CodecTalkerLM(torch.nn.Module):
    """forward(inputs_embeds, position_ids, logits_to_keep, ...) -> logits of the kept rows
    (first code group, ``suppressed`` ids at -inf); the kept rows' last hidden states stay
    in ``last_hidden`` for the code predictor: rows of one buffer, so a decode step replayed
    from a CUDA graph (which runs no Python) leaves them there too."""

    def __init__(self, talker: Any, suppressed: torch.Tensor) -> None:
        super().__init__()
        self.talker = talker
        self.register_buffer("suppressed", suppressed, persistent=False)
        self.last_hidden: torch.Tensor | None = None  # (rows, H), kept rows first

    def reserve(self, rows: int) -> None:
        """Size the kept-rows buffer once (graphs captured later write into it)."""
        weight = self.talker.codec_head.weight
        self.last_hidden = torch.zeros(rows, weight.shape[1], dtype=weight.dtype,
                                       device=weight.device)

    def get_input_embeddings(self) -> Any:
        return self.talker.get_input_embeddings()

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor,
                logits_to_keep: torch.Tensor, **kwargs: Any) -> TalkerOut:
        kwargs.pop("input_ids", None)
        kwargs.pop("output_hidden_states", None)
        out = self.talker.model(inputs_embeds=inputs_embeds, position_ids=position_ids, **kwargs)
        kept = out.last_hidden_state[0, logits_to_keep]
        if self.last_hidden is None or len(self.last_hidden) < len(kept):
            self.last_hidden = torch.empty_like(kept)  # eager only: graphs reserve first
        self.last_hidden[:len(kept)].copy_(kept)
        logits = self.talker.codec_head(kept)
        return TalkerOut(logits.masked_fill(self.suppressed, float("-inf"))[None])  # (1, k, V)
