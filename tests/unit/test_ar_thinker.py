"""Qwen3-Omni's thinker through the AR engine (tiny random release-layout checkpoint):
batched greedy decoding equals the thinker run by transformers on its own."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from omni.engines.ar.engine import AREngine
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


@pytest.mark.parametrize("chunk", [512, 3])
def test_auto_export_sends_the_prompt_rows_only(omni_dir, chunk):
    """export_hidden_layers auto: the talker embeds the answer tokens itself, so only the
    prompt's rows (with the first token, from however many prefill chunks) are exported;
    an explicit list still exports every fed token's rows."""
    for option, decode_rows in (("auto", 0), ([0, 1], 1)):
        engine = AREngine(str(omni_dir), options={"export_hidden_layers": option,
                                                  "max_batched_tokens": chunk})
        engine.add(EngineRequest("p", {"prompt": PROMPTS[1]},
                                 {"temperature": 0, "max_tokens": 5, "ignore_eos": True}))
        outs = []
        while engine.has_work():
            outs += [o.data for o in engine.step() if o.data]
        prompt = len(engine.lm.tokenizer(PROMPTS[1])["input_ids"])
        rows = [0 if "hidden_states" not in d else d["hidden_states"].shape[0] for d in outs]
        assert rows == [prompt] + [decode_rows] * 4, (option, rows)
        assert outs[0]["prompt_token_ids"] and len(outs) == 5


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


def _png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def test_image_input_matches_transformers_thinker(omni_dir):
    """Images batched with a text request: the answers and the exported hidden states equal
    transformers' thinker given the same pixels (its 3-axis rotary positions, deepstack).
    Leaving out either the positions or deepstack changes these answers."""
    from PIL import Image
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    engine = AREngine(str(omni_dir), options={"export_hidden_layers": "auto"})
    assert "image_url" in engine.info()["input_parts"]
    images = {"one": [_png(64, 64, 1)], "two": [_png(100, 40, 2), _png(48, 80, 3)]}
    for rid, files in images.items():
        content = [{"type": "image", "image": {"data": f}} for f in files]
        engine.add(EngineRequest(rid, {"messages": [{"role": "user", "content": content + [
            {"type": "text", "text": "What is this?"}]}]},
            {"temperature": 0, "max_tokens": 6, "ignore_eos": True}))
    engine.add(EngineRequest("text", {"prompt": "Hello world"},
                             {"temperature": 0, "max_tokens": 6, "ignore_eos": True}))
    got: dict[str, list[int]] = {}
    first: dict[str, dict] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            got.setdefault(o.request_id, []).extend(o.data["token_ids"])
            first.setdefault(o.request_id, o.data)
    assert "prompt_rope_positions" not in first["text"]
    config = AutoConfig.from_pretrained(str(omni_dir))
    config.enable_audio_output = False
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(omni_dir), config=config, dtype=torch.float32).thinker.eval()
    for rid, files in images.items():
        ids = first[rid]["prompt_token_ids"]
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = engine.lm.media.images(images=pil, return_tensors="pt")
        assert ids.count(config.thinker_config.image_token_id) == int(
            pixels["image_grid_thw"].prod(-1).sum()) // 4  # merged 2x2 patches
        ref = thinker.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                               eos_token_id=None, output_hidden_states=True,
                               return_dict_in_generate=True, **pixels)
        assert got[rid] == ref.sequences[0, len(ids):].tolist(), rid
        prompt_hidden = ref.hidden_states[0]  # the prefill: (embeddings, layer 1, ...)
        torch.testing.assert_close(first[rid]["hidden_states"][:, 0], prompt_hidden[0][0])
        torch.testing.assert_close(first[rid]["hidden_states"][:, 1], prompt_hidden[1][0])
        ids_t = torch.tensor([ids])
        rope, _ = thinker.model.get_rope_index(ids_t, pixels["image_grid_thw"],
                                               attention_mask=torch.ones_like(ids_t))
        assert first[rid]["prompt_rope_positions"] == rope[:, 0].long().tolist()
    assert engine.stats()["kv_blocks_used"] == 0


def _mp4(seconds: float, fps: int, seed: int) -> bytes:
    from omni.media.video import encode_mp4

    rng = np.random.default_rng(seed)
    return encode_mp4((rng.random((int(seconds * fps), 48, 64, 3)) * 255).astype("uint8"), fps)


def _ask(engine: AREngine, part: dict) -> tuple[list[int], dict]:
    """Greedy answer (6 tokens) to one media part + a question, and the first output."""
    engine.add(EngineRequest("q", {"messages": [{"role": "user", "content": [
        part, {"type": "text", "text": "What is it?"}]}]},
        {"temperature": 0, "max_tokens": 6, "ignore_eos": True}))
    got, first = [], None
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            got += o.data["token_ids"]
            first = first or o.data
    return got, first


