"""scripts/build_random_model.py: release layout, save_pretrained's tensor names, loadable."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from omni.models.hf_causal import load_causal_lm

torch.set_num_threads(1)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_random_model.py"


@pytest.fixture(scope="module")
def builder():
    spec = importlib.util.spec_from_file_location("build_random_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _on_disk(d: Path) -> dict[str, tuple[int, ...]]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            out.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
    return out


@pytest.mark.parametrize("shape", ["tiny", "tiny-moe"])
def test_builds_a_loadable_release_layout(builder, tmp_path, shape):
    out = tmp_path / shape
    # a small shard limit makes the MoE one sharded (index + several files)
    assert builder.main(["--shape", shape, "--out", str(out), "--device", "cpu",
                         "--shard-gb", "0.01" if shape == "tiny-moe" else "4"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 151936 and config["eos_token_id"] == 151645
    assert json.loads((out / "omni_fixture.json").read_text())["random_weights"] is True
    assert (out / "model.safetensors.index.json").is_file() == (shape == "tiny-moe")

    # the same names and shapes save_pretrained writes for this architecture
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)))
    model.save_pretrained(str(tmp_path / "reference"))
    assert _on_disk(out) == _on_disk(tmp_path / "reference")

    lm = load_causal_lm(str(out))  # refuses missing or mismatched keys
    assert lm.random_weights and lm.vocab_size == 151936
    tok = lm.tokenizer
    assert tok.convert_ids_to_tokens([151643, 151644, 151645]) == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(tok.decode([i]) for i in (300, 5000, 151642))  # every id decodes to text
    ids = tok.encode("The quick brown fox")
    assert tok.decode(ids) == "The quick brown fox"
    weights = dict(lm.model.named_parameters())
    norm = next(v for k, v in weights.items() if k.endswith("input_layernorm.weight"))
    assert torch.all(norm == 1)
    proj = next(v for k, v in weights.items() if k.endswith("q_proj.weight"))
    assert 0.015 < float(proj.float().std()) < 0.025
    logits = lm.model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()


def test_release_shapes(builder):
    """The published sizes: parameter counts of the real releases."""
    from transformers import AutoConfig

    expected = {"qwen3-1.7b": 1.72e9, "qwen3-8b": 8.19e9, "qwen3-30b-a3b": 30.53e9}
    for shape, params in expected.items():
        raw = {**builder.COMMON, **builder.SHAPES[shape]}
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        tensors = builder.disk_tensors(config, torch.bfloat16)
        assert sum(math.prod(s) for s in tensors.values()) == pytest.approx(params, rel=1e-3)
