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
    # a, c and d have equal lengths: one engine call, a and d in one DiT batch (speaker 0)
    codes = {"a": list(range(3, 40)), "b": [5, 9, 1, 63, 22] * 6, "c": list(range(3, 40)),
             "d": list(range(40, 3, -1))}
    speaker = {"a": 0, "b": 1, "c": 1, "d": 0}
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
    assert not torch.allclose(got["a"], got["d"])  # and the codes do: rows are not mixed up


def test_seed_and_batch_neighbours_do_not_change_an_utterance(engine):
    codes = [list(range(10, 22)), [0] * 12]
    alone = decode(engine, {"x": codes})["x"]
    together = decode(engine, {"x": codes, "y": [list(range(30, 42)), [1] * 12]})["x"]
    assert torch.equal(alone, together)  # another speaker: another DiT batch
    # the same speaker: one DiT batch of three rows, each from the noise it draws alone
    t2w, rows = engine.runner.t2w, []
    decode_rows = t2w.decode_rows

    def recorded(codes, *args, **kwargs):
        rows.append(codes.shape[0])
        return decode_rows(codes, *args, **kwargs)
    t2w.decode_rows = recorded
    try:
        batched = decode(engine, {"x": codes, "y": [list(range(30, 42)), [0] * 12],
                                  "z": [list(range(50, 62)), [0] * 12]})
    finally:
        del t2w.decode_rows
    assert rows == [3]
    torch.testing.assert_close(batched["x"], alone, atol=ATOL, rtol=0)
    assert not torch.allclose(batched["y"], batched["z"], atol=1e-3)


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


STREAMED = {"seed": 7, "first_chunk_frames": 3, "chunk_growth": 2, "chunk_frames": 8,
            "left_context": 4}


def windows(total: int) -> list[tuple[int, int, int]]:
    """(context start, chunk start, chunk end) of STREAMED's chunks: 3, 6, 8, 8, ... codes,
    each after up to 4 earlier ones."""
    out, start, k = [], 0, 0
    while start < total:
        end = min(start + min(3 * 2 ** k, 8), total)
        out.append((max(0, start - 4), start, end))
        start, k = end, k + 1
    return out


def test_streamed_codes_are_decoded_in_chunks_before_the_last_code(omni25_dir, composite):
    """The talker's codes arrive one a step (a stream edge): the first audio leaves after
    3 codes, long before the last; each chunk equals transformers' Token2Wav over its
    codes and 4 codes of left context (seeded), after the context's samples. Streamed is
    not the whole-utterance decode (no faithful windowed form exists: the module doc):
    the difference is printed, not bounded."""
    engine = GenerationEngine(build_runner(MODEL, model_dir=omni25_dir, device="cpu",
                                           dtype="auto", options=STREAMED))
    codes = [(7 * i + 3) % 64 for i in range(20)]
    engine.add(EngineRequest("s", {"stream": ["talker"]}, {}))
    pieces, first_at = [], None
    for i, code in enumerate(codes):
        engine.append("s", "talker", i, {"codes": [[code], [1]]}, i == len(codes) - 1)
        for o in engine.step():
            assert o.error is None, o.error
            if o.data.get("samples"):
                first_at = i + 1 if first_at is None else first_at
                pieces.append(o.data["audio"])
    while engine.has_work():
        pieces += [o.data["audio"] for o in engine.step() if o.data.get("samples")]
    assert first_at == 3  # codes in when the first audio left (of 20)
    spk = composite.speaker_map[list(composite.speaker_map)[1]]
    cond = {"conditioning": spk["cond"][None].float(), "reference_mel": spk["ref_mel"].float()}
    expected = []
    for ctx, start, end in windows(len(codes)):
        torch.manual_seed(7)
        wav = composite.token2wav(torch.tensor([codes[ctx:end]]), **cond)
        expected.append(wav[(start - ctx) * 480:])
    assert [p.numel() for p in pieces] == [e.numel() for e in expected]
    for piece, want in zip(pieces, expected, strict=True):
        audible(want)
        torch.testing.assert_close(piece, want, atol=ATOL, rtol=0)
    streamed = torch.cat(pieces)
    torch.manual_seed(7)
    with torch.no_grad():
        whole = composite.token2wav(torch.tensor([codes]), **cond)
    assert streamed.shape == whole.shape
    print(f"streamed vs whole-utterance decode: max |diff| "
          f"{float((streamed - whole).abs().max()):.3f} (peak {float(whole.abs().max()):.3f})")


def test_streaming_options_must_fit_the_dit(engine):
    from omni.engines.base import EngineLoadError
    from omni.models.qwen2_5_omni_token2wav import Token2WavRunner

    most = engine.runner.t2w.max_codes
    with pytest.raises(EngineLoadError, match="must fit the DiT"):
        Token2WavRunner(engine.runner.t2w, {"chunk_frames": most, "left_context": 1})
    whole = Token2WavRunner(engine.runner.t2w, {"left_context": 5})  # no chunk_frames: whole
    assert (whole.chunk_frames, whole.left_context) == (most, 0)
