"""Qwen2.5-Omni's thinker through the AR engine (tiny random release-layout checkpoint):
batched greedy answers to text, audio, image and video prompts equal transformers' own
thinker.generate, and the exported rows are what its talker reads (the embedding and the
last layer of every fed position)."""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
import pytest
import torch
from unit.omni25_reference import mp4_with_track, video_inputs

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)
PROMPTS = ["Hello world, this is", "Tell me a story about a robot who", "One"]
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def omni25_dir():
    return ensure_tiny_model("qwen2_5_omni")


@pytest.fixture(scope="module")
def engine(omni25_dir):
    return AREngine(str(omni25_dir), options={"export_hidden_layers": "auto"})


@pytest.fixture(scope="module")
def reference(omni25_dir):
    """transformers' thinker, loaded its own way (the composite class, thinker only)."""
    from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration

    config = AutoConfig.from_pretrained(str(omni25_dir))
    config.enable_audio_output = False
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(
        str(omni25_dir), config=config, dtype=torch.float32).thinker.eval()


def _run(engine: AREngine, requests: dict[str, dict]) -> tuple[dict, dict]:
    for rid, inputs in requests.items():
        engine.add(EngineRequest(rid, inputs, dict(GREEDY)))
    got: dict[str, list[int]] = {}
    outs: dict[str, list[dict]] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            got.setdefault(o.request_id, []).extend(o.data["token_ids"])
            outs.setdefault(o.request_id, []).append(o.data)
    assert engine.stats()["kv_blocks_used"] == 0
    return got, outs


def _check(ref_model, ids: list[int], got: list[int], outs: list[dict], **media) -> None:
    ref = ref_model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6,
                             do_sample=False, eos_token_id=None, output_hidden_states=True,
                             return_dict_in_generate=True, **media)
    assert got == ref.sequences[0, len(ids):].tolist()
    # the rows the talker reads: layer 0 and the last layer, prompt then each decode step
    exported = torch.cat([o["hidden_states"] for o in outs if "hidden_states" in o])
    expect_embed = torch.cat([h[0][0] for h in ref.hidden_states])
    expect_last = torch.cat([h[-1][0] for h in ref.hidden_states])
    assert exported.shape[0] == len(ids) + 5  # the last token is never fed
    torch.testing.assert_close(exported[:, 0], expect_embed, atol=1e-3, rtol=1e-3)
    # float32 noise of a different attention kernel over a longer (media) prompt: 7e-4
    torch.testing.assert_close(exported[:, 1], expect_last, atol=2e-3, rtol=1e-3)


def test_text_batched_greedy_matches_transformers(engine, reference):
    got, outs = _run(engine, {f"t{i}": {"prompt": p} for i, p in enumerate(PROMPTS)})
    assert len({tuple(v) for v in got.values()}) == len(PROMPTS)  # the fixture varies
    for i, p in enumerate(PROMPTS):
        ids = engine.lm.tokenizer(p)["input_ids"]
        _check(reference, ids, got[f"t{i}"], outs[f"t{i}"])


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_audio_input_matches_transformers(engine, reference):
    clips = {"a": _clip(0.6, 440.0), "b": _clip(1.1037, 220.0)}  # b: not whole hops
    got, outs = _run(engine, {rid: {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"pcm_f32le": c.tobytes(), "sample_rate": 16000}},
        {"type": "text", "text": "What is this?"}]}]} for rid, c in clips.items()})
    assert got["a"] != got["b"]
    audio_id = reference.config.audio_token_index
    for rid, clip in clips.items():
        ids = outs[rid][0]["prompt_token_ids"]
        feats = engine.lm.media.fe([clip], sampling_rate=16000, return_attention_mask=True,
                                   return_tensors="pt")
        assert ids.count(audio_id) > 10  # one per encoded audio frame, not one per clip
        _check(reference, ids, got[rid], outs[rid], input_features=feats["input_features"],
               feature_attention_mask=feats["attention_mask"])


def _png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def test_image_input_matches_transformers(engine, reference):
    """Images: the model's 3-axis positions (get_rope_index) and the tower's features."""
    from PIL import Image

    images = {"one": [_png(56, 56, 1)], "two": [_png(84, 28, 2), _png(28, 56, 3)]}
    got, outs = _run(engine, {rid: {"messages": [{"role": "user", "content": [
        *({"type": "image", "image": {"data": f}} for f in files),
        {"type": "text", "text": "What is this?"}]}]} for rid, files in images.items()})
    for rid, files in images.items():
        ids = outs[rid][0]["prompt_token_ids"]
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = engine.lm.media.images(images=pil, return_tensors="pt")
        assert ids.count(reference.config.image_token_index) == int(
            pixels["image_grid_thw"].prod(-1).sum()) // 4  # merged 2x2 patches
        assert "prompt_rope_positions" in outs[rid][0]
        _check(reference, ids, got[rid], outs[rid], attention_mask=torch.ones(1, len(ids),
                                                                           dtype=torch.long),
               **pixels)


