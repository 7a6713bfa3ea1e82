"""The packaged Piper voice as a generation stage, through a real engine process: each
sentence streams out as its own audio chunk, in order, and speed reaches the model."""

from __future__ import annotations

import time

import pytest
import torch
from procutil import assert_idle, run, serving

from omni.config.presets import load_pipeline
from omni.errors import RequestFailedError

TEXT = "The first sentence is short. Here comes the second one. And this is the third."


async def _chunks(omni, text: str, speed: float = 1.0) -> list[tuple[float, dict]]:
    got = []
    async for out in omni.generate({"text": text}, params={"*": {"speed": speed}}):
        if out.data and out.data.get("samples"):
            got.append((time.monotonic(), out.data))
    return got


@pytest.mark.parametrize("preset", ["piper", "piper_split"])
def test_sentences_stream_as_audio_chunks_in_order(preset):
    async def body():
        async with serving(load_pipeline(preset)) as omni:
            chunks = await _chunks(omni, TEXT)
            assert [d["index"] for _, d in chunks] == [0, 1, 2]
            assert omni.output_info("audio")["voices"][0]["id"] == "en_US-joe-medium"
            for _, data in chunks:
                audio = data["audio"]
                assert audio.dtype == torch.float32 and data["sample_rate"] == 22050
                assert audio.numel() == data["samples"] > 0.3 * 22050
                assert float(audio.pow(2).mean().sqrt()) > 1e-3  # a voice, not silence
            # streamed: the first sentence was out before the last was synthesised. Arrival
            # times of chunks that came together differ by the loop's turns (well under a
            # millisecond); a sentence takes Piper ~100 ms or more here, so 30 ms apart
            # means the last one was still being made when the first arrived
            assert chunks[-1][0] - chunks[0][0] > 0.03, [t for t, _ in chunks]
            fast = await _chunks(omni, TEXT, speed=2.0)
            total = sum(d["samples"] for _, d in chunks)
            assert sum(d["samples"] for _, d in fast) < 0.8 * total
            assert_idle(omni)
    run(body(), timeout_s=60)


@pytest.mark.parametrize("preset", ["piper", "piper_split"])
def test_bad_speed_fails_only_that_request(preset):
    async def body():
        async with serving(load_pipeline(preset)) as omni:
            with pytest.raises(RequestFailedError, match="speed"):
                await _chunks(omni, "Hello.", speed=9.0)
            assert len(await _chunks(omni, "Hello there.")) == 1
    run(body(), timeout_s=60)
