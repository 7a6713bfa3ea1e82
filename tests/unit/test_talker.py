"""Qwen3-Omni's talker as an AR stage fed by the thinker's stream (tiny random release
checkpoint): its codec frames equal transformers' own thinker -> talker generate, it waits
for the words it has not been given yet, batches requests without changing them, and
loads exactly the saved weights."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from unit import talker_runs

from omni.engines.ar.engine import AREngine
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.base import EngineRequest
from omni.fixtures import ensure_tiny_model
from omni.models.checkpoint_parts import fuse_experts
from omni.models.qwen3_omni_talker import load_talker

torch.set_num_threads(1)
TALKER = "qwen3_omni_talker"
GREEDY = {"temperature": 0}
QUESTIONS = ["Say hello to the world please", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return str(ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models"))


@pytest.fixture(scope="module")
def thinker(omni_dir):
    return AREngine(omni_dir, options={"export_hidden_layers": "auto"})


@pytest.fixture(scope="module")
def talker(omni_dir):
    return FeedbackAREngine(TALKER, omni_dir)


def _messages(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def thinker_outputs(thinker, question: str | list, max_tokens: int = 8) -> list[dict]:
    messages = _messages(question) if isinstance(question, str) else question
    thinker.add(EngineRequest("t", {"messages": messages}, {**GREEDY, "max_tokens": max_tokens}))
    outs = []
    while thinker.has_work():
        for o in thinker.step():
            assert o.error is None, o.error
            outs.append((o.data, o.finished))
    return outs


def run_talker(talker, feeds: dict[str, list], **kwargs) -> dict[str, list[list[int]]]:
    """Frames per request: each frame's first codebook's codes."""
    return talker_runs.run_talker(talker, feeds, frame=lambda codes: [c[0] for c in codes],
                                  **kwargs)


def hf_codes(omni_dir, prompt_ids: list[int], thinker_tokens: int, talker_tokens: int,
             **media):
    """transformers' composite generate, greedy: (answer ids, codes (NQ, frames))."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)
    captured = {}
    decode = model.code2wav.chunked_decode

    def capture(codes, **kw):
        captured["codes"] = codes
        return decode(codes, **kw)

    model.code2wav.chunked_decode = capture
    seqs, _ = model.generate(input_ids=torch.tensor([prompt_ids]), return_audio=True,
                             speaker="Ethan", thinker_max_new_tokens=thinker_tokens,
                             thinker_do_sample=False, talker_max_new_tokens=talker_tokens,
                             talker_do_sample=False, talker_repetition_penalty=1.0, **media)
    return seqs[0, len(prompt_ids):].tolist(), captured["codes"][0]


def test_talker_frames_equal_transformers_generate(omni_dir, thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[0])
    prompt_ids = outs[0][0]["prompt_token_ids"]
    answer = [t for data, _ in outs for t in data["token_ids"]]
    hidden = outs[0][0]["hidden_states"]
    assert hidden.shape == (len(prompt_ids), 2, 64)  # layers [0, accept_hidden_layer]
    frames = run_talker(talker, {"a": outs}, max_tokens=12)["a"]
    hf_answer, hf = hf_codes(omni_dir, prompt_ids, 8, 12)
    assert answer == hf_answer
    # transformers computes a frame's residual codes one step later, so at max_new_tokens
    # it has one frame fewer: every frame it has, we have, equal
    ours = torch.tensor(frames).T
    assert ours.shape == (4, 12) and hf.shape == (4, 11)
    assert torch.equal(ours[:, :11], hf)
    assert talker.stats()["kv_blocks_used"] == 0 and talker.stats()["running"] == 0


