"""Reading one part of a combined release checkpoint: the tensors under a key prefix (a
Qwen3-Omni or Qwen2.5-Omni stage), and MoE experts stored one matrix per expert put in
transformers' fused in-memory layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from omni.engines.base import EngineLoadError

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Release layout (one gate/up/down matrix per expert) -> transformers' in-memory layout
    (experts.gate_up_proj (E, 2I, H), experts.down_proj (E, H, I))."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for key, value in tensors.items():
        m = _EXPERT.match(key)
        if m is None:
            out[key] = value
        else:
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = value
    for base, by_index in experts.items():
        ordered = [by_index[i] for i in range(len(by_index))]
        out[f"{base}.gate_up_proj"] = torch.stack([torch.cat((e["gate"], e["up"])) for e in ordered])
        out[f"{base}.down_proj"] = torch.stack([e["down"] for e in ordered])
    return out


def prefixed_tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a (sharded) checkpoint whose keys start with `prefix`, prefix
    stripped (one stage of a combined Qwen3-Omni checkpoint)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise EngineLoadError(f"{path}: unreadable {index.name}: {e}") from e
        files: dict[str, list[str]] = {}
        for key, fname in weight_map.items():
            if key.startswith(prefix):
                files.setdefault(fname, []).append(key)
    elif (path / "model.safetensors").is_file():
        files = {"model.safetensors": []}  # filter below
    else:
        raise EngineLoadError(f"{path}: no model.safetensors or model.safetensors.index.json")
    out: dict[str, torch.Tensor] = {}
    for fname, keys in files.items():
        f = path / fname
        if not f.is_file():
            raise EngineLoadError(f"{path}: weight shard {fname} is missing")
        with safe_open(str(f), framework="pt") as st:
            for key in keys or [k for k in st.keys() if k.startswith(prefix)]:
                out[key[len(prefix):]] = st.get_tensor(key)
    if not out:
        raise EngineLoadError(f"{path}: the checkpoint has no '{prefix}*' tensors")
    return out
