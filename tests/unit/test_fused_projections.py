"""Fused sibling projections (omni/engines/ar/fused_projections.py): q/k/v and gate/up of a
transformers decoder layer run as one matmul, and the model computes what it did before,
eagerly and under torch.compile (one traced graph for all layers, fused path taken)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from omni.engines.ar import fused_projections as fp
from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3, build_tiny_qwen3_moe

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    return {"dense": str(build_tiny_qwen3(root / "qwen3", initializer_range=0.5)),
            "moe": str(build_tiny_qwen3_moe(root / "moe", initializer_range=0.5))}


def load(path: str) -> nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("kind, groups_per_layer", [("dense", 2), ("moe", 1)])
@torch.no_grad()
def test_fused_model_computes_the_same_logits(dirs, kind, groups_per_layer):
    model = load(dirs[kind])
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    before = model(ids).logits
    assert fp.fuse_projections(model) == groups_per_layer * model.config.num_hidden_layers
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, fp.ProjectionSlice)
    assert attn.q_proj.weight is attn.v_proj.weight  # one tensor, no copies
    torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    assert not fp._STASH  # no activation held after the forward


@torch.no_grad()
def test_siblings_are_right_in_any_order_and_for_other_inputs():
    torch.manual_seed(0)
    holder = nn.Module()
    holder.q_proj, holder.k_proj, holder.v_proj = (nn.Linear(8, n, bias=True) for n in (8, 4, 4))
    x, other = torch.randn(3, 8), torch.randn(3, 8)
    want = {n: getattr(holder, n)(x) for n in ("q_proj", "k_proj", "v_proj")}
    want_other = holder.v_proj(other)
    assert fp.fuse_projections(holder) == 1
    torch.testing.assert_close(holder.k_proj(x), want["k_proj"])  # before the leader
    torch.testing.assert_close(holder.q_proj(x), want["q_proj"])
    torch.testing.assert_close(holder.v_proj(other), want_other)  # another input
    torch.testing.assert_close(holder.q_proj(x), want["q_proj"])
    torch.testing.assert_close(holder.k_proj(x), want["k_proj"])
    torch.testing.assert_close(holder.v_proj(x), want["v_proj"])
    assert not fp._STASH


def test_groups_that_cannot_share_a_matmul_are_left_alone():
    holder = nn.Module()
    # an encoder's attention with a k_proj without bias, beside biased q and v
    holder.q_proj, holder.v_proj = nn.Linear(8, 8), nn.Linear(8, 8)
    holder.k_proj = nn.Linear(8, 8, bias=False)
    holder.gate_proj, holder.up_proj = nn.Linear(8, 16), nn.Linear(4, 16)  # widths differ
    assert fp.fuse_projections(holder) == 0
    assert type(holder.q_proj) is nn.Linear and type(holder.gate_proj) is nn.Linear


def test_compiled_layer_traces_once_and_takes_the_fused_path(dirs):
    """What DecodeGraphs relies on: one graph for every layer, one linear per group."""
    model = load(dirs["dense"])
    fp.fuse_projections(model)
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    hidden = torch.randn(1, 5, model.config.hidden_size)
    rotary = model.model.rotary_emb(hidden, torch.arange(5)[None])
    with torch.no_grad():
        for layer in model.model.layers:
            compiled = torch.compile(layer.forward, backend=backend, fullgraph=True)
            got = compiled(hidden, position_embeddings=rotary, attention_mask=None)
            want = layer(hidden, position_embeddings=rotary, attention_mask=None)
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    assert len(graphs) == 1
    linears = [n for n in graphs[0].graph.nodes if n.target is torch._C._nn.linear]
    assert len(linears) == 4  # qkv, o, gate_up, down


def test_engine_fuses_by_default_and_option_turns_it_off(dirs):
    params = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    tokens = {}
    for fuse in (True, False):
        engine = AREngine(dirs["dense"], options={"fuse_projections": fuse})
        attn = engine.lm.model.model.layers[0].self_attn
        assert isinstance(attn.q_proj, fp.ProjectionSlice) is fuse
        engine.add(EngineRequest("r", {"prompt": "Hello there, how"}, params))
        out = []
        while engine.has_work():
            out += [t for o in engine.step() for t in o.data.get("token_ids", [])]
        tokens[fuse] = out
    assert len(tokens[True]) == 12 and tokens[True] == tokens[False]