def test_video_patches_have_the_image_processors_layout(omni_dir):
    """One image shown for a whole temporal patch is what the image processor makes of it."""
    from omni.models.qwen3_omni_vision import decode_image, video_patches

    engine = AREngine(str(omni_dir))
    image = decode_image({"image": {"data": _png(96, 64, 4)}})
    patches, grid = video_patches(engine.lm.media.images, [image, image])
    ref = engine.lm.media.images(images=[image], return_tensors="pt")
    assert grid.tolist() == ref["image_grid_thw"].tolist()
    torch.testing.assert_close(patches, ref["pixel_values"])


def test_video_frames_keep_to_the_video_pixel_budget():
    """A release's image budget (12.8 M pixels) is not a video frame's: HD frames are cut
    to at most VIDEO_MAX_PIXELS, sides a multiple of patch x merge."""
    from transformers import Qwen2VLImageProcessorPil

    from omni.models.qwen3_omni_vision import VIDEO_MAX_PIXELS, frame_size

    release = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, min_pixels=65536,
                                       max_pixels=16777216)
    w, h = frame_size(release, 1920, 1080)
    assert w * h <= VIDEO_MAX_PIXELS and w % 32 == 0 and h % 32 == 0 and w > h
    assert frame_size(release, 64, 48) == (320, 224)  # grown to the minimum, like images


def test_video_input_matches_transformers_thinker(omni_dir):
    """A 1.5 s clip: sampled at 8/3 frames a second (4 frames, the minimum), so its time
    axis steps by 18.75 positions; answers, exported hidden states and the (fractional)
    rotary positions equal transformers' thinker given the same patches."""
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    from omni.models.qwen3_omni_vision import decode_video, video_patches

    engine = AREngine(str(omni_dir), options={"export_hidden_layers": "auto"})
    clip = _mp4(1.5, 10, 7)
    got, first = _ask(engine, {"type": "video", "video": {"data": clip}})
    frames, rate = decode_video({"video": {"data": clip}}, engine.lm.media.images)
    assert (len(frames), rate) == (4, 4 / 1.5)
    assert {f.size for f in frames} == {(64, 64)}  # resized as decoded: 64 x 48 -> 2 x 2 x 32
    patches, grid = video_patches(engine.lm.media.images, frames)
    config = AutoConfig.from_pretrained(str(omni_dir))
    config.enable_audio_output = False
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(omni_dir), config=config, dtype=torch.float32).thinker.eval()
    ids = first["prompt_token_ids"]
    video = {"pixel_values_videos": patches, "video_grid_thw": grid,
             "video_second_per_grid": torch.tensor([2 / rate])}
    ref = thinker.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                           eos_token_id=None, output_hidden_states=True,
                           return_dict_in_generate=True, **video)
    assert got == ref.sequences[0, len(ids):].tolist()
    torch.testing.assert_close(first["hidden_states"][:, 1], ref.hidden_states[0][1][0])
    ids_t = torch.tensor([ids])
    rope, _ = thinker.model.get_rope_index(ids_t, None, grid, torch.ones_like(ids_t),
                                           second_per_grids=video["video_second_per_grid"])
    assert first["prompt_rope_positions"] == rope[:, 0].tolist()
    time_axis = first["prompt_rope_positions"][0]  # the second temporal patch 18.75 later:
    assert any(b - a == 18.75 for a, b in zip(time_axis[:-1], time_axis[1:], strict=True))


@pytest.mark.parametrize(("grid", "seconds", "heard"), [
    ((2, 4, 4), 1.0, 28), ((4, 2, 4), 0.75, 30), ((3, 2, 2), 1.0, 5)])
