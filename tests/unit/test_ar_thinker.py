"""Qwen3-Omni's thinker through the AR engine (tiny random release-layout checkpoint):
batched greedy decoding equals the thinker run by transformers on its own."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_omni import build_tiny_qwen3_omni

torch.set_num_threads(1)
PROMPTS = ["Hello world, this is", "Tell me a story about a robot who", "One"]


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return build_tiny_qwen3_omni(tmp_path_factory.mktemp("omni") / "qwen3_omni")


def _reference_greedy(model_dir, ids: list[int], n: int) -> list[int]:
    """The thinker alone (transformers' own attention), full forward per token."""
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir)
    config.enable_audio_output = False
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        model_dir, config=config, dtype=torch.float32).thinker.eval()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([seq])
            logits = thinker(input_ids=x, position_ids=torch.arange(len(seq))[None],
                             use_cache=False).logits
            seq.append(int(logits[0, -1].argmax()))
    return seq[len(ids):]


def test_thinker_batched_greedy_matches_transformers(omni_dir):
    engine = AREngine(str(omni_dir))
    assert engine.info()["vocab_size"] == engine.lm.config.vocab_size
    for i, p in enumerate(PROMPTS):
        engine.add(EngineRequest(f"t{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": 8, "ignore_eos": True}))
    got: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            got.setdefault(o.request_id, []).extend(o.data["token_ids"])
    for i, p in enumerate(PROMPTS):
        ids = engine.lm.tokenizer(p)["input_ids"]
        assert got[f"t{i}"] == _reference_greedy(str(omni_dir), ids, 8), p
    assert engine.stats()["kv_blocks_used"] == 0
