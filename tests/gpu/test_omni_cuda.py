"""Qwen3-Omni's thinker and talker on CUDA (tiny random model, bfloat16): decode replayed
from CUDA graphs gives what eager decode gives, for the thinker exporting its prompt's
hidden states (auto) or every position's (text and image prompts: rotary deltas in the
graph) and for the talker (decode fed embeddings, code-predictor loop captured).

bfloat16, the serving dtype: in float32 the MoE thinker's capture failed on the H200
(a host copy inside transformers' experts path during capture), so it decoded eagerly
after the engine's warning. Without torch.compile, graphed and eager steps run the same
kernels (the attention kernel plans splits from bucketed shapes), so tokens are equal.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return str(ensure_tiny_model("qwen3_omni", tmp_path_factory.getbasetemp() / "models"))


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    pixels = (np.random.default_rng(0).random((64, 96, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def _thinker_outputs(engine: AREngine, content, max_tokens: int = 12) -> list:
    engine.add(EngineRequest("t", {"messages": [{"role": "user", "content": content}]},
                             {**GREEDY, "max_tokens": max_tokens}))
    outs = []
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            outs.append((o.data, o.finished))
    return outs


def _thinker(omni_dir: str, export="auto", **options) -> AREngine:
    return AREngine(omni_dir, device="cuda", dtype="bfloat16",
                    options={"export_hidden_layers": export, **options})


# auto: the prompt's rows only, decode graphs export nothing (and greedy text decode
# chains); [0, 1]: every position, so the graphs export their rows too
@pytest.mark.parametrize("export", ["auto", [0, 1]])
@pytest.mark.parametrize("content", ["Tell me about the sea.", "image"])
def test_thinker_graphs_equal_eager_while_exporting(omni_dir, content, export):
    if content == "image":
        content = [{"type": "image", "image": {"data": _png()}},
                   {"type": "text", "text": "What is it?"}]
    eager = _thinker_outputs(_thinker(omni_dir, export, cuda_graphs=False), content)
    graphed_engine = _thinker(omni_dir, export, compile_decode=False)
    graphed = _thinker_outputs(graphed_engine, content)
    assert graphed_engine.graphs is not None and graphed_engine.graphs.replays > 0
    assert [d["token_ids"] for d, _ in graphed] == [d["token_ids"] for d, _ in eager]
    rows = [0 if g.get("hidden_states") is None else len(g["hidden_states"])
            for g, _ in graphed]
    assert rows[1:] == [0 if export == "auto" else 1] * (len(rows) - 1)
    for (g, _), (e, _) in zip(graphed, eager, strict=True):
        if e.get("hidden_states") is not None:
            torch.testing.assert_close(g["hidden_states"], e["hidden_states"])


def test_talker_graphs_equal_eager(omni_dir):
    feed = _thinker_outputs(_thinker(omni_dir, cuda_graphs=False), "Say hello to the world")
    frames = {}
    for mode, options in (("eager", {"cuda_graphs": False, "feed_cuda_graphs": False}),
                          ("graphs", {"compile_decode": False})):
        talker = FeedbackAREngine("qwen3_omni_talker", omni_dir, device="cuda",
                                  dtype="bfloat16", options=options)
        talker.add(EngineRequest("a", {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 16}))
        for seq, (data, last) in enumerate(feed):
            talker.append("a", "thinker", seq, data, last)
        got = []
        while talker.has_work():
            for o in talker.step():
                assert o.error is None, o.error
                if o.data and o.data.get("codes"):
                    got.append([c[0] for c in o.data["codes"]])
        if mode == "graphs":
            assert talker.graphs is not None and talker.graphs.replays > 0
            assert talker.feed.graphs is not None
        frames[mode] = got
    assert len(frames["eager"]) == 16 and frames["graphs"] == frames["eager"]


def test_code2wav_sizes_its_calls_from_its_memory_budget(omni_dir):
    """A code2wav stage with a memory budget measures a call at load and takes as many
    frames a call as fit: what it holds after loading (the warm-up call included) stays
    within the budget, and a budget too small for one row fails the load, naming the
    least that would do."""
    from omni.engines.base import EngineLoadError
    from omni.engines.generation.build import build_generation_engine

    def build(budget: int):
        return build_generation_engine("qwen3_omni_code2wav", model_dir=omni_dir, device="cuda",
                                       dtype="bfloat16", options={}, memory_bytes=budget)

    import gc

    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    engine = build(base + (256 << 20))  # the budget counts what this process held before
    frames = engine.max_batch_frames
    assert engine.longest_row <= frames <= 64 * engine.longest_row
    assert engine.info()["max_batch_frames"] == frames
    assert torch.cuda.memory_reserved() <= base + (256 << 20)
    total = min(frames, 3000)
    engine.add(EngineRequest("r", {"codes": [[1] * total] * engine.runner.c2w.num_quantizers}))
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
    assert torch.cuda.memory_reserved() <= base + (256 << 20)  # trimmed after a call if not
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    with pytest.raises(EngineLoadError, match=r"too small.*give it at least"):
        build(torch.cuda.memory_reserved() + (1 << 20))