def _visual_part(kind: str, processor) -> tuple[dict, dict]:
    """(an image or video content part, transformers' inputs for the same pixels)."""
    from PIL import Image

    from omni.media.video import encode_mp4
    from omni.models.qwen3_omni_vision import decode_image, decode_video, video_patches

    rng = np.random.default_rng(5)
    if kind == "image":
        buf = io.BytesIO()
        Image.fromarray((rng.random((72, 96, 3)) * 255).astype("uint8")).save(buf, "PNG")
        part = {"type": "image", "image": {"data": buf.getvalue()}}
        return part, dict(processor(images=[decode_image(part)], return_tensors="pt"))
    clip = encode_mp4((rng.random((25, 48, 64, 3)) * 255).astype("uint8"), 10)
    part = {"type": "video", "video": {"data": clip}}
    frames, rate = decode_video(part, processor)
    patches, grid = video_patches(processor, frames)
    return part, {"pixel_values_videos": patches, "video_grid_thw": grid,
                  "video_second_per_grid": torch.tensor([2 / rate])}


@pytest.mark.parametrize("kind", ["image", "video"])
def test_visual_prompt_frames_equal_transformers_generate(omni_dir, thinker, talker, kind):
    """An image or a 2.5 s video in the second user turn (after a system and an assistant
    turn, which the talker does not hear): the talker's 3-axis positions are rebuilt from
    the thinker's and the frames equal transformers' composite generate given the same
    pixels."""
    part, pixels = _visual_part(kind, thinker.lm.media.images)
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]
    outs = thinker_outputs(thinker, messages)
    prompt_ids = outs[0][0]["prompt_token_ids"]
    assert "prompt_rope_positions" in outs[0][0]
    frames = run_talker(talker, {kind: outs}, max_tokens=12)[kind]
    hf_answer, hf = hf_codes(omni_dir, prompt_ids, 8, 12, **pixels)
    assert [t for data, _ in outs for t in data["token_ids"]] == hf_answer
    assert torch.equal(torch.tensor(frames).T[:, :11], hf)


def test_batched_and_streamed_equal_alone(thinker, talker):
    feeds = {f"q{i}": thinker_outputs(thinker, q, max_tokens=6 + 4 * i)
             for i, q in enumerate(QUESTIONS)}
    together = run_talker(talker, feeds, max_tokens=10)
    for rid, outs in feeds.items():
        alone = run_talker(talker, {rid: outs}, max_tokens=10, interleave=False)
        assert together[rid] == alone[rid] and len(alone[rid]) >= 5


@pytest.mark.parametrize("overlap", [False, True])
def test_talker_waits_for_words_not_yet_written(omni_dir, thinker, talker, overlap):
    if overlap:
        talker = FeedbackAREngine(TALKER, omni_dir, options={"overlap_steps": True})
    outs = thinker_outputs(thinker, QUESTIONS[1], max_tokens=8)
    talker.add(EngineRequest("w", {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 40}))
    talker.add(EngineRequest("x", {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 40}))
    assert not talker.has_work()  # no prompt yet: nothing to run

    def frames() -> int:
        made = 0
        while talker.has_work():
            made += sum(1 for o in talker.step() if o.data and o.data.get("codes"))
        return made
    # the thinker's first output: the prompt and the first answer word, enough for the
    # prefill and its frame; decode step g needs word g + 1, so then it holds
    talker.append("w", "thinker", 0, outs[0][0], False)
    assert frames() == 1 and not talker.has_work()
    talker.append("w", "thinker", 1, outs[1][0], False)
    assert frames() == 1 and not talker.has_work()
    talker.abort(["x"])
    talker.abort(["w"])
    assert talker.stats()["kv_blocks_used"] == 0


def test_sampling_with_seed_reproduces(thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=5)
    params = {"temperature": 0.9, "top_k": 50, "seed": 11}
    one = run_talker(talker, {"s": outs}, max_tokens=8, params=params)["s"]
    two = run_talker(talker, {"s": outs}, max_tokens=8, params=params)["s"]
    three = run_talker(talker, {"s": outs}, max_tokens=8, params={**params, "seed": 12})["s"]
    assert one == two and one != three


def test_ignore_eos_makes_a_frame_every_step(thinker, talker):
    """Fixed-length speech (benchmarks): with ignore_eos the end code is never drawn, so
    max_tokens steps give max_tokens frames. Hot sampling over 10 requests x 40 steps
    draws the end code (about 1 in 65 per step here) unless it is masked."""
    outs = thinker_outputs(thinker, QUESTIONS[1], max_tokens=4)
    feeds = {f"r{i}": outs for i in range(10)}
    params = {"temperature": 3.0, "top_k": 0, "ignore_eos": True}
    frames = run_talker(talker, feeds, max_tokens=40, params=params)
    assert all(len(f) == 40 for f in frames.values()), {r: len(f) for r, f in frames.items()}


