"""Whisper in the Hugging Face layout (tiny random multilingual release-layout checkpoint)
through the generation engine: clips of concurrent requests go through one generate()
call, and each transcript equals WhisperForConditionalGeneration.generate's for its clip
alone (language detected, or given)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_runner
from omni.models.whisper import SAMPLE_RATE

torch.set_num_threads(1)
MAX_NEW = 10


def tone(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.2 * rng.standard_normal(int(SAMPLE_RATE * seconds))).astype(np.float32)


CLIPS = {"a": tone(1.5, 440), "b": noise(2.0, 0), "c": tone(3.2, 220)}


def pcm(clip: np.ndarray) -> dict:
    return {"pcm_s16le": (clip * 32767).astype("<i2").tobytes(), "sample_rate": SAMPLE_RATE}


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory) -> str:
    return str(ensure_tiny_model("whisper_hf", tmp_path_factory.getbasetemp() / "models"))


@pytest.fixture(scope="module")
def runner(whisper_dir):
    # model "whisper" on a transformers directory picks this runner too
    return build_runner("whisper", model_dir=whisper_dir, device="cpu", dtype="auto",
                        options={"max_new_tokens": MAX_NEW})


def reference(whisper_dir: str, clip: np.ndarray, max_new_tokens: int | None = MAX_NEW,
              **kwargs) -> str:
    """transformers alone: its feature extractor, generate, decode (max_new_tokens None:
    the generation config's max_length)."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval()
    feats = WhisperFeatureExtractor.from_pretrained(whisper_dir)(
        clip, sampling_rate=SAMPLE_RATE, return_tensors="pt")
    ids = model.generate(feats["input_features"], task="transcribe",
                         max_new_tokens=max_new_tokens, **kwargs)
    return AutoTokenizer.from_pretrained(whisper_dir).decode(ids[0], skip_special_tokens=True)


def transcribe(runner, requests: dict[str, tuple[np.ndarray, dict]]) -> tuple[dict, dict]:
    engine = GenerationEngine(runner)
    for rid, (clip, params) in requests.items():
        engine.add(EngineRequest(rid, {"audio": pcm(clip)}, params))
    results, errors = {}, {}
    while engine.has_work():
        for o in engine.step():
            if o.error is not None:
                errors[o.request_id] = o.error
            elif o.data:
                results[o.request_id] = o.data
    return results, errors, engine.stats()


def test_batched_transcripts_equal_transformers_generate(runner, whisper_dir):
    assert runner.info()["task"] == "transcription" and "de" in runner.info()["languages"]
    requests = {rid: (clip, {}) for rid, clip in CLIPS.items()}
    requests["de"] = (CLIPS["b"], {"language": "de"})
    got, errors, stats = transcribe(runner, requests)
    assert not errors
    texts = {rid: r["text"] for rid, r in got.items()}
    # the fixture varies: clips differ in what is heard, with several distinct words
    assert len({texts["a"], texts["b"], texts["c"]}) == 3
    assert max(len(set(t.split())) for t in texts.values()) >= 3
    assert stats["calls"] == 2 and stats["max_batch"] == 3  # auto-language ones together
    for rid, clip in CLIPS.items():
        assert got[rid]["text"] == reference(whisper_dir, (clip * 32767).astype("<i2")
                                             / 32768.0).strip(), rid
    want_de = reference(whisper_dir, (CLIPS["b"] * 32767).astype("<i2") / 32768.0,
                        language="de")
    assert got["de"]["text"] == want_de.strip() and got["de"]["language"] == "de"
    assert got["de"]["language_name"] == "german" and got["a"]["duration"] == 1.5


def test_bad_requests_fail_alone(runner):
    got, errors, _ = transcribe(runner, {
        "xx": (CLIPS["a"], {"language": "xx"}),
        "words": (CLIPS["a"], {"word_timestamps": True}),
        "ok": (CLIPS["a"], {})})
    assert "not 'xx'" in errors["xx"] and "word timestamps" in errors["words"]
    assert got["ok"]["text"]
