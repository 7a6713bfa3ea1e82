"""One matmul for the sibling projections of a layer that read the same input.

transformers' decoder layers project their input three times for attention (q_proj,
k_proj, v_proj) and twice for a gated MLP (gate_proj, up_proj). In a decode step each is
a skinny matmul: on an H200 (an 8B dense shape, batch 32) k_proj and v_proj took 5.4 us
each for 8 MB of weights (40% of the copy bandwidth), plus a split-K reduction kernel per
projection (bench/results/ar-step-*.md, the kernel tables). One matmul over the
concatenated weights reads the same bytes in fewer, fuller kernels.

We do not rewrite the model's forward (it differs between transformers versions and
models): the first projection called becomes the group's *leader*, which runs the fused
matmul and leaves the whole output in a stash; its siblings, called next with the same
input tensor, return their columns of it. A sibling called with another input, or first,
runs its own slice of the fused weight: the result is right whatever order or inputs the
forward uses, only the saving needs the usual order (q, k, v; gate, up).

The stash is one module-level list, not per-layer state, so torch.compile traces one
decoder layer for all of them (the reason paged_attention.bind_cache uses buffers): every
layer reads the same global and the same integer attributes.
"""

from __future__ import annotations

import torch
from torch import nn

from omni.engines.quantization.fp8 import linear

# (input, fused output) of the leader that ran last; emptied by the group's last sibling
_STASH: list[tuple[torch.Tensor, torch.Tensor]] = []

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class ProjectionSlice(nn.Module):
    """Columns [start, stop) of a fused projection; the leader (first of the group) runs
    the fused matmul, the last member empties the stash."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, start: int, stop: int,
                 leader: bool, last: bool) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias  # shared by the group (one tensor, no copy)
        self.weight_scale: torch.Tensor | None = None  # per-row scales of an fp8 weight
        self.start, self.stop, self.leader, self.last = start, stop, leader, last
        self.in_features, self.out_features = weight.shape[1], stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.leader:
            _STASH.clear()
            _STASH.append((x, linear(x, self.weight, self.bias, self.weight_scale)))
        fused = _STASH[0][1] if _STASH and _STASH[0][0] is x else None
        if self.last:
            _STASH.clear()  # holds no activation past its layer
        if fused is not None:
            return fused[..., self.start:self.stop]
        bias = None if self.bias is None else self.bias[self.start:self.stop]
        scale = None if self.weight_scale is None else self.weight_scale[self.start:self.stop]
        return linear(x, self.weight[self.start:self.stop], bias, scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns [{self.start}, {self.stop}) of a fused projection")


def fuse_projections(model: nn.Module) -> int:
    """Replace every group of sibling nn.Linear projections (GROUPS) with slices of one
    fused weight; returns how many groups were fused. Groups whose members differ in input
    width, dtype, device or bias-ness, or are not plain nn.Linear, are left alone."""
    fused = 0
    for module in list(model.modules()):
        for names in GROUPS:
            members = [getattr(module, n, None) for n in names]
            if _fusable(members):
                _fuse(module, names, members)
                fused += 1
    return fused


def _fusable(members: list[nn.Module | None]) -> bool:
    if not all(type(m) is nn.Linear for m in members):  # subclasses: quantized, LoRA, ...
        return False
    first = members[0].weight
    return all(m.weight.shape[1] == first.shape[1] and m.weight.dtype == first.dtype
               and m.weight.device == first.device
               and (m.bias is None) == (members[0].bias is None) for m in members)


@torch.no_grad()
def _fuse(module: nn.Module, names: tuple[str, ...], members: list[nn.Linear]) -> None:
    weight = nn.Parameter(torch.cat([m.weight for m in members]), requires_grad=False)
    bias = None
    if members[0].bias is not None:
        bias = nn.Parameter(torch.cat([m.bias for m in members]), requires_grad=False)
    start = 0
    for i, (name, member) in enumerate(zip(names, members, strict=True)):
        stop = start + member.out_features
        setattr(module, name, ProjectionSlice(weight, bias, start, stop, leader=i == 0,
                                              last=i == len(names) - 1))
        start = stop