def _video_prompt(data: bytes, track: np.ndarray | None = None,
                  image: bytes | None = None) -> dict:
    video = {"data": data}
    if track is not None:  # what the API adds for use_audio_in_video
        video.update(pcm_f32le=track.tobytes(), sample_rate=16000)
    content = [{"type": "video", "video": video}, {"type": "text", "text": "What is this?"}]
    if image is not None:
        content.insert(0, {"type": "image", "image": {"data": image}})
    return {"messages": [{"role": "user", "content": content}]}


def _expected_ids(engine: AREngine, pads: str, image: Any) -> list[int]:
    """The processor's prompt: the template's placeholders grown as it grows them."""
    kinds = ([{"type": "image"}] if image is not None else []) + [{"type": "video"}]
    text = engine.lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": [*kinds, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True, tokenize=False).replace("<|VIDEO|>", pads)
    if image is not None:
        text = text.replace("<|IMAGE|>", "<|IMAGE|>" * int(image["image_grid_thw"].prod() // 4))
    return engine.lm.tokenizer(text)["input_ids"]


def test_video_input_matches_transformers(engine, reference, omni25_dir):
    """Videos, seen alone, after an image (one tower call for both) and heard with their
    track (use_audio_in_video: frames and audio interleaved in 2 s chunks, time-aligned
    rotary positions), batched: the processor's prompt ids, and greedy answers equal to
    thinker.generate."""
    from PIL import Image

    from omni.media.audio import decode_audio

    videos = {"one": mp4_with_track(1), "two": mp4_with_track(5)}
    tracks = {rid: decode_audio(v, 16000, 600.0) for rid, v in videos.items()}
    png = _png(56, 84, 4)
    requests = {rid: _video_prompt(v) for rid, v in videos.items()}
    requests.update({f"{rid}+track": _video_prompt(v, tracks[rid]) for rid, v in videos.items()})
    requests["one+image"] = _video_prompt(videos["one"], image=png)
    tower, calls = engine.lm.media.thinker.get_image_features, []
    engine.lm.media.thinker.get_image_features = lambda pixels, grid, **kw: calls.append(
        len(grid)) or tower(pixels, grid, **kw)
    try:
        got, outs = _run(engine, requests)
    finally:
        del engine.lm.media.thinker.get_image_features
    # the fixture varies: another video or its track heard, another answer
    assert len(set(got["one"])) >= 3 and got["one"] != got["two"]
    assert got["one+track"] != got["two+track"] and got["one"] != got["one+track"]
    # the five prompts wait together: one tower call for their 2 distinct videos and
    # the image (a video asked about three times is decoded and encoded once)
    assert calls == [3] and engine._encoder.batches[-1] == 5
    for rid in requests:
        name, extra = rid.split("+")[0], rid.partition("+")[2]
        pads, media = video_inputs(str(omni25_dir), videos[name],
                                   tracks[name] if extra == "track" else None)
        image = engine.lm.media.images(images=[Image.open(io.BytesIO(png)).convert("RGB")],
                                       return_tensors="pt") if extra == "image" else None
        ids = _expected_ids(engine, pads, image)
        assert outs[rid][0]["prompt_token_ids"] == ids, rid
        _check(reference, ids, got[rid], outs[rid], **(dict(image) if image else {}),
               attention_mask=torch.ones(1, len(ids), dtype=torch.long), **media)


def _image_prompt(*files: bytes, clip: np.ndarray | None = None) -> dict:
    content: list[dict] = [{"type": "image", "image": {"data": f}} for f in files]
    if clip is not None:
        content.append({"type": "input_audio", "input_audio": {
            "pcm_f32le": clip.tobytes(), "sample_rate": 16000}})
    return {"messages": [{"role": "user", "content": content + [
        {"type": "text", "text": "What is this?"}]}]}


def _steps(engine: AREngine, requests: dict[str, dict]) -> tuple[dict, dict]:
    """(tokens, error) per request, errors allowed."""
    for rid, inputs in requests.items():
        engine.add(EngineRequest(rid, inputs, dict(GREEDY)))
    got: dict[str, list[int]] = {}
    errors: dict[str, Any] = {}
    while engine.has_work():
        for o in engine.step():
            if o.error:
                errors[o.request_id] = o
            else:
                got.setdefault(o.request_id, []).extend(o.data["token_ids"])
    return got, errors


def test_prompts_waiting_together_share_one_tower_call(engine, reference):
    """Images, a video and audio of five prompts that wait together go through ONE vision
    tower call (its packed grids: 3 distinct images + 1 video) and ONE audio tower call
    (forward hooks on the real modules); each answer equals the prompt's answer alone
    and, for the image prompts, thinker.generate; a bad image fails its prompt alone."""
    from PIL import Image

    a, b, c = _png(56, 56, 1), _png(84, 28, 2), _png(28, 56, 3)
    requests = {"one": _image_prompt(a), "two": _image_prompt(b, c),
                "heard": _image_prompt(a, clip=_clip(0.6, 440.0)),
                "video": _video_prompt(mp4_with_track(1)),
                "bad": _image_prompt(b"not a picture")}
    towers, grids, clips = engine.lm.media.thinker.model, [], []
    hooks = [towers.visual.register_forward_hook(
                 lambda m, args, kw, out: grids.append(len(kw["grid_thw"])), with_kwargs=True),
             towers.audio_tower.register_forward_hook(lambda m, args, out: clips.append(1))]
    try:
        together, errors = _steps(engine, requests)
        assert engine._encoder.batches[-1] == len(requests)
        assert grids == [4] and clips == [1]  # one call each for all five prompts
        alone = {rid: _steps(engine, {rid: requests[rid]})[0][rid] for rid in together}
    finally:
        for hook in hooks:
            hook.remove()
    assert set(errors) == {"bad"} and errors["bad"].error_field == "messages[0].content[0]"
    assert "not an image this server can read" in errors["bad"].error
    assert len({tuple(v) for v in together.values()}) == 4  # the answers vary with the media
    assert together == alone
    for rid, files in (("one", [a]), ("two", [b, c])):
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = engine.lm.media.images(images=pil, return_tensors="pt")
        text = engine.lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": [*[{"type": "image"}] * len(files),
                                          {"type": "text", "text": "What is this?"}]}],
            add_generation_prompt=True, tokenize=False)
        pads = iter((pixels["image_grid_thw"].prod(-1) // 4).tolist())  # merged 2x2 patches
        text = re.sub(re.escape("<|IMAGE|>"), lambda _, n=pads: "<|IMAGE|>" * next(n), text)
        ids = torch.tensor([engine.lm.tokenizer(text)["input_ids"]])
        out = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=6, do_sample=False, eos_token_id=None,
                                 **pixels)
        assert together[rid] == out[0, ids.shape[1]:].tolist(), rid


def test_bad_videos_fail_their_request_naming_the_part(engine):
    from omni.engines.base import INPUT_FAULT

    one_frame = mp4_with_track(3, seconds=1, fps=1)
    requests = {"junk": _video_prompt(b"not a video"), "short": _video_prompt(one_frame),
                "good": _video_prompt(mp4_with_track(1))}
    for rid, inputs in requests.items():
        engine.add(EngineRequest(rid, inputs, dict(GREEDY)))
    errors, done = {}, set()
    while engine.has_work():
        for o in engine.step():
            if o.error:
                assert o.error_kind == INPUT_FAULT and o.error_field == "messages[0].content[0]"
                errors[o.request_id] = o.error
            done |= {o.request_id} if o.finished else set()
    assert "not a video this server can read" in errors["junk"]
    assert "at least 2 are needed" in errors["short"]
    assert "good" in done and "good" not in errors


def test_videos_beyond_the_context_are_refused_before_decoding(engine, monkeypatch):
    from omni.models import qwen2_5_omni_thinker, qwen_vl_video

    media, video = engine.lm.media, mp4_with_track(1)
    per_video = qwen_vl_video.token_count(media.video, video)
    monkeypatch.setattr(media, "max_video_tokens", 2 * per_video)
    monkeypatch.setattr(qwen2_5_omni_thinker, "decode_video", lambda *a: pytest.fail("decoded"))
    prompt = _video_prompt(video)
    prompt["messages"][0]["content"][:0] = prompt["messages"][0]["content"][:1] * 2
    engine.add(EngineRequest("many", prompt, dict(GREEDY)))
    errors = [o for o in engine.step() if o.error]
    while engine.has_work():
        errors += [o for o in engine.step() if o.error]
    assert errors[0].error_field == "messages[0].content[2]"
    assert f"take {3 * per_video} tokens; the model's context holds" in errors[0].error


@pytest.mark.parametrize("times,per_chunk", [([0, 0, 25, 25, 50], 50), ([0, 60, 130], 50),
                                              ([], 50), ([10, 20], 50), (list(range(120)), 50)])
def test_chunks_are_the_processors(times, per_chunk):
    """The chunking of a heard video's layout is Qwen2_5OmniProcessor's get_chunked_index."""
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor

    from omni.models.qwen2_5_omni_video import chunks

    theirs = Qwen2_5OmniProcessor.get_chunked_index(None, np.array(times), per_chunk)
    assert chunks(np.array(times), per_chunk) == theirs


def test_the_processors_chat_template_is_used_where_the_tokenizer_has_none(omni25_dir,
                                                                         tmp_path):
    """Qwen's omni releases keep the template in chat_template.json, the processor's file."""
    import json

    from transformers import AutoTokenizer

    from omni.models.qwen2_5_omni_thinker import processor_template

    tok = AutoTokenizer.from_pretrained(str(omni25_dir))
    template, tok.chat_template = tok.chat_template, None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    processor_template(tmp_path, tok)
    assert tok.chat_template == template
    (tmp_path / "chat_template.json").write_text("{")
    tok.chat_template = None
    with pytest.raises(Exception, match="unreadable chat_template.json"):
        processor_template(tmp_path, tok)
