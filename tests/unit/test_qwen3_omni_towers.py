"""Qwen3-Omni's thinker encodes the media of all prompts waiting together in one audio
tower call and one vision tower call (omni/models/qwen_vision_batch.py), and each prompt
gets the features, hence the answer, it gets alone."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest

torch.set_num_threads(1)
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def omni_dir(models):
    return models("qwen3_omni")


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _prompt(*parts: dict) -> dict:
    return {"messages": [{"role": "user", "content": [
        *parts, {"type": "text", "text": "What is this?"}]}]}


def _audio(clip: np.ndarray | bytes) -> dict:
    pcm = clip if isinstance(clip, bytes) else clip.tobytes()
    return {"type": "input_audio", "input_audio": {"pcm_f32le": pcm, "sample_rate": 16000}}


def _image(data: bytes) -> dict:
    return {"type": "image", "image": {"data": data}}


def _steps(engine: AREngine, requests: dict[str, dict]) -> tuple[dict, dict, dict]:
    """(tokens, prompt ids, failed output) per request."""
    for rid, inputs in requests.items():
        engine.add(EngineRequest(rid, inputs, dict(GREEDY)))
    got: dict[str, list[int]] = {}
    ids: dict[str, list[int]] = {}
    errors: dict[str, object] = {}
    while engine.has_work():
        for o in engine.step():
            if o.error:
                errors[o.request_id] = o
                continue
            got.setdefault(o.request_id, []).extend(o.data["token_ids"])
            ids.setdefault(o.request_id, o.data.get("prompt_token_ids"))
    return got, ids, errors


def _module(thinker: torch.nn.Module, name: str) -> torch.nn.Module:
    return next(m for n, m in thinker.named_modules() if n.split(".")[-1] == name)


def _mp4(seconds: float, fps: int, seed: int) -> bytes:
    from omni.media.video import encode_mp4

    rng = np.random.default_rng(seed)
    return encode_mp4((rng.random((int(seconds * fps), 48, 64, 3)) * 255).astype("uint8"), fps)


def test_prompts_waiting_together_share_one_tower_call_per_kind(omni_dir):
    """Audio clips, images and a video of six prompts that wait together: ONE audio tower
    call, ONE vision tower call (forward hooks on the real modules); the answers differ,
    each equals the prompt's answer alone and (audio / image prompts) the thinker's own
    generate; a bad image and a bad clip fail their prompts alone, naming the part."""
    a, b = _png(64, 64, 1), _png(96, 32, 2)
    clips = [_clip(1.3, 440.0), _clip(2.6, 220.0), _clip(1.7, 330.0)]
    requests = {"a1": _prompt(_audio(clips[0])), "a2": _prompt(_audio(clips[1])),
                "mix": _prompt(_image(a), _audio(clips[2])), "two": _prompt(_image(a), _image(b)),
                "video": _prompt({"type": "video", "video": {"data": _mp4(2, 4, 5)}}),
                "bad": _prompt(_audio(clips[0]), _image(b"not a picture")),
                "badclip": _prompt(_audio(b"\0" * 6))}
    engine = AREngine(omni_dir, options={"export_hidden_layers": "auto"})  # prompt ids out
    thinker = engine.lm.media.thinker
    grids, calls = [], []
    hooks = [_module(thinker, "visual").register_forward_hook(
                 lambda m, args, kw, out: grids.append(len(kw["grid_thw"])), with_kwargs=True),
             _module(thinker, "audio_tower").register_forward_hook(
                 lambda m, args, out: calls.append(1))]
    try:
        together, ids, errors = _steps(engine, requests)
        assert engine._encoder.batches[-1] == len(requests)
        assert grids == [3] and calls == [1]  # images a, b (a once) and the video; clips
        alone = {rid: _steps(engine, {rid: requests[rid]})[0][rid] for rid in together}
    finally:
        for hook in hooks:
            hook.remove()
    assert set(errors) == {"bad", "badclip"}
    assert errors["bad"].error_field == "messages[0].content[1]"
    assert "not an image this server can read" in errors["bad"].error
    assert errors["badclip"].error_field == "messages[0].content[0]"
    assert "float32 samples" in errors["badclip"].error
    assert len({tuple(v) for v in together.values()}) == 5  # the answers vary with the media
    assert together == alone
    reference = _reference_thinker(omni_dir)
    for rid, images, clip in (("a1", [], clips[0]), ("a2", [], clips[1]),
                              ("mix", [a], clips[2]), ("two", [a, b], None)):
        ref = _generate(engine, reference, ids[rid], images, clip)
        assert together[rid] == ref, rid


def _reference_thinker(omni_dir: str):
    """The thinker as transformers runs it on its own (its own attention)."""
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    config = AutoConfig.from_pretrained(omni_dir)
    config.enable_audio_output = False
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        omni_dir, config=config, dtype=torch.float32).thinker.eval()


def _generate(engine: AREngine, thinker, ids: list[int], images: list[bytes],
              clip: np.ndarray | None) -> list[int]:
    """The thinker's own generate on the release processors' inputs (30 s mel window)."""
    from PIL import Image

    media, inputs = engine.lm.media, {}
    if images:
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in images]
        inputs.update(media.images(images=pil, return_tensors="pt"))
    if clip is not None:
        feats = media.fe([clip], sampling_rate=16000, return_attention_mask=True,
                         return_tensors="pt")
        inputs.update(input_features=feats["input_features"],
                      feature_attention_mask=feats["attention_mask"])
    x = torch.tensor([ids])
    out = thinker.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=6,
                           do_sample=False, eos_token_id=None, **inputs)
    return out[0, len(ids):].tolist()


def test_packed_clips_get_their_own_features(omni_dir):
    """The tower pads every chunk to the call's longest and its convolutions' edges see
    that padding once their biases are non-zero (a release's are; the fixture's start at
    zero): packed naively, a clip shorter than one chunk changes. Grouped by length, every
    clip gets exactly its features alone, in one call per group."""
    from omni.models.qwen3_omni_thinker import load_thinker
    from omni.models.qwen_vision_batch import padded_mels

    media = load_thinker(Path(omni_dir), dtype="float32", device="cpu").media
    tower = _module(media.thinker, "audio_tower")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for conv in (tower.conv2d1, tower.conv2d2, tower.conv2d3):
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=gen) * 0.5)
    clips = [_clip(0.7, 300.0), _clip(3.1, 200.0), _clip(0.45, 500.0), _clip(1.9, 250.0),
             _clip(0.7, 600.0)]
    alone = [media._audio([c])[0]["embeds"] for c in clips]
    feats = padded_mels(media.fe, clips[:2])
    with torch.inference_mode():
        naive = media.thinker.get_audio_features(feats["input_features"],
                                                 feats["attention_mask"]).last_hidden_state
    assert (naive[:len(alone[0])] - alone[0]).abs().max() > 1e-6  # the edge effect is real
    calls = []
    hook = tower.register_forward_hook(lambda m, args, out: calls.append(1))
    try:
        packed = media._audio(clips)
    finally:
        hook.remove()
    assert len(calls) == 3  # clips of a chunk or more; the two 0.7 s clips; the 0.45 s one
    for got, want in zip(packed, alone, strict=True):
        torch.testing.assert_close(got["embeds"], want, rtol=0, atol=1e-6)
