"""Qwen3-TTS with staggered arrivals: time to first audio of requests that arrive while
another's sentence is being synthesized (continuous batching: they join the running call
at the next step instead of waiting for its end).

`python -m omni.server` with one fused Qwen3-TTS stage (the tiny random CustomVoice
fixture unless --model), greedy, --frames codec frames per sentence (one sentence per
request). A warm-up request measures one sentence's synthesis alone (W); then C requests
start GAP apart (default W / C: all of them arrive within the first one's sentence), each
streamed (stream_format=audio, pcm); its first audio counts from its own start.

    OMP_NUM_THREADS=1 python bench/probes/qwen3_tts_stagger.py [--concurrency 8]
        [--frames 100] [--gap-s GAP] [--model DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.qwen3_tts import fixture_dir, start_server  # noqa: E402 - after the path

TEXT = "The ship sailed north across the cold sea, carrying wheat, wool, iron and passengers."
PIPELINE = """\
name: qwen3-tts
default_modalities: [audio]
stages:
  - name: tts
    engine: generation
    model: qwen3_tts
    model_dir: {model_dir}
    env: qwen3-tts
    final_output: audio
    options: {{max_new_tokens: {frames}, do_sample: false, subtalker_dosample: false,
               max_batch_size: 64, openai_voices: true}}
"""


async def _one(session: Any, url: str, delay: float) -> dict[str, float]:
    """One request started ``delay`` seconds from now: its first audio and its end, from
    its own start."""
    await asyncio.sleep(delay)
    body = {"model": "qwen3-tts", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "stream_format": "audio"}
    start, first, size = time.monotonic(), None, 0
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            first = time.monotonic() - start if first is None else first
            size += len(chunk)
    return {"first_audio_s": first or 0.0, "total_s": time.monotonic() - start,
            "audio_s": size / 2 / 24_000}


async def _run(port: int, concurrency: int, gap: float | None) -> dict[str, Any]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/audio/speech"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        await _one(session, url, 0.0)  # warm-up
        alone = await _one(session, url, 0.0)
        gap = alone["total_s"] / concurrency if gap is None else gap
        runs = await asyncio.gather(*(_one(session, url, i * gap) for i in range(concurrency)))
    late = [r["first_audio_s"] for r in runs[1:]]
    return {"concurrency": concurrency, "gap_s": gap, "alone": alone, "requests": runs,
            "late_first_audio_p50_s": statistics.median(late) if late else None,
            "late_first_audio_max_s": max(late) if late else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--gap-s", type=float, default=None)
    parser.add_argument("--model", default="")
    parser.add_argument("--shape", default="tiny", choices=("tiny", "release"),
                        help="without --model: the random fixture's shapes (release: the "
                        "1.7B's, built on cuda; bench qwen3_tts --shape)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="probe-qwen3-tts-"))
    yaml_path = work / "qwen3-tts.yaml"
    yaml_path.write_text(PIPELINE.format(model_dir=fixture_dir(args.model, False, args.shape),
                                         frames=args.frames))
    proc, port = start_server(yaml_path, work / "server.log")
    try:
        report = asyncio.run(_run(port, args.concurrency, args.gap_s))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"alone: first audio {report['alone']['first_audio_s']:.3f} s, sentence "
          f"{report['alone']['total_s']:.3f} s; c={args.concurrency} every "
          f"{report['gap_s']:.3f} s: late arrivals' first audio p50 "
          f"{report['late_first_audio_p50_s']:.3f} s, max {report['late_first_audio_max_s']:.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
