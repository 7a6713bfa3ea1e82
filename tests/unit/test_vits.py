"""The VITS (transformers VitsModel) adapter on the tiny random-weight fixture: loading,
sentence splitting, batched synthesis equal to one-by-one, and the engine sharing calls."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni.engines.base import EngineLoadError, EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.fixtures import FIXTURE_MARKER
from omni.fixtures.tiny_vits import build_tiny_vits
from omni.models import build_runner
from omni.models.vits import VitsRunner, load_vits

torch.set_num_threads(1)

QUIET = {"noise_scale": 0.0, "noise_scale_duration": 0.0}  # deterministic audio
SENTENCES = ["Hello world, this is a tiny test.", "One.",
             "A somewhat longer sentence, with more words in it."]


@pytest.fixture(scope="module")
def vits_dir(tmp_path_factory):
    return build_tiny_vits(tmp_path_factory.mktemp("models") / "tiny-vits")


@pytest.fixture(scope="module")
def tts(vits_dir):
    return load_vits(vits_dir, options=QUIET)


def _drain(engine):
    outputs: dict[str, list] = {}
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_release_files_and_loaded_weights(vits_dir, tts):
    for name in ("config.json", "model.safetensors", "vocab.json", "tokenizer_config.json"):
        assert (vits_dir / name).is_file(), name
    marker = json.loads((vits_dir / FIXTURE_MARKER).read_text())
    assert marker["random_weights"] is True and marker["builder"] == "vits"
    saved = load_file(str(vits_dir / "model.safetensors"))
    state = tts.model.state_dict()
    assert set(saved) <= set(state)
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert not tts.model.training
    info = tts.info()
    assert info["model"] == "vits" and info["random_weights"] is True
    assert info["sample_rate"] == 16000 and info["hop_length"] == 256
    assert info["voices"] == [{"id": "tiny-vits", "name": "tiny-vits", "language": "en",
                               "sample_rate": 16000}]
    assert info["openai_voice_alias"] is None and info["noise_scale"] == 0.0


def test_options_voice_id_language_openai_alias(vits_dir):
    info = load_vits(vits_dir, options={"voice_id": "v1", "language": "fr",
                                        "openai_voices": True}).info()
    assert info["voices"][0]["id"] == "v1" and info["voices"][0]["language"] == "fr"
    assert info["openai_voice_alias"] == "v1"
    with pytest.raises(EngineLoadError, match="max_chars"):
        load_vits(vits_dir, options={"max_chars": 3})
    with pytest.raises(EngineLoadError, match="noise_scale"):
        load_vits(vits_dir, options={"noise_scale": -1})


def test_loader_refuses_bad_dirs(vits_dir, tmp_path):
    with pytest.raises(EngineLoadError, match="needs a model_dir"):
        build_runner("vits", model_dir=None, device="cpu", dtype="auto", options={})
    with pytest.raises(EngineLoadError, match="not a directory"):
        load_vits(tmp_path / "absent")
    with pytest.raises(EngineLoadError, match="config.json"):
        load_vits(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(vits_dir, bad)
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(EngineLoadError, match="cannot load the model"):
        load_vits(bad)
    tensors = load_file(str(vits_dir / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("decoder.")},
              str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EngineLoadError, match="lacks weights"):
        load_vits(bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(EngineLoadError, match="not 'vits'"):
        load_vits(bad)
    with pytest.raises(EngineLoadError, match="dtype"):
        load_vits(vits_dir, dtype="int3")


def test_sentences(tts):
    units = tts.sentences(" ".join(SENTENCES))
    assert len(units) == 3
    assert tts.sentences(SENTENCES) == units
    assert len(units[0]) == 2 * len(SENTENCES[0]) + 1  # a blank between characters
    # "???" is a sentence with nothing the vocabulary knows: dropped, not sent as empty
    assert tts.sentences("Hi. ??? Bye.") == tts.sentences("Hi. Bye.")
    assert len(tts.sentences("Hi. Bye.")) == 2
    long = tts.sentences("word " * 200)
    assert len(long) > 1 and all(len(u) <= 2 * 400 + 1 for u in long)


def test_batch_equals_one_by_one(tts):
    units = tts.sentences(SENTENCES)
    assert len({len(u) for u in units}) == 3  # padding is exercised
    batched = tts.synthesize(units)
    for unit, (audio, n_ids) in zip(units, batched, strict=True):
        (alone, alone_ids), = tts.synthesize([unit])
        assert n_ids == alone_ids == len(unit)
        assert audio.shape == alone.shape and audio.dtype == torch.float32
        assert torch.allclose(audio, alone, atol=1e-4)
    seconds = [a.numel() / 16000 for a, _ in batched]
    assert all(0.2 < s < 5 for s in seconds)  # the fixture's durations are sane


def test_speed_changes_length(tts):
    unit = tts.sentences(SENTENCES[0])
    normal = tts.synthesize(unit, 1.0)[0][0].numel()
    assert tts.synthesize(unit, 2.0)[0][0].numel() < 0.8 * normal
    assert tts.synthesize(unit, 0.5)[0][0].numel() > 1.2 * normal


def test_seed_makes_noisy_audio_repeatable(vits_dir):
    runner = VitsRunner(load_vits(vits_dir))  # the config's noise
    units = runner.tts.sentences(SENTENCES[:2])
    a = runner.run_items(units, [{"seed": 7}, {}])
    b = runner.run_items(units, [{"seed": 7}, {}])
    assert torch.equal(a[0][0], b[0][0])
    assert a[1][0].shape != b[1][0].shape or not torch.equal(a[1][0], b[1][0])


def test_bad_params_and_text(tts):
    runner = VitsRunner(tts)
    for params, match in (({"speed": 0.1}, "speed"), ({"speed": "2"}, "speed"),
                          ({"voice": "alloy"}, "unknown voice 'alloy'"),
                          ({"seed": -1}, "seed"), ({"seed": True}, "seed")):
        with pytest.raises(ValueError, match=match):
            runner.split("Hi.", params)
    for text in ("", "   ", [], ["", " "], "!!! ???"):
        with pytest.raises(ValueError, match="nothing to synthesize"):
            runner.split(text, {})
    with pytest.raises(ValueError, match="string or a list"):
        runner.split([1, 2], {})
    assert runner.split("Hi.", {"voice": "tiny-vits", "speed": 4, "seed": 3})


def test_engine_batches_concurrent_requests(tts):
    engine = GenerationEngine(VitsRunner(tts, batch=True))
    engine.add(EngineRequest("a", {"text": "One. Two."}, {"speed": 1.0}))
    engine.add(EngineRequest("b", {"text": "Three, four."}, {}))
    engine.add(EngineRequest("c", {"text": "Five."}, {"speed": 2.0}))
    engine.add(EngineRequest("bad", {"text": "Six."}, {"voice": "nope"}))
    outputs = _drain(engine)
    assert [o.data["index"] for o in outputs["a"]] == [0, 1] and outputs["a"][-1].finished
    assert outputs["b"][-1].finished and outputs["c"][-1].finished
    assert "unknown voice" in outputs["bad"][-1].error
    # step 1: a + b (speed 1) in one call, c (speed 2) in another; step 2: a's 2nd sentence
    assert engine.stats()["max_batch"] == 2 and engine.stats()["calls"] == 3
    first = outputs["a"][0].data
    audio = first["audio"]
    assert audio.dtype == torch.float32 and audio.dim() == 1
    assert float(audio.abs().max()) <= 1.0
    assert first["sample_rate"] == 16000 and first["samples"] == audio.numel() > 0
    assert first["input_tokens"] == 2 * len("One.") + 1
    assert first["output_tokens"] == first["samples"] // 256
    # the batched output equals the sentence run alone
    alone = tts.synthesize(tts.sentences("Three, four."))[0][0]
    assert torch.allclose(outputs["b"][0].data["audio"], alone, atol=1e-4)
