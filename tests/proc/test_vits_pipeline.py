"""The tiny VITS (transformers VitsModel, torch) as a generation stage, through a real
engine process: a pipeline file written here, each sentence streamed as its own audio
output, in order, at the voice's 16 kHz."""

from __future__ import annotations

import asyncio

import pytest
import torch
from procutil import assert_idle, run, serving

from omni.config.presets import load_pipeline
from omni.fixtures.tiny_vits import build_tiny_vits

TEXT = "The first sentence is short. Here comes the second one. And this is the third."
PIPELINE = """\
name: vits
default_modalities: [audio]
stages:
  - name: tts
    engine: generation
    model: vits
    model_dir: {model_dir}
    options: {{noise_scale: 0.0, noise_scale_duration: 0.0}}
    final_output: audio
"""


@pytest.fixture(scope="module")
def pipeline_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("vits")
    model_dir = build_tiny_vits(root / "tiny-vits")
    path = root / "vits.yaml"
    path.write_text(PIPELINE.format(model_dir=model_dir))
    return path


async def _audio(omni, text: str, **params) -> list[dict]:
    return [out.data async for out in omni.generate({"text": text}, params={"tts": params})
            if out.data and out.data.get("samples")]


def test_sentences_stream_as_audio_in_order(pipeline_file):
    async def body():
        async with serving(load_pipeline(pipeline_file)) as omni:
            chunks = await _audio(omni, TEXT)
            assert [d["index"] for d in chunks] == [0, 1, 2]
            for data in chunks:
                audio = data["audio"]
                assert audio.dtype == torch.float32 and data["sample_rate"] == 16000
                assert audio.numel() == data["samples"] > 0.3 * 16000
                assert float(audio.abs().max()) <= 1.0
                assert data["output_tokens"] == data["samples"] // 256
            # two concurrent requests: same audio as alone (batched rows are trimmed exactly)
            both = await asyncio.gather(_audio(omni, TEXT), _audio(omni, "Hello there."))
            for a, b in zip(both[0], chunks, strict=True):
                assert torch.allclose(a["audio"], b["audio"], atol=1e-4)
            assert len(both[1]) == 1
            assert_idle(omni)
    run(body(), timeout_s=60)
