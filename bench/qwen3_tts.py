"""Qwen3-TTS served by omni: audio-seconds per second at concurrency c, time to first audio.

DESCRIPTION is the --help text; the report (qwen3-tts.md) repeats the method.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    code_commit,
    hardware,
    percentile,
    say,
    stage_step_totals,
    step_means,
)

DESCRIPTION = """\
`python -m omni.server` with one Qwen3-TTS stage (fused layout: talker + code predictor +
Code2Wav in one generation stage, in the qwen3-tts environment), requests over HTTP with
stream_format=audio, response_format=pcm. At concurrency c, c requests start together (a
burst); throughput is audio seconds received / wall time of the bursts; first audio (TTFP)
counts from the burst's start. Lengths are fixed by the stage's max_new_tokens (codec
frames per sentence, 12.5 a second) and one sentence per request; with random weights the
talker rarely picks end-of-speech, so each request's audio is max_new_tokens frames (the
report states the frames actually received). Greedy decoding unless --sample. Audio streams
within each sentence (--chunk-frames, the stage's chunk_frames: 4 frames, then twice as many up to N);
--chunk-frames 0 sends each sentence whole from qwen-tts's own generate (TTFP = the
sentence's synthesis). --clone: a Base release, every request cloning one 3 s reference
clip (ref_audio + ref_text; the stage builds its voice-clone prompt once and caches it).
Without --model: a random-weight fixture built by qwen-tts's own classes, --shape tiny (CPU
tests' size) or release (Qwen3-TTS-12Hz-1.7B's shapes, built on cuda in bfloat16: what a
GPU row times; omni/fixtures/qwen3_tts_release.py).
--layout ar: the preset's layout instead (the talker on the AR engine streaming codes to a
Code2Wav stage, omni/models/qwen3_tts_talker.py; max_tokens = --frames frames a request;
--talker-option / --code2wav-option KEY=VALUE set its stages' options).
Each level also reports every stage's engine steps in it (steps and mean ms, from the
server's /metrics): a stage's busy time, and on one GPU how the stages slow each other.
vLLM-Omni's figure to compare with: 111.6 audio-s/s at c=8, 612.1 at c=64 (H200, real
weights).
"""

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
    options: {{max_new_tokens: {frames}, do_sample: {sample}, subtalker_dosample: {sample},
               max_batch_size: {batch}, openai_voices: true, chunk_frames: {chunk}}}
"""
# --layout ar: the talker as a feedback AR stage (paged KV, CUDA graphs; omni/models/
# qwen3_tts_talker.py) streaming codes to a Code2Wav stage. max_tokens: the frames a
# request gets (the fused stage's max_new_tokens N gives N - 1, as qwen-tts's generate)
PIPELINE_AR = """\
name: qwen3-tts
default_modalities: [audio]
max_inflight: {batch}
stages:
  - name: talker
    engine: ar
    model: qwen3_tts_ar_talker
    model_dir: {model_dir}
    env: qwen3-tts
    memory: 40%
    params: {{max_tokens: {frames}{greedy}}}
    options: {{subtalker_dosample: {sample}, openai_voices: true, max_num_seqs: {batch}{talker}}}
  - name: code2wav
    engine: generation
    model: qwen3_tts_code2wav
    model_dir: {model_dir}
    env: qwen3-tts
    memory: 20%
    final_output: audio
    options: {{first_chunk_frames: 4, chunk_frames: {chunk}, left_context: 25,
               max_batch_size: {batch}{code2wav}}}
edges:
  - {{from: talker, to: code2wav, delivery: stream}}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="",
                        help="a Qwen3-TTS CustomVoice release directory (default: a random "
                        "fixture of --shape, built with the qwen3-tts environment)")
    parser.add_argument("--shape", default="tiny", choices=("tiny", "release"),
                        help="the random fixture's shapes: tiny, or the 1.7B release's "
                        "(built on cuda)")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--bursts", default="2,1,1")
    parser.add_argument("--frames", type=int, default=100,
                        help="max_new_tokens: codec frames per request (100 = 8 s)")
    parser.add_argument("--sample", action="store_true", help="sample (the release default)")
    parser.add_argument("--chunk-frames", type=int, default=None,
                        help="the longest streamed chunk within a sentence (0: sentences "
                        "whole; default: the layout's preset's, preset_chunk_frames)")
    parser.add_argument("--clone", action="store_true",
                        help="a Base release (--model, or the tiny Base fixture): requests "
                        "carry a reference clip to clone")
    parser.add_argument("--layout", default="fused", choices=("fused", "ar"),
                        help="fused: one generation stage (qwen3_tts); ar: the talker on the "
                             "AR engine streaming codes to a code2wav stage")
    parser.add_argument("--talker-option", action="append", default=[], metavar="KEY=VALUE",
                        help="--layout ar: an option of the talker stage (YAML value), e.g. "
                             "predictor_compile=false; repeatable")
    parser.add_argument("--code2wav-option", action="append", default=[], metavar="KEY=VALUE",
                        help="--layout ar: an option of the code2wav stage (YAML value), e.g. "
                             "fixed_shapes=false; repeatable")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="cpu")


def fixture_dir(arg: str, clone: bool, shape: str) -> str:
    """--model, or the random fixture of that layout and shape (built once, cached)."""
    if arg:
        return arg
    from omni.config.environments import env_python
    from omni.fixtures.tiny_qwen3_tts import ensure_tiny_qwen3_tts
    from omni.models.cache import default_cache_dir

    return str(ensure_tiny_qwen3_tts(env_python("qwen3-tts"), default_cache_dir(),
                                     "base" if clone else "custom_voice", shape))


def _reference_clip() -> dict[str, str]:
    """ref_audio (a 3 s 24 kHz WAV: a tone in noise, as a data: URL) and ref_text."""
    import base64
    import io
    import wave

    import numpy as np

    t = np.arange(3 * 24_000) / 24_000
    noise = np.random.default_rng(0).standard_normal(t.size)
    pcm = np.round((0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * noise) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24_000)
        w.writeframes(pcm.tobytes())
    return {"ref_audio": "data:audio/wav;base64," + base64.b64encode(out.getvalue()).decode(),
            "ref_text": "This is the voice to clone."}



def start_server(yaml_path: Path, log: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "omni.server", "--pipeline", str(yaml_path),
                             "--port", "0"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = re.search(r"listening on http://[0-9.]+:(\d+)", log.read_text())
        if found:
            return proc, int(found.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("server did not start in 600 s")


async def _one(session: Any, url: str, start: float, extra: dict[str, str]) -> tuple[float, int]:
    body = {"model": "qwen3-tts", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "stream_format": "audio", **extra}
    first, size = None, 0
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            first = time.monotonic() - start if first is None else first
            size += len(chunk)
    return first or 0.0, size


async def _burst(port: int, c: int, extra: dict[str, str]) -> dict[str, Any]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/audio/speech"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        start = time.monotonic()
        results = await asyncio.gather(*(_one(session, url, start, extra) for _ in range(c)))
        wall = time.monotonic() - start
    return {"wall_s": wall, "ttfp_s": [r[0] for r in results],
            "audio_s": [r[1] / 2 / 24_000 for r in results]}


def _level(port: int, c: int, bursts: int, extra: dict[str, str]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    before = asyncio.run(stage_step_totals(url))
    runs = [asyncio.run(_burst(port, c, extra)) for _ in range(bursts)]
    # each stage's engine steps in the level (busy time = steps x mean): which stage binds
    steps = step_means(before, asyncio.run(stage_step_totals(url)))
    audio = sum(sum(r["audio_s"]) for r in runs)
    ttfp = sorted(t for r in runs for t in r["ttfp_s"])
    wall = sum(r["wall_s"] for r in runs)
    return {"concurrency": c, "bursts": bursts, "audio_s_per_s": audio / wall,
            "ttfp_p50_s": percentile(ttfp, 0.5), "ttfp_p90_s": percentile(ttfp, 0.9),
            "audio_s_per_request": audio / (c * bursts), "wall_s": wall,
            "stage_steps": steps}


def preset_chunk_frames(layout: str) -> int:
    """The chunk_frames a layout's preset streams: the AR preset's code2wav stage option,
    the one-stage runner's default (read from there, so the bench follows them)."""
    if layout == "fused":
        from omni.models.qwen3_tts import DEFAULT_CHUNK_FRAMES

        return DEFAULT_CHUNK_FRAMES
    from omni.config.presets import load_pipeline

    stages = {stage.name: stage for stage in load_pipeline("qwen3_tts_ar").stages}
    return int(stages["code2wav"].options["chunk_frames"])


