"""Qwen2.5-Omni's talker as an AR stage fed by the thinker's stream (tiny random release
checkpoint): its codec stream equals transformers' own thinker -> talker generate (greedy),
it waits for answer rows not yet written, batches and streams without changing a frame,
and refuses bad input per request."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from unit.omni25_reference import composite_generate
from unit.talker_runs import run_talker

from omni.engines.ar.engine import AREngine
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)
TALKER = "qwen2_5_omni_talker"
GREEDY = {"temperature": 0}
QUESTIONS = ["Say hello to the world please", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def omni25_dir():
    return str(ensure_tiny_model("qwen2_5_omni"))


@pytest.fixture(scope="module")
def thinker(omni25_dir):
    return AREngine(omni25_dir, options={"export_hidden_layers": "auto"})


@pytest.fixture(scope="module")
def talker(omni25_dir):
    return FeedbackAREngine(TALKER, omni25_dir)


def thinker_outputs(thinker, question: str | list, max_tokens: int = 8
                    ) -> list[tuple[dict, bool]]:
    content = question if isinstance(question, list) else question
    thinker.add(EngineRequest("t", {"messages": [{"role": "user", "content": content}]},
                              {**GREEDY, "max_tokens": max_tokens, "ignore_eos": True}))
    outs = []
    while thinker.has_work():
        for o in thinker.step():
            assert o.error is None, o.error
            outs.append((o.data, o.finished))
    return outs


@pytest.fixture(scope="module")
def composite(omni25_dir):
    """transformers' composite model, its token2wav replaced by a recorder of its input
    (the talker's codes before its stop code)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir, dtype=torch.float32)
    model.captured = {}

    def capture(code, **kw):
        model.captured["codes"] = code
        return torch.zeros(8)

    model.token2wav.forward = capture
    return model


def hf_generate(model, prompt_ids: list[int], thinker_tokens: int, talker_tokens: int,
                speaker: str = "Chelsie", **media) -> tuple[list[int], list[int]]:
    """transformers' composite generate, greedy: (answer ids, codes)."""
    answer, _ = composite_generate(model, prompt_ids, words=thinker_tokens,
                                   frames=talker_tokens, speaker=speaker, **media)
    return answer, model.captured["codes"][0].tolist()


@pytest.mark.parametrize(("speaker", "words"), [("Chelsie", 8), ("Ethan", 4)])
def test_talker_codes_equal_transformers_generate(composite, thinker, talker, speaker, words):
    """The talker reads the answer's rows, then text-eos, then text-pad, to max_tokens."""
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=words)
    prompt_ids = outs[0][0]["prompt_token_ids"]
    answer = [t for data, _ in outs for t in data["token_ids"]]
    frames = run_talker(talker, {"a": outs}, max_tokens=30, params={"voice": speaker})["a"]
    hf_answer, hf_codes = hf_generate(composite, prompt_ids, words, 30, speaker)
    assert answer == hf_answer
    codes = [f[0][0] for f in frames]
    assert len(set(codes)) > 3 and len(codes) == 30  # the fixture's codes vary
    assert codes == hf_codes
    index = ["Chelsie", "Ethan"].index(speaker)
    assert all(f[1] == [index] for f in frames)  # the speaker rides with every frame
    assert talker.stats()["kv_blocks_used"] == 0 and talker.stats()["running"] == 0


def _media_part(kind: str, thinker) -> tuple[dict, dict]:
    """(a content part, transformers' inputs for the same media)."""
    rng = np.random.default_rng(5)
    if kind == "image":
        from PIL import Image

        from omni.models.qwen3_omni_vision import decode_image

        buf = io.BytesIO()
        Image.fromarray((rng.random((56, 84, 3)) * 255).astype("uint8")).save(buf, "PNG")
        part = {"type": "image", "image": {"data": buf.getvalue()}}
        pixels = thinker.lm.media.images(images=[decode_image(part)], return_tensors="pt")
        # pixel_values for the thinker only: generate hands unprefixed keys to the talker
        # too, whose generate refuses pixel_values; the grid goes to both (the talker's
        # positions are built from it)
        return part, {"thinker_pixel_values": pixels["pixel_values"],
                      "image_grid_thw": pixels["image_grid_thw"]}
    clip = (0.3 * rng.standard_normal(9600)).astype(np.float32)
    part = {"type": "input_audio", "input_audio": {"pcm_f32le": clip.tobytes(),
                                                   "sample_rate": 16000}}
    feats = thinker.lm.media.fe([clip], sampling_rate=16000, return_attention_mask=True,
                                return_tensors="pt")
    return part, {"input_features": feats["input_features"],
                  "feature_attention_mask": feats["attention_mask"]}


@pytest.mark.parametrize(("kind", "question"), [("image", "What is it?"),
                                                ("audio", "Who is speaking?")])
