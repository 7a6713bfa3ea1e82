"""The AR engine on CUDA: batched greedy equals transformers' generate, and decode steps
replayed from CUDA graphs give the same tokens as eager steps."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who", "One",
           "The quick brown fox jumps over the lazy dog and then runs far away into"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("cuda") / "qwen3"))


def _greedy(engine: AREngine, n: int = 16) -> dict[str, list[int]]:
    for i, p in enumerate(PROMPTS):
        engine.add(EngineRequest(f"g{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": n, "ignore_eos": True}))
    out: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            out.setdefault(o.request_id, []).extend(o.data["token_ids"])
    return out


def test_cuda_greedy_matches_generate_and_graphs_match_eager(model_dir):
    from transformers import AutoModelForCausalLM

    graphed = AREngine(model_dir, device="cuda", dtype="float32")
    eager = AREngine(model_dir, device="cuda", dtype="float32",
                     options={"cuda_graphs": False})
    got = _greedy(graphed)
    assert graphed.graphs is not None and graphed.graphs.replays > 0
    assert got == _greedy(eager)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    tok = graphed.lm.tokenizer
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([tok(p)["input_ids"]], device="cuda")
        want = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=16, min_new_tokens=16, temperature=None,
                            top_p=None, top_k=None)[0, ids.shape[1]:].tolist()
        assert got[f"g{i}"] == want, p
    assert graphed.stats()["kv_blocks_used"] == 1  # only the graphs' scratch block


def test_bf16_graphs_match_eager(model_dir):
    graphed = AREngine(model_dir, device="cuda", dtype="bfloat16")
    eager = AREngine(model_dir, device="cuda", dtype="bfloat16", options={"cuda_graphs": False})
    assert _greedy(graphed, 24) == _greedy(eager, 24)


def test_qwen3_omni_thinker_graphs_match_eager(tmp_path_factory):
    from omni.fixtures.tiny_omni import build_tiny_qwen3_omni

    omni_dir = str(build_tiny_qwen3_omni(tmp_path_factory.mktemp("omni") / "qwen3_omni"))
    graphed = AREngine(omni_dir, device="cuda", dtype="float32")
    eager = AREngine(omni_dir, device="cuda", dtype="float32", options={"cuda_graphs": False})
    assert _greedy(graphed, 12) == _greedy(eager, 12)
