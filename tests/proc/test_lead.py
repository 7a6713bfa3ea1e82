"""Lead control (edge option max_lead, omni/runtime/lead.py) on the tiny Qwen3-Omni, through real
processes: the thinker never runs more than the lead ahead of the talker's frames, the
answer is the same as without a lead, a text-only request is never held, and the limit
is lifted when the talker finishes."""

from __future__ import annotations

import asyncio

import pytest
import torch
from procutil import Tap, assert_idle, collect, run, serving

from omni.config.pipeline import parse_pipeline
from omni.fixtures.tiny_models import ensure_tiny_model

LEAD, FRAMES, TOKENS = 3, 10, 16  # the thinker writes more than the talker speaks
SAMPLING = {"temperature": 1.0, "seed": 7, "ignore_eos": True}


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory) -> str:
    return str(ensure_tiny_model("qwen3_omni", tmp_path_factory.getbasetemp() / "models"))


def pipeline(model_dir: str, lead: int | None):
    edge = {"from": "thinker", "to": "talker", "delivery": "stream"}
    return parse_pipeline({"name": "omni", "default_modalities": ["text"], "stages": [
        {"name": "thinker", "engine": "ar", "model_dir": model_dir, "final_output": "text",
         "options": {"export_hidden_layers": "auto"}, "params": {"max_tokens": TOKENS}},
        {"name": "talker", "engine": "ar", "model": "qwen3_omni_talker",
         "model_dir": model_dir, "params": {"max_tokens": FRAMES, "ignore_eos": True}},
        {"name": "code2wav", "engine": "generation", "model": "qwen3_omni_code2wav",
         "model_dir": model_dir, "final_output": "audio",
         "options": {"first_chunk_frames": 2, "chunk_frames": 4, "left_context": 4}},
    ], "edges": [edge if lead is None else {**edge, "max_lead": lead},
                 {"from": "talker", "to": "code2wav", "delivery": "stream"}],
        "outputs": {"text": ["thinker"], "audio": ["code2wav"]}})


def answer(omni, rid: str, modalities=("text", "audio")):
    params = {"thinker": SAMPLING, "talker": {"voice": "ethan", "seed": 7}}
    return collect(omni.generate({"messages": [{"role": "user", "content": "The sea?"}]},
                                 modalities=list(modalities), params=params, request_id=rid))


def text(outputs) -> str:
    return "".join(o.data.get("text", "") for o in outputs if o.data and o.modality == "text")


def audio(outputs) -> torch.Tensor:
    return torch.cat([o.data["audio"] for o in outputs  # a closing output has no audio
                      if o.modality == "audio" and "audio" in (o.data or {})])


def codes(tap: Tap, rid: str) -> list:
    return [r.data["codes"] for r in tap.of(rid, "talker") if r.data and "codes" in r.data]


def assert_same_audio(got: torch.Tensor, want: torch.Tensor) -> None:
    """Batched with other requests, the decode's float sums may differ in the last bits."""
    assert got.shape == want.shape
    scale = float(want.abs().max()) or 1.0
    assert float((got - want).abs().max()) / scale < 1e-4


def test_thinker_keeps_its_lead_and_says_the_same(omni_dir):
    async def body():
        async with serving(pipeline(omni_dir, None)) as free:
            free_tap = Tap(free)
            want = await answer(free, "a")
        async with serving(pipeline(omni_dir, LEAD)) as held:
            tap = Tap(held)
            got = await asyncio.gather(answer(held, "a"), answer(held, "b"),
                                       answer(held, "t", modalities=("text",)))
            assert text(got[0]) == text(got[1]) == text(got[2]) == text(want)  # t: never held
            assert codes(tap, "a") == codes(tap, "b") == codes(free_tap, "a")
            assert len(codes(tap, "a")) >= FRAMES - 2
            assert_same_audio(audio(got[0]), audio(want))
            assert_same_audio(audio(got[1]), audio(want))
            for rid in ("a", "b"):
                written = frames = 0
                for row in tap.rows:
                    if row.request_id != rid or row.data is None:
                        continue
                    if row.stage == "thinker":
                        written += len(row.data["token_ids"])
                        assert written <= frames + LEAD or frames == FRAMES, (rid, written)
                    elif row.stage == "talker":
                        frames += 1
                assert (written, frames) == (TOKENS, FRAMES)  # lifted once the talker ended
            assert held.orchestrator.leads.updates_sent >= 2 * FRAMES
            assert not held.orchestrator.leads._pending
            assert_idle(held)
    run(body(), timeout_s=180)
