"""FP8 (e4m3) weights for a model's linear layers: per-output-channel weight scales, per-row
activation scales computed on the fly, one scaled matmul (issue #44 item 4).

A weight row w_i is stored as q_i = w_i / s_i in float8_e4m3fn with s_i = max|w_i| / 448
(e4m3's largest value), so every row uses the format's whole range; an activation row x_j
the same way at run time (s_j = max|x_j| / 448). ``torch._scaled_mm`` multiplies the fp8
operands and applies s_j * s_i to each output, in the activations' dtype. On Hopper that
matmul runs at twice the bf16 rate, and a decode step reads half the weight bytes; on CPU
torch computes the same thing (slowly), so the quantization's error is tested there.

Which layers: every ``nn.Linear`` of the blocks a caller names (an AR model's decoder layers,
a diffusion transformer's blocks), except MoE routers (a routing decision flipped by
rounding moves a token to other experts) and layers whose widths are not multiples of 16
(what the GPU kernel takes); what lies outside those blocks (embeddings, the LM head, a
transformer's input / timestep / final projections, norms) stays in the model's dtype, as
most FP8 checkpoints keep it. Written here rather than
taken from a library: torchao's float8 inference path and vLLM's both bring their own
runtimes; this is the one matmul and two reductions that path needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni.engines.quantization.fp8_rows import (
    disable_fused,
    fused_available,
    quantize_rows_fused,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
KERNEL_MULTIPLE = 16  # _scaled_mm's widths on CUDA
ROUTER_NAMES = ("gate", "router")  # MoE routing layers: kept in the model's dtype


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): w (N, K) as fp8 rows and their (N,) float32 scales."""
    scale = w.detach().abs().amax(dim=1).float().clamp(min=1e-12) / FP8_MAX
    q = (w.detach().float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) in a float dtype; weight (N, K) fp8 with (N,) scales -> (..., N)."""
    rows = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_activations(rows)
    # CUDA's row-wise scaled matmul writes bf16 only (torch refuses other output dtypes
    # with per-row scales): a float16 / float32 model's output is cast back from it
    out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale[None, :],
                           out_dtype=out_dtype).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def quantize_activations(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): rows (M, K) as fp8 rows and their (M, 1) float32 scales; one Triton
    kernel where it runs (fp8_rows.py: the PyTorch form below is six kernels and passes)."""
    if fused_available(rows):
        try:
            return quantize_rows_fused(rows, FP8)
        except torch.OutOfMemoryError:
            raise  # the request's problem, not the kernel's
        except Exception as exc:  # noqa: BLE001 - e.g. a Triton that cannot build it
            disable_fused(exc)
    scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           scale: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, or fp8_linear when the weight carries scales."""
    return F.linear(x, weight, bias) if scale is None else fp8_linear(x, weight, scale, bias)


class FP8Linear(nn.Module):
    """An nn.Linear whose weight is stored in fp8 with per-row scales."""

    def __init__(self, linear_layer: nn.Linear) -> None:
        super().__init__()
        q, scale = quantize_rows(linear_layer.weight)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.bias = linear_layer.bias
        self.in_features, self.out_features = linear_layer.in_features, linear_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3"


def quantizable(name: str, module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (weight is not None and weight.dim() == 2 and weight.dtype != FP8
            and name.rsplit(".", 1)[-1] not in ROUTER_NAMES
            and weight.shape[0] % KERNEL_MULTIPLE == 0 and weight.shape[1] % KERNEL_MULTIPLE == 0)


@torch.no_grad()
def quantize_layers(layers: list[nn.Module]) -> int:
    """Store the linear weights of `layers` in fp8 (see the module doc); returns how many
    weights were converted. A projection fused by fused_projections.py (slices sharing one
    weight) is converted once and its slices read the fp8 weight with its scales."""
    converted, shared = 0, {}
    for layer in layers:
        for parent_name, parent in layer.named_modules():
            for name, child in list(parent.named_children()):
                full = f"{parent_name}.{name}" if parent_name else name
                if type(child) is nn.Linear and quantizable(full, child):
                    setattr(parent, name, FP8Linear(child))
                    converted += 1
                elif hasattr(child, "leader") and quantizable(full, child):  # a slice
                    key = id(child.weight)
                    if key not in shared:
                        shared[key] = tuple(nn.Parameter(t, requires_grad=False)
                                            for t in quantize_rows(child.weight))
                        converted += 1
                    child.weight, child.weight_scale = shared[key]
    return converted
