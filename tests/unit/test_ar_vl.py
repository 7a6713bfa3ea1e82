"""Qwen2.5-VL and Qwen3-VL through the AR engine (tiny random release-layout checkpoints):
prompts with images, batched with a text request, decode greedily to exactly what
transformers' own ``generate`` gives for the same pixels; the vision tower runs once for
the images of every prompt that waits, and an image sent twice is encoded once; a bad
image fails its own request only, and images beyond the context are refused from their
headers."""

from __future__ import annotations

import pytest
import torch
from unit.vl_reference import GREEDY, QUESTION, png, reference

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineLoadError, EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)
IMAGES = {"one": [png(64, 48, 1)], "other": [png(64, 48, 3)],
          # a tall image, then the first request's image twice: decoded and encoded once
          "three": [png(40, 90, 2), png(64, 48, 1), png(64, 48, 1)]}


def image_request(rid: str, files: list[bytes]) -> EngineRequest:
    content = [{"type": "image", "image": {"data": f}} for f in files]
    messages = [{"role": "user", "content": content + [{"type": "text", "text": QUESTION}]}]
    return EngineRequest(rid, {"messages": messages}, dict(GREEDY))


def run(engine: AREngine, requests: list[EngineRequest]) -> tuple[dict, dict]:
    for request in requests:
        engine.add(request)
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    while engine.has_work():
        for o in engine.step():
            if o.error is not None:
                errors[o.request_id] = o.error
            else:
                tokens.setdefault(o.request_id, []).extend(o.data["token_ids"])
    return tokens, errors


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl_dir(request, tmp_path_factory) -> str:
    return str(ensure_tiny_model(request.param, tmp_path_factory.getbasetemp() / "models"))


def test_image_chat_matches_transformers_generate(vl_dir):
    engine = AREngine(vl_dir)
    assert engine.info()["input_parts"] == ["text", "image_url", "video_url"]
    seen: list[int] = []  # images per vision-processor call
    processor = engine.lm.media.images
    engine.lm.media.images = lambda images, **kw: seen.append(len(images)) or processor(
        images=images, **kw)
    requests = [image_request(rid, files) for rid, files in IMAGES.items()]
    got, errors = run(engine, requests + [EngineRequest("text", {"prompt": "Hello"},
                                                        dict(GREEDY))])
    assert not errors and set(got) == {*IMAGES, "text"}
    # the fixture varies: several tokens per answer, and another image, another answer
    assert len(set(got["one"])) >= 4 and got["one"] != got["other"]
    # three prompts, one encoder batch, one tower call over the 3 distinct images
    assert engine._encoder.batches == [3] and seen == [3]
    for rid, files in IMAGES.items():
        assert got[rid] == reference(vl_dir, files, GREEDY["max_tokens"]), rid
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0
    # what /metrics exports: one batch of the 3 media prompts, and the time it took
    assert stats["encoder_batches"] == 1 and stats["encoder_prompts"] == 3
    assert stats["encoder_seconds"] > 0


def test_a_lone_image_prompt_gathers_until_a_step_with_nothing_else_to_run(vl_dir):
    """encode_gather_ms (omni/engines/gather/): the engine process's loop waits on its
    socket for the rest of a burst (gather_s); a caller stepping the engine itself has
    nothing more to add, so its step encodes the prompt at once."""
    with pytest.raises(EngineLoadError, match="encode_gather_ms"):
        AREngine(vl_dir, options={"encode_gather_ms": -1})
    engine = AREngine(vl_dir, options={"encode_gather_ms": 60_000})
    engine.add(image_request("one", IMAGES["one"]))
    assert 59 < engine.gather_s() <= 60
    got, errors = run(engine, [])
    assert not errors and len(got["one"]) == GREEDY["max_tokens"]
    assert engine._encoder.batches == [1] and engine.gather_s() == 0


def test_a_bad_image_fails_its_request_alone(vl_dir):
    engine = AREngine(vl_dir)
    bad = EngineRequest("bad", {"messages": [{"role": "user", "content": [
        {"type": "image", "image": {"data": b"not a picture"}}]}]}, dict(GREEDY))
    # a readable image the release's processor refuses (aspect ratio over 200) fails its
    # own prompt (seen from its header), never the prompts batched with it
    wide = image_request("wide", [png(600, 2, 2)])
    got, errors = run(engine, [bad, wide, image_request("good", IMAGES["one"])])
    assert engine._encoder.batches[0] == 3
    assert "not an image this server can read" in errors["bad"]
    assert "aspect ratio" in errors["wide"]
    assert len(got["good"]) == GREEDY["max_tokens"] and "good" not in errors
    assert got["good"] == reference(vl_dir, IMAGES["one"], GREEDY["max_tokens"])


def test_images_beyond_the_context_are_refused_before_decoding(vl_dir):
    engine = AREngine(vl_dir)
    context = engine.lm.media.max_image_tokens
    most = engine.lm.media.images.size["longest_edge"]  # the processor's largest image
    side = int(most ** 0.5) // 28 * 28
    per_image = engine.lm.media.images.get_number_of_image_patches(side, side) // 4
    decoded = []
    engine.lm.media.images = lambda images, **kw: decoded.append(len(images))
    many = image_request("many", [png(side, side, 5)] * (context // per_image + 1))
    _, errors = run(engine, [many])
    assert f"model's context holds {context}" in errors["many"], errors
    assert errors["many"].startswith("messages: ")  # the 400's param: the whole prompt
    assert decoded == []  # refused from the headers: the tower never ran


def test_an_image_prompt_longer_than_max_model_len_is_refused(vl_dir):
    request = image_request("long", IMAGES["one"])
    engine = AREngine(vl_dir)
    ids, _, _ = engine.lm.media.encode(request.inputs["messages"])
    short = AREngine(vl_dir, options={"max_model_len": len(ids)})
    _, errors = run(short, [request])
    assert errors["long"] == (f"messages: prompt has {len(ids)} tokens; the model's limit "
                              f"is {len(ids)}")  # InputFieldError: its field, the 400's param