def test_bad_inputs_fail_alone(thinker, talker):
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=4)
    talker.add(EngineRequest("v", {"stream": ["thinker"]}, {"voice": "nobody"}))
    talker.add(EngineRequest("h", {"stream": ["thinker"]}, {}))
    talker.append("h", "thinker", 0, {"token_ids": [1], "hidden_states": torch.zeros(3, 5)},
                  False)
    talker.add(EngineRequest("o", {"stream": ["thinker"]}, {}))
    talker.append("o", "thinker", 3, outs[0][0], False)  # out of order
    errors = {o.request_id: o.error for o in talker.step() if o.error}
    assert "unknown voice 'nobody'" in errors["v"] and "ethan" in errors["v"]
    assert "hidden_states" in errors["h"] and "expected 0" in errors["o"]
    assert talker.stats()["running"] == 0 and talker.stats()["waiting"] == 0
    assert run_talker(talker, {"ok": outs}, max_tokens=3)["ok"]  # the engine goes on


def test_loaded_talker_weights_equal_saved(omni_dir):
    lm, feed = load_talker(model_dir=omni_dir, device="cpu", dtype="auto")
    saved, table = {}, None
    for shard in sorted(__import__("pathlib").Path(omni_dir).glob("model-*.safetensors")):
        tensors = load_file(str(shard))
        saved.update({k.removeprefix("talker."): v for k, v in tensors.items()
                      if k.startswith("talker.")})
        table = tensors.get("thinker.model.embed_tokens.weight", table)
    # the thinker's embeddings, with which the talker embeds the answer tokens
    assert torch.equal(lm.model.thinker_embed.weight.to(table.dtype), table)
    state = lm.model.talker.state_dict()
    fused = fuse_experts(saved)
    assert set(state) == set(fused)
    for key, value in fused.items():
        assert torch.equal(state[key].to(value.dtype), value), key
    assert [v["id"] for v in feed.info()["voices"]] == ["ethan"]


def test_overlapped_steps_give_the_same_frames(omni_dir, thinker, talker):
    over = FeedbackAREngine(TALKER, omni_dir, options={"overlap_steps": True})
    feeds = {f"q{i}": thinker_outputs(thinker, q, max_tokens=6 + 4 * i)
             for i, q in enumerate(QUESTIONS)}
    got = run_talker(over, feeds, max_tokens=10)
    assert got == run_talker(talker, feeds, max_tokens=10) and len(got["q0"]) >= 5
    assert not over.has_work() and over.stats()["kv_blocks_used"] == 0


