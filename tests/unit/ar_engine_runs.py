"""What the AR engine tests share (test_ar_engine.py, test_ar_engine_requests.py): the tiny
Qwen3 and Qwen3-MoE checkpoints, driving an engine to its outputs, and transformers' own
greedy answer to compare with."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from omni.engines.base import EngineRequest, StepOutput
from omni.fixtures import build_tiny_qwen3, build_tiny_qwen3_moe

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who",
           "One", "The quick brown fox jumps over the lazy dog and then runs far away into"]


@functools.cache
def _build(root: Path) -> dict[str, str]:
    # a larger init than transformers' default, so greedy answers vary (with 0.02 they
    # repeat one token, and a test of batching or positions could not fail)
    return {"qwen3": str(build_tiny_qwen3(root / "qwen3", initializer_range=0.5)),
            "qwen3_moe": str(build_tiny_qwen3_moe(root / "qwen3_moe", initializer_range=0.5))}


def model_dirs(tmp_path_factory) -> dict[str, str]:
    """name -> checkpoint directory, built once per session for all the modules that use it."""
    return _build(tmp_path_factory.getbasetemp() / "ar_engine_models")


def drain(engine, max_steps: int = 500) -> dict[str, list[StepOutput]]:
    outs: dict[str, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outs
        for o in engine.step():
            assert not outs.get(o.request_id) or not outs[o.request_id][-1].finished, o
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not finish")


def tokens(outs: list[StepOutput]) -> list[int]:
    return [t for o in outs for t in o.data["token_ids"]]


def text(outs: list[StepOutput]) -> str:
    return "".join(o.data["text"] for o in outs)


def run(engine, inputs, **params) -> list[StepOutput]:
    engine.add(EngineRequest("r", inputs, params))
    return drain(engine)["r"]


_REFERENCE: dict[str, object] = {}


def hf_greedy(engine, prompt: str, n: int) -> list[int]:
    """transformers' own generate() on its own copy of the model (sdpa attention)."""
    from transformers import AutoModelForCausalLM

    model_dir = engine.lm.model_dir
    if model_dir not in _REFERENCE:
        _REFERENCE[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = engine.lm.tokenizer(prompt)["input_ids"]
    ref = _REFERENCE[model_dir].generate(
        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False, max_new_tokens=n, min_new_tokens=n, temperature=None, top_p=None,
        top_k=None)
    return ref[0, len(ids):].tolist()


def greedy_batch(engine, prompts, n=12, **params) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        engine.add(EngineRequest(f"g{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": n, "ignore_eos": True, **params}))
    outs = drain(engine)
    return {rid: tokens(o) for rid, o in outs.items()}
