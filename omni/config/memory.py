"""Per-stage memory budgets given as a share of the device: `memory: 60%`.

A budget in bytes (`memory: 40GiB`) fits one GPU size; a share fits any: the engine
process turns it into bytes of the GPU it runs on. On CPU a share is ignored (the stage
keeps its CPU defaults, e.g. an AR stage's kv_cache_mb: taking 60% of the host's RAM up
front would not be a safe default). Stages that share a device declare their shares so that none of
them sizes its cache from "what is free" (which depends on who started first), and the
config check refuses shares that add up to more than the device on any one device.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from omni.config.checks import ConfigError

_SHARE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*$")
SHARE_FIX = "Use a percentage above 0 and at most 100, e.g. '60%'"


def parse_share(src: str, path: str, value: object) -> float | None:
    """0 < share <= 1 from '60%'; None when the value is not a percentage at all."""
    match = _SHARE_RE.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    share = float(match.group(1)) / 100
    if not 0 < share <= 1:
        raise ConfigError(src, path, f"memory share {value!r} is out of range", SHARE_FIX)
    return share


def check_shares(src: str, stages: Iterable[Any]) -> None:
    """The shares of the replicas placed on one device must not add up past 100%."""
    total: dict[str, float] = defaultdict(float)
    names: dict[str, list[str]] = defaultdict(list)
    for stage in stages:
        if stage.memory_share is None:
            continue
        for i in range(stage.replicas):
            device = stage.devices[i % len(stage.devices)]
            if device == "cpu":  # ignored there (see the module doc)
                continue
            device = "cuda:0" if device in ("auto", "cuda") else device
            total[device] += stage.memory_share
            names[device].append(stage.name)
    for device, share in total.items():
        if share > 1 + 1e-9:
            raise ConfigError(src, "stages", f"memory shares on device '{device}' add up to "
                              f"{share:.0%} ({', '.join(names[device])}; 'auto' and 'cuda' "
                              "count as cuda:0)",
                              "Lower the stages' memory percentages, or place some stages "
                              "on another device")


def gpu_total_bytes(device: str) -> int:
    """The memory of a resolved CUDA device ('cuda', 'cuda:N')."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def budget_bytes(memory: int | None, share: float | None, device: str) -> int | None:
    """The stage's budget in bytes on a resolved device: its bytes, else its share of the
    GPU; None (no budget) for a share on CPU."""
    if memory is not None or share is None or not device.startswith("cuda"):
        return memory
    return int(gpu_total_bytes(device) * share)


AR_ADVICE = ("the budget buys the weights, the decode graphs, the largest warm-up step and "
             "the KV cache (the first three measured at load); what else the model holds "
             "(e.g. a model adapter's own graphs or buffers) comes on top. Leave that much free "
             "beside it, or lower max_num_seqs, max_graph_context or max_batched_tokens")


def over_budget(stage: str, used: int | None, budget: int | None,
                advice: str | None = None) -> str | None:
    """What to tell the operator when a stage holds more device memory after loading
    than its budget (None when it fits or has no budget). An AR stage counts its decode
    graphs and its largest warm-up step inside the budget (omni/engines/ar/budget.py); before
    it did, they came on top: about 1 GiB of graphs per AR stage in the H200 runs of
    bench/results/archive/omni-h200-c32-stream.md."""
    if not used or not budget or used <= budget:
        return None
    gib = 2 ** 30
    return (f"stage '{stage}' holds {used / gib:.2f} GiB of device memory after loading, "
            f"{(used - budget) / gib:.2f} GiB over its budget of {budget / gib:.2f} GiB: "
            f"{advice or AR_ADVICE}")


def memory_note(info: dict[str, Any]) -> str:
    """What the READY log line says of a replica's device memory: what it reserved and,
    for an AR stage, what of it its decode graphs and its warm-up step's peak take."""
    gib = 2 ** 30
    parts = []
    if isinstance(info.get("cuda_bytes"), int) and info["cuda_bytes"]:
        parts.append(f"{info['cuda_bytes'] / gib:.2f} GiB reserved")
    if isinstance(info.get("graph_bytes"), int) and info["graph_bytes"]:
        parts.append(f"decode graphs {info['graph_bytes'] / gib:.2f} GiB")
    if isinstance(info.get("runtime_bytes"), int) and info["runtime_bytes"]:
        parts.append(f"graphs + largest step {info['runtime_bytes'] / gib:.2f} GiB "
                     "counted in its budget")
    if isinstance(info.get("full_context_sequences"), int):
        parts.append(f"KV cache {info['kv_tokens']} tokens: {info['full_context_sequences']} "
                     f"sequences of the full {info['max_context']}-token context "
                     f"(max_num_seqs {info['max_num_seqs']})")
    if info.get("quantization"):  # omni/engines/quantization/
        parts.append(f"{info['quantization']} weights: {info.get('quantized_weights', 0)} "
                     "linear layers")
    if info.get("load_format") == "dummy":  # omni/models/dummy_weights.py
        parts.append("RANDOM weights (load_format dummy): outputs are noise")
    return "; " + ", ".join(parts) if parts else ""