def _yaml_options(pairs: list[str]) -> str:
    """KEY=VALUE pairs as more entries of a YAML flow mapping."""
    return "".join(", " + pair.replace("=", ": ", 1) for pair in pairs)


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    model_dir = fixture_dir(args.model, args.clone, args.shape)
    extra = _reference_clip() if args.clone else {}  # request fields beside the text
    levels = [int(c) for c in args.concurrency.split(",")]
    bursts = [int(b) for b in args.bursts.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-qwen3-tts-"))
    yaml_path = work / "qwen3-tts.yaml"
    pipeline = PIPELINE if args.layout == "fused" else PIPELINE_AR
    if args.chunk_frames is None:  # as the layout's preset streams
        args.chunk_frames = preset_chunk_frames(args.layout)
    yaml_path.write_text(pipeline.format(model_dir=model_dir, frames=args.frames,
                                         sample=str(args.sample).lower(), batch=max(levels),
                                         chunk=args.chunk_frames,
                                         greedy="" if args.sample else ", temperature: 0",
                                         talker=_yaml_options(args.talker_option),
                                         code2wav=_yaml_options(args.code2wav_option)))
    proc, port = start_server(yaml_path, out / f"qwen3-tts-{args.tag}-server.log")
    try:
        asyncio.run(_burst(port, 1, extra))  # warm-up
        rows = []
        for c, b in zip(levels, bursts + [1] * len(levels), strict=False):
            rows.append(_level(port, c, b, extra))
            say(f"[qwen3_tts] c={c}: {rows[-1]['audio_s_per_s']:.2f} audio-s/s, TTFP p50 "
                f"{rows[-1]['ttfp_p50_s']:.3f} s, {rows[-1]['audio_s_per_request']:.2f} "
                "audio-s per request; steps " + ", ".join(
                    f"{stage} {v['steps']:.0f} x {v['mean_ms']:.1f} ms"
                    for stage, v in rows[-1]["stage_steps"].items()))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report = {"model": model_dir, "shape": None if args.model else args.shape,
              "frames": args.frames, "sample": args.sample,
              "chunk_frames": args.chunk_frames, "clone": args.clone, "layout": args.layout,
              "talker_options": args.talker_option,
              "code2wav_options": args.code2wav_option,
              "text": TEXT, "commit": code_commit(), "hardware": hardware(), "levels": rows,
              "baseline": {"vllm_omni_h200_audio_s_per_s": {"8": 111.6, "64": 612.1}}}
    (out / f"qwen3-tts-{args.tag}.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
