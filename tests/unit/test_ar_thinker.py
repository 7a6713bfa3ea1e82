"""Qwen3-Omni's thinker through the AR engine (tiny random release-layout checkpoint):
batched greedy decoding equals the thinker run by transformers on its own."""

from __future__ import annotations

import numpy as np
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


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _audio_message(clip: np.ndarray, text: str) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"pcm_f32le": clip.tobytes(),
                                                "sample_rate": 16000}},
        {"type": "text", "text": text}]}]


def test_audio_input_matches_transformers_thinker(omni_dir):
    """A spoken question: the audio tower's output replaces the audio pads and the answer
    equals transformers' thinker generate given the same features (its own positions)."""
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    engine = AREngine(str(omni_dir), options={"export_hidden_layers": "auto"})
    assert engine.info()["input_audio_rate"] == 16000
    clips = {"a": _clip(1.3, 440.0), "b": _clip(2.6, 220.0)}
    for rid, clip in clips.items():
        engine.add(EngineRequest(rid, {"messages": _audio_message(clip, "What is this?")},
                                 {"temperature": 0, "max_tokens": 6, "ignore_eos": True}))
    got: dict[str, list[int]] = {}
    prompts: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            got.setdefault(o.request_id, []).extend(o.data["token_ids"])
            prompts.setdefault(o.request_id, o.data.get("prompt_token_ids"))
    config = AutoConfig.from_pretrained(str(omni_dir))
    config.enable_audio_output = False
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(omni_dir), config=config, dtype=torch.float32).thinker.eval()
    audio_id = config.thinker_config.audio_token_id
    for rid, clip in clips.items():
        ids = prompts[rid]
        feats = engine.lm.media.fe([clip], sampling_rate=16000, return_attention_mask=True,
                                   return_tensors="pt")
        assert ids.count(audio_id) > 10  # one pad per encoded audio frame, not one per clip
        ref = thinker.generate(input_ids=torch.tensor([ids]),
                               input_features=feats["input_features"],
                               feature_attention_mask=feats["attention_mask"],
                               max_new_tokens=6, do_sample=False, eos_token_id=None)
        assert got[rid] == ref[0, len(ids):].tolist(), rid


def test_image_parts_are_refused_clearly(omni_dir):
    engine = AREngine(str(omni_dir))
    engine.add(EngineRequest("i", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, {}))
    (out,) = engine.step()
    assert out.error and "'image_url' content parts are not supported" in out.error
