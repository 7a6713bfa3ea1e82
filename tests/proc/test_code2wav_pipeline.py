"""A codec source streams codes to the tiny Qwen3-Omni code2wav, through real processes:
codes and audio travel through the connector (audio chunks over the shared-memory arena),
the streamed audio equals the engine run in-process on the same chunks, and nothing is
left in /dev/shm once the pipeline stops."""

from __future__ import annotations

import asyncio
import glob

import pytest
import torch
from procutil import Tap, assert_idle, collect, run, serving

from omni.config.pipeline import parse_pipeline
from omni.engines.base import EngineRequest
from omni.engines.generation.build import build_generation_engine
from omni.errors import RequestAbortedError
from omni.fixtures.tiny_models import ensure_tiny_model

# 16 frames x 1920 samples x 4 bytes = 120 KiB per audio chunk: above the inline
# threshold (64 KiB), so audio rides the shared-memory arena.
C2W_OPTIONS = {"chunk_frames": 16, "first_chunk_frames": 16, "left_context": 8}
NQ, CODEBOOK, FRAMES, SOURCE_CHUNKS = 4, 64, 48, 6


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory) -> str:
    return str(ensure_tiny_model("qwen3_omni", tmp_path_factory.getbasetemp() / "models"))


def pipeline(model_dir: str):
    return parse_pipeline({"name": "codec", "stages": [
        {"name": "src", "engine": "echo", "params": {"chunks": SOURCE_CHUNKS}},
        {"name": "c2w", "engine": "generation", "model": "qwen3_omni_code2wav",
         "model_dir": model_dir, "final_output": "audio", "options": C2W_OPTIONS},
    ], "edges": [{"from": "src", "to": "c2w", "delivery": "stream"}]})


def codes(seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK, (NQ, FRAMES), generator=torch.Generator().manual_seed(seed))


def reference_audio(model_dir: str, source: torch.Tensor) -> torch.Tensor:
    """The same engine in this process, fed the same appends the source stage makes."""
    engine = build_generation_engine("qwen3_omni_code2wav", model_dir=model_dir, device="cpu",
                                     dtype="auto", options=C2W_OPTIONS)
    engine.add(EngineRequest("r", {"stream": ["src"]}, {}))
    pieces = torch.tensor_split(source, SOURCE_CHUNKS, dim=1)
    for seq, piece in enumerate(pieces):
        engine.append("r", "src", seq, {"codes": piece}, seq == len(pieces) - 1)
    chunks = []
    while engine.has_work():
        chunks += [o.data["audio"] for o in engine.step() if "audio" in (o.data or {})]
    return torch.cat(chunks)


def _audio(outputs) -> torch.Tensor:
    return torch.cat([o.data["audio"] for o in outputs  # a closing output has no audio
                      if o.modality == "audio" and "audio" in (o.data or {})])


def _arenas(prefix: str) -> list[str]:
    return glob.glob(f"/dev/shm/{prefix}*")


def test_streamed_codes_become_the_same_audio_through_processes(omni_dir):
    async def body():
        async with serving(pipeline(omni_dir)) as omni:
            prefix = omni.orchestrator.engines.arena_prefix
            tap = Tap(omni)
            sources = [codes(seed) for seed in range(3)]
            results = await asyncio.gather(*(
                collect(omni.generate({"codes": s.tolist()}, request_id=f"r{i}"))
                for i, s in enumerate(sources)))
            for source, outputs in zip(sources, results, strict=True):
                streamed = _audio(outputs)
                expected = reference_audio(omni_dir, source)
                assert streamed.shape == expected.shape
                scale = float(expected.abs().max()) or 1.0
                assert float((streamed - expected).abs().max()) / scale < 1e-4
            stats = [r.stats for r in tap.rows if r.stage == "c2w"][-1]
            assert stats["shm_puts"] > 0, "audio chunks should have used the arena"
            assert _arenas(prefix), "the producer's arena exists while it runs"
            assert_idle(omni)
        assert not _arenas(prefix), "arenas are unlinked when the pipeline stops"
    run(body(), timeout_s=60)


def test_abort_mid_stream_frees_payloads(omni_dir):
    async def body():
        async with serving(pipeline(omni_dir)) as omni:
            prefix = omni.orchestrator.engines.arena_prefix
            tap = Tap(omni)
            task = asyncio.create_task(collect(omni.generate(
                {"codes": codes(7).tolist()}, request_id="x",
                params={"src": {"chunks": FRAMES}})))
            await tap.first(lambda r: r.request_id == "x" and r.stage == "c2w")
            await omni.abort("x")
            with pytest.raises(RequestAbortedError):
                await task
            outputs = await collect(omni.generate({"codes": codes(8).tolist()}))
            assert outputs[-1].finished
            assert_idle(omni)
        assert not _arenas(prefix)
    run(body(), timeout_s=60)
