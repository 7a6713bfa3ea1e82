"""Qwen2.5-Omni's token2wav (DiT flow matching + BigVGAN) through the generation engine
(tiny random release checkpoint): for the same codes, speaker and seed its audio equals
transformers' Token2Wav, after checking the audio is not silence. (The whole chain against
transformers' composite generate: tests/http/test_omni25_chat.py.)"""

from __future__ import annotations

import pytest
import torch

from omni.engines.base import EngineRequest
from omni.engines.generation.engine import GenerationEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_runner

torch.set_num_threads(1)
MODEL = "qwen2_5_omni_token2wav"
# float32 on one CPU, the same ops in the same order: the audio is expected bit-equal;
# the bound allows for a different BLAS path, far below the signal (peaks ~0.5)
ATOL = 1e-5


@pytest.fixture(scope="module")
def omni25_dir():
    return str(ensure_tiny_model("qwen2_5_omni"))


@pytest.fixture(scope="module")
def engine(omni25_dir):
    runner = build_runner(MODEL, model_dir=omni25_dir, device="cpu", dtype="auto",
                          options={"seed": 7})
    return GenerationEngine(runner)


@pytest.fixture(scope="module")
def composite(omni25_dir):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir, dtype=torch.float32)


def decode(engine, requests: dict[str, list[list[int]]]) -> dict[str, torch.Tensor]:
    for rid, codes in requests.items():
        engine.add(EngineRequest(rid, {"codes": codes}, {}))
    out: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            if o.data.get("samples"):
                out[o.request_id].append(o.data["audio"])
    return {rid: torch.cat(chunks) for rid, chunks in out.items()}


def audible(wav: torch.Tensor) -> None:
    assert wav.abs().max() > 0.05 and wav.std() > 0.01  # not silence
    assert (wav.abs() >= 1.0).float().mean() < 0.05  # nor clipped throughout


def test_audio_equals_transformers_token2wav(engine, composite):
    codes = {"a": list(range(3, 40)), "b": [5, 9, 1, 63, 22] * 6, "c": list(range(3, 40))}
    speaker = {"a": 0, "b": 1, "c": 1}
    got = decode(engine, {r: [c, [speaker[r]] * len(c)] for r, c in codes.items()})
    names = list(composite.speaker_map)
    for rid, c in codes.items():
        spk = composite.speaker_map[names[speaker[rid]]]
        torch.manual_seed(7)
        ref = composite.token2wav(torch.tensor([c]), conditioning=spk["cond"][None].float(),
                                  reference_mel=spk["ref_mel"].float())
        audible(got[rid])
        assert got[rid].shape == ref.shape == (len(c) * 480,)
        torch.testing.assert_close(got[rid], ref, atol=ATOL, rtol=0)
    assert not torch.allclose(got["a"], got["c"])  # the speaker conditions the audio


def test_seed_and_batch_neighbours_do_not_change_an_utterance(engine):
    codes = [list(range(10, 22)), [0] * 12]
    alone = decode(engine, {"x": codes})["x"]
    together = decode(engine, {"x": codes, "y": [list(range(30, 42)), [1] * 12]})["x"]
    assert torch.equal(alone, together)


def test_bad_codes_are_refused_clearly(engine):
    engine.add(EngineRequest("r", {"codes": [[1, 2, 999], [0, 0, 0]]}, {}))
    engine.add(EngineRequest("s", {"codes": [[1, 2], [0, 5]]}, {}))
    engine.add(EngineRequest("t", {"codes": [[1, 2], [0]]}, {}))
    errors = {}
    while engine.has_work():
        errors |= {o.request_id: o.error for o in engine.step() if o.error}
    assert "out of range" in errors["r"] and "speaker" in errors["s"]
    assert "differ in length" in errors["t"]


@pytest.mark.parametrize(("option", "value"), [("num_steps", 0), ("seed", 1.5),
                                               ("guidance_scale", "high")])
def test_bad_options_fail_the_load_naming_them(engine, option, value):
    from omni.engines.base import EngineLoadError
    from omni.models.qwen2_5_omni_token2wav import Token2WavRunner

    with pytest.raises(EngineLoadError, match=f"option {option} must be"):
        Token2WavRunner(engine.runner.t2w, {option: value})


def test_full_delivery_ends_with_the_talkers_closing_output(engine):
    """A full edge hands over every talker output, the last one its stop code's, with no
    frame: the utterance is the frames before it, and an answer the talker ended at once
    is no audio, not an error."""
    frames = [{"codes": [[c], [0]]} for c in range(3, 15)]
    closing = {"token_ids": [66], "finish_reason": "stop"}
    engine.add(EngineRequest("f", {"talker": [*frames, closing]}, {}))
    engine.add(EngineRequest("e", {"talker": [closing]}, {}))
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert all(o.error is None for o in outs), [o.error for o in outs]
    got = {o.request_id: o.data.get("samples", 0) for o in outs if o.finished}
    assert got == {"f": 12 * 480, "e": 0}