def test_answer_tokens_are_projected_once_per_step_not_per_message(thinker, talker):
    """A thinker token arrives as one message per request; the talker projects what its
    step needs in one batched call (a projection launched per message, each after a
    host-to-device copy, cost the talker's main thread most of its time at concurrency 32
    on an H200), and the frames are those of a talker fed everything at once."""
    outs = thinker_outputs(thinker, QUESTIONS[1], max_tokens=8)
    calls = []
    hook = talker.feed.lm.talker.text_projection.register_forward_hook(
        lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        for rid in ("a", "b", "c"):  # the prompt is built (projected) on the first word
            talker.add(EngineRequest(rid, {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 6}))
            talker.append(rid, "thinker", 0, outs[0][0], False)
            talker.append(rid, "thinker", 1, outs[1][0], False)
        calls.clear()
        for i, (data, last) in enumerate(outs[2:], start=2):
            for rid in ("a", "b", "c"):
                talker.append(rid, "thinker", i, data, last)
        assert calls == []  # nothing projected on arrival
        frames: dict[str, list] = {"a": [], "b": [], "c": []}
        while talker.has_work():
            before = len(calls)
            for o in talker.step():
                if o.data and o.data.get("codes"):
                    frames[o.request_id].append([c[0] for c in o.data["codes"]])
            assert len(calls) - before <= 1
        assert calls[0] == 3 * (len(outs) - 2)  # every waiting word, all three requests
    finally:
        hook.remove()
    assert frames["a"] == frames["b"] == frames["c"]
    assert frames["a"] == run_talker(talker, {"x": outs}, max_tokens=6, interleave=False)["x"]


def test_full_delivery_equals_streamed(thinker, talker):
    """Full delivery (every thinker output in the ADD, taken at once) speaks the same frames
    as the same outputs streamed one per step; an empty one fails alone."""
    outs = thinker_outputs(thinker, QUESTIONS[1], max_tokens=9)
    streamed = run_talker(talker, {"s": outs}, max_tokens=10)["s"]
    talker.add(EngineRequest("f", {"thinker": [data for data, _ in outs]},
                             {**GREEDY, "max_tokens": 10}))
    talker.add(EngineRequest("e", {"thinker": []}, GREEDY))
    frames, errors = [], {}
    while talker.has_work():
        for o in talker.step():
            if o.error:
                errors[o.request_id] = o.error
            elif o.data and o.data.get("codes"):
                frames.append([c[0] for c in o.data["codes"]])
    assert frames == streamed and len(frames) >= 5
    assert set(errors) == {"e"} and "hidden_states" in errors["e"]


def _layout_per_position(rope: torch.Tensor, keep: list[int], tail: int):
    """The rule talker_layout follows, one position at a time (its first version)."""
    rows, next_pos, prev, shift = [], 0.0, None, 0.0
    for i in keep:
        if prev is None or i != prev + 1:
            shift = float(rope[:, i].min()) - next_pos
        rows.append(rope[:, i] - shift)
        next_pos = max(next_pos, float(rows[-1].max()) + 1)
        prev = i
    tail_pos = (torch.arange(tail, dtype=rope.dtype) + next_pos).expand(3, tail)
    return torch.cat([torch.stack(rows, 1)] * bool(rows) + [tail_pos], 1), next_pos - len(keep)


@pytest.mark.parametrize("seed", range(6))
def test_talker_layout_runs_equal_the_per_position_rule(seed):
    """Slicing whole runs of kept positions gives the positions the per-position rule
    gives, for prompts with media blocks (3 differing rows) and dropped segments."""
    from omni.models.qwen3_omni_talker import talker_layout

    gen = torch.Generator().manual_seed(seed)
    n = 300
    rope = torch.cumsum(torch.randint(0, 3, (3, n), generator=gen), 1).float()
    keep = sorted(torch.randperm(n, generator=gen)[:int(torch.randint(0, n, (1,),
                                                                      generator=gen))].tolist())
    keep = keep if seed % 3 else list(range(5, n))  # a plain dropped system turn too
    layout = talker_layout(rope, keep, 9)
    want, delta = _layout_per_position(rope, keep, 9)
    assert torch.equal(layout.rope, want) and layout.rope_delta == delta


def test_a_tool_call_in_the_answer_is_not_heard(thinker, talker):
    """The thinker's answer with a tool call in it (its ids as the thinker's tokenizer
    writes them, tags included): the talker projects (hears) the answer's words only and
    speaks the frames of the answer without the call. The same ids as plain words are
    heard, so the count can fail (the tiny talker's greedy frames barely depend on the
    words: the count is the sharp check)."""
    outs = thinker_outputs(thinker, QUESTIONS[0], max_tokens=8)
    encode = thinker.lm.tokenizer.encode
    call = encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
                  add_special_tokens=False)
    words = encode(" get_time arguments", add_special_tokens=False)
    rows = []
    hook = talker.feed.lm.talker.text_projection.register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[0]))

    def heard(ids: list[int]) -> tuple[int, list]:
        extra = [({"token_ids": [t], "finish_reason": None}, False) for t in ids]
        rows.clear()
        frames = run_talker(talker, {"x": outs[:3] + extra + outs[3:]}, max_tokens=30)["x"]
        return sum(rows), frames
    try:
        plain, with_words, with_call = heard([]), heard(words), heard(call)
    finally:
        hook.remove()
    assert with_words[0] == plain[0] + len(words)
    assert with_call == plain