def test_media_prompt_codes_equal_transformers_generate(composite, thinker, talker, kind,
                                                        question):
    """An image (3-axis positions, continued past the image) or an audio clip: the talker
    hears the media positions' last-layer rows without their embeddings, as generate's
    talker does, and its codes equal transformers'."""
    part, media = _media_part(kind, thinker)
    outs = thinker_outputs(thinker, [part, {"type": "text", "text": question}], max_tokens=5)
    prompt_ids = outs[0][0]["prompt_token_ids"]
    assert ("prompt_rope_positions" in outs[0][0]) == (kind == "image")
    frames = run_talker(talker, {kind: outs}, max_tokens=20)[kind]
    hf_answer, hf_codes = hf_generate(composite, prompt_ids, 5, 20, **media)
    assert [t for data, _ in outs for t in data["token_ids"]] == hf_answer
    codes = [f[0][0] for f in frames]
    # (without the image's positions, or with its rows' embeddings kept, the image's
    # codes differ; the tiny audio tower's embeddings are too small to change a code)
    assert len(set(codes)) > 3 and codes == hf_codes


def test_batched_and_streamed_equal_alone(thinker, talker):
    feeds = {f"q{i}": thinker_outputs(thinker, q, max_tokens=6 + 4 * i)
             for i, q in enumerate(QUESTIONS)}
    together = run_talker(talker, feeds, max_tokens=16)
    for rid, outs in feeds.items():
        alone = run_talker(talker, {rid: outs}, max_tokens=16, interleave=False)
        assert together[rid] == alone[rid] and len(alone[rid]) >= 5


def test_sampling_with_seed_reproduces(thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=5)
    params = {"temperature": 0.9, "top_k": 40, "seed": 11}
    one = run_talker(talker, {"s": outs}, max_tokens=12, params=params)["s"]
    two = run_talker(talker, {"s": outs}, max_tokens=12, params=params)["s"]
    three = run_talker(talker, {"s": outs}, max_tokens=12, params={**params, "seed": 12})["s"]
    assert one == two and one != three


def test_talker_waits_for_rows_not_yet_written(thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[1], max_tokens=8)
    talker.add(EngineRequest("w", {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 40}))
    assert not talker.has_work()  # no prompt yet: nothing to run

    def frames() -> int:
        made = 0
        while talker.has_work():
            made += sum(1 for o in talker.step() if o.data and o.data.get("codes"))
        return made
    # the prompt alone: answer token 0's row comes with the thinker's second output
    talker.append("w", "thinker", 0, outs[0][0], False)
    assert frames() == 0
    talker.append("w", "thinker", 1, outs[1][0], False)  # the prefill, its frame; step 0
    assert frames() == 1 and not talker.has_work()  # needs answer row 1
    talker.append("w", "thinker", 2, outs[2][0], False)
    assert frames() == 1 and not talker.has_work()
    talker.abort(["w"])
    assert talker.stats()["kv_blocks_used"] == 0


def test_bad_inputs_fail_alone(thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=4)
    talker.add(EngineRequest("v", {"stream": ["thinker"]}, {"voice": "nobody"}))
    talker.add(EngineRequest("h", {"stream": ["thinker"]}, {}))
    talker.append("h", "thinker", 0, {"token_ids": [1], "prompt_token_ids": [1, 2, 3],
                                      "hidden_states": torch.zeros(3, 2, 5)}, False)
    errors = {o.request_id: o.error for o in talker.step() if o.error}
    assert "unknown voice 'nobody'" in errors["v"] and "Chelsie" in errors["v"]
    assert "hidden_states" in errors["h"]
    assert talker.stats()["running"] == 0
    assert run_talker(talker, {"ok": outs}, max_tokens=3)["ok"]  # the engine goes on


def test_a_tool_call_in_the_answer_is_not_heard(thinker, talker):
    """Qwen2.5-Omni's talker reads one thinker row per answer token, a thinker output after
    the token's id: the rows of a tool call's tokens (tags included) never reach it, so
    it speaks the frames of the answer without the call; the same ids as plain words are
    heard and change the frames (the comparison can fail)."""
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=8)
    encode = thinker.lm.tokenizer.encode
    call = encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
                  add_special_tokens=False)
    words = encode(" get_time arguments", add_special_tokens=False)

    def spoken(ids: list[int]) -> list:
        """Frames with ids after answer token 2; each output carries the row of the token
        before it (answer token 2's real row first; the inserted tokens' are stand-ins)."""
        after = outs[3][0]
        row = after["hidden_states"]
        extra = [({"token_ids": [t], "finish_reason": None, "hidden_states": row}, False)
                 for t in ids]
        fed = outs[:3] + extra + [({**after, "hidden_states": row}, False)] + outs[4:]
        return run_talker(talker, {"x": fed if ids else outs}, max_tokens=30)["x"]
    plain = spoken([])
    assert len({str(f) for f in plain}) > 2  # the frames vary
    assert spoken(words) != plain
    assert spoken(call) == plain