def test_heard_video_layout_is_the_processors(grid, seconds, heard):
    """A video heard with its track interleaves as transformers' Qwen3-Omni processor lays
    it out (its method, called with the few attributes it reads)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
    )

    from omni.models.qwen3_omni_vision import interleaved_video

    names = {"video": "V", "audio": "A", "start": "S", "end": "E"}
    fake = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2), audio_bos_token="S",
                           audio_eos_token="E", video_token="V", audio_token="A")
    ref = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        fake, {"video_grid_thw": np.array([grid]), "video_second_per_grid": [seconds]}, 0,
        {"num_audio_tokens": [heard]}, 0, position_id_per_seconds=25)
    tokens = {**{k: i for i, k in enumerate(names)}, "per_second": 25, "merge": 2}
    mine = interleaved_video(tokens, {"grid": torch.tensor([grid]),
                                      "second_per_grid": torch.tensor([seconds])}, 0, heard)
    assert "".join(names[list(names)[t]] for t in mine) == ref


def test_video_heard_with_its_track_matches_transformers_thinker(omni_dir):
    """use_audio_in_video: the track's audio tokens interleave with the frames' and the
    answer, hidden states and positions equal transformers' thinker given the same
    patches and features."""
    from transformers import AutoConfig, Qwen3OmniMoeForConditionalGeneration

    from omni.media.audio import decode_audio
    from omni.media.video import encode_mp4
    from omni.models.qwen3_omni_vision import decode_video, video_patches

    rng = np.random.default_rng(9)
    tone = 0.3 * np.sin(2 * np.pi * 330 * np.arange(32000) / 16000)
    clip = encode_mp4((rng.random((20, 48, 64, 3)) * 255).astype("uint8"), 10, audio=tone,
                      audio_rate=16000)
    track = decode_audio(clip, 16000, 60)
    part = {"type": "video", "video": {"data": clip, "pcm_f32le": track.tobytes()}}
    engine = AREngine(str(omni_dir), options={"export_hidden_layers": "auto"})
    got, first = _ask(engine, part)
    config = AutoConfig.from_pretrained(str(omni_dir))
    config.enable_audio_output = False
    thinker = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(omni_dir), config=config, dtype=torch.float32).thinker.eval()
    ids = first["prompt_token_ids"]
    assert ids.count(config.thinker_config.audio_token_id) > 20  # 2.1 s of track
    frames, rate = decode_video(part, engine.lm.media.images)
    patches, grid = video_patches(engine.lm.media.images, frames)
    feats = engine.lm.media.fe([track], sampling_rate=16000, return_attention_mask=True,
                               return_tensors="pt")
    inputs = {"pixel_values_videos": patches, "video_grid_thw": grid,
              "video_second_per_grid": torch.tensor([2 / rate]),
              "input_features": feats["input_features"],
              "feature_attention_mask": feats["attention_mask"], "use_audio_in_video": True}
    ref = thinker.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                           eos_token_id=None, output_hidden_states=True,
                           return_dict_in_generate=True, **inputs)
    assert got == ref.sequences[0, len(ids):].tolist()
    torch.testing.assert_close(first["hidden_states"][:, 1], ref.hidden_states[0][1][0])
    ids_t = torch.tensor([ids])
    rope, _ = thinker.model.get_rope_index(ids_t, None, grid, torch.ones_like(ids_t), True,
                                           feats["attention_mask"].sum(-1),
                                           inputs["video_second_per_grid"])
    assert first["prompt_rope_positions"] == rope[:, 0].tolist()


def test_undecoded_and_unreadable_parts_are_refused_clearly(omni_dir):
    engine = AREngine(str(omni_dir))
    for rid, part in (("v", {"type": "video_url", "video_url": {"url": "data:video/mp4,"}}),
                      ("i", {"type": "image_url", "image_url": {"url": "data:,"}}),
                      ("bad", {"type": "image", "image": {"data": b"not an image"}}),
                      ("badv", {"type": "video", "video": {"data": b"not a video"}})):
        engine.add(EngineRequest(rid, {"messages": [{"role": "user", "content": [part]}]}, {}))
    errors = {}
    while engine.has_work():  # media prompts are read on the encoder thread
        errors.update({o.request_id: o.error for o in engine.step()})
    assert "'video_url' content parts reach this model decoded by the API" in errors["v"]
    assert "'image_url' content parts reach this model decoded by the API" in errors["i"]
    assert "not an image this server can read" in errors["bad"]
    assert "not a video this server can read" in errors["badv"]


def test_media_prompts_encode_off_the_step_loop(omni_dir):
    """While a media prompt is being encoded, other requests keep decoding; an encoding
    aborted meanwhile never enters the batch."""
    import threading

    engine = AREngine(str(omni_dir))
    gate = threading.Event()
    encode = engine.lm.media.encode_batch

    def gated(prompts):  # the real encoder, once the test lets it run
        gate.wait(30)
        return encode(prompts)

    engine.lm.media.encode_batch = gated
    image = {"type": "image", "image": {"data": _png(64, 64, 1)}}
    for rid in ("seen", "dropped"):
        engine.add(EngineRequest(rid, {"messages": [{"role": "user", "content": [image]}]},
                                 {"temperature": 0, "max_tokens": 3, "ignore_eos": True}))
    engine.add(EngineRequest("text", {"prompt": "Hello world"},
                             {"temperature": 0, "max_tokens": 5, "ignore_eos": True}))
    done: dict[str, list] = {}
    while "text" not in done:  # the encodings are still waiting at the gate
        for o in engine.step():
            assert o.error is None, o.error
            if o.finished:
                done[o.request_id] = [o]
    assert set(done) == {"text"}
    engine.abort(["dropped"])
    gate.set()
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            if o.finished:
                done[o.request_id] = [o]
    assert set(done) == {"text", "seen"}
    assert engine.stats()["kv_blocks_used"] == 0 and engine.stats()["running"] == 0
