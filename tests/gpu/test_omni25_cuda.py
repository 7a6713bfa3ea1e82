"""Qwen2.5-Omni on CUDA (tiny random model): the thinker (bfloat16) exporting every
position's rows and the talker (bfloat16, fed embeddings) decode the same from CUDA graphs
as eagerly, and token2wav (float32) on the GPU equals transformers' Token2Wav there for
the same seed (both draw the DiT's noise from the CUDA generator), whole and streamed in
chunks with left context."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.ar.feedback import FeedbackAREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def omni25_dir(tmp_path_factory):
    return str(ensure_tiny_model("qwen2_5_omni", tmp_path_factory.getbasetemp() / "models"))


def _thinker_outputs(engine: AREngine, content: str, max_tokens: int = 12) -> list:
    engine.add(EngineRequest("t", {"messages": [{"role": "user", "content": content}]},
                             {**GREEDY, "max_tokens": max_tokens}))
    outs = []
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            outs.append((o.data, o.finished))
    return outs


def _thinker(omni25_dir: str, **options) -> AREngine:
    return AREngine(omni25_dir, device="cuda", dtype="bfloat16",
                    options={"export_hidden_layers": "auto", **options})


def test_thinker_graphs_equal_eager_while_exporting_every_row(omni25_dir):
    eager = _thinker_outputs(_thinker(omni25_dir, cuda_graphs=False), "Tell me about the sea.")
    engine = _thinker(omni25_dir, compile_decode=False)
    graphed = _thinker_outputs(engine, "Tell me about the sea.")
    assert engine.graphs is not None and engine.graphs.replays > 0
    assert [d["token_ids"] for d, _ in graphed] == [d["token_ids"] for d, _ in eager]
    for (g, _), (e, _) in zip(graphed, eager, strict=True):
        if e.get("hidden_states") is not None:  # the talker's rows: every decode step's too
            torch.testing.assert_close(g["hidden_states"], e["hidden_states"])


def test_talker_graphs_equal_eager(omni25_dir):
    feed = _thinker_outputs(_thinker(omni25_dir, cuda_graphs=False), "Say hello", 4)
    frames = {}
    for mode, options in (("eager", {"cuda_graphs": False}), ("graphs", {"compile_decode": False})):
        talker = FeedbackAREngine("qwen2_5_omni_talker", omni25_dir, device="cuda",
                                  dtype="bfloat16", options=options)
        talker.add(EngineRequest("a", {"stream": ["thinker"]}, {**GREEDY, "max_tokens": 16}))
        for seq, (data, last) in enumerate(feed):
            talker.append("a", "thinker", seq, data, last)
        got = []
        while talker.has_work():
            for o in talker.step():
                assert o.error is None, o.error
                if o.data and o.data.get("codes"):
                    got.append(o.data["codes"][0][0])
        if mode == "graphs":
            assert talker.graphs is not None and talker.graphs.replays > 0
        frames[mode] = got
    assert len(frames["eager"]) == 16 and frames["graphs"] == frames["eager"]


def test_token2wav_on_cuda_equals_transformers(omni25_dir):
    from transformers import Qwen2_5OmniForConditionalGeneration

    from omni.models import build_runner

    runner = build_runner("qwen2_5_omni_token2wav", model_dir=omni25_dir, device="cuda",
                          dtype="auto", options={"seed": 2})
    codes = torch.tensor([list(range(3, 43)), [1] * 40])
    wav = runner.run(codes[None], [0])[0]
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir,
                                                                dtype=torch.float32)
    t2w = model.token2wav.to("cuda").float()
    spk = model.speaker_map["Ethan"]
    torch.manual_seed(2)
    ref = t2w(codes[:1].cuda(), conditioning=spk["cond"][None].float().cuda(),
              reference_mel=spk["ref_mel"].float().cuda())
    assert wav.abs().max() > 0.05
    torch.testing.assert_close(wav, ref.reshape(-1).cpu(), atol=1e-4, rtol=0)


def streamed_chunks_equal_transformers(omni25_dir: str, device: str) -> None:
    """Codes streamed one a step into token2wav (chunks of 8, then 16, after up to 4 earlier
    codes): each chunk equals transformers' Token2Wav on ``device`` over its codes, seeded."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    from omni.engines.generation.engine import GenerationEngine
    from omni.models import build_runner

    engine = GenerationEngine(build_runner(
        "qwen2_5_omni_token2wav", model_dir=omni25_dir, device=device, dtype="auto",
        options={"seed": 2, "first_chunk_frames": 8, "chunk_frames": 16, "left_context": 4}))
    codes = [(5 * i + 3) % 64 for i in range(40)]
    engine.add(EngineRequest("s", {"stream": ["talker"]}, {}))
    pieces = []
    for i, code in enumerate(codes):
        engine.append("s", "talker", i, {"codes": [[code], [1]]}, i == len(codes) - 1)
        while engine.has_work():
            pieces += [o.data["audio"] for o in engine.step() if o.data.get("samples")]
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(omni25_dir, dtype=torch.float32)
    t2w = model.token2wav.to(device).float()
    spk = model.speaker_map[list(model.speaker_map)[1]]
    cond = {"conditioning": spk["cond"][None].float().to(device),
            "reference_mel": spk["ref_mel"].float().to(device)}
    bounds = [(0, 0, 8), (4, 8, 24), (20, 24, 40)]  # (context start, start, end)
    assert len(pieces) == len(bounds)
    for piece, (ctx, start, end) in zip(pieces, bounds, strict=True):
        torch.manual_seed(2)
        with torch.no_grad():
            ref = t2w(torch.tensor([codes[ctx:end]], device=device), **cond)
        want = ref.reshape(-1).cpu()[(start - ctx) * 480:]
        assert want.abs().max() > 0.05
        torch.testing.assert_close(piece, want, atol=1e-4, rtol=0)


def test_streamed_token2wav_on_cuda_equals_transformers(omni25_dir):
    streamed_chunks_equal_transformers(omni25_dir, "cuda")
