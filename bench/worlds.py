"""World sessions (Cosmos 3 forward_dynamics), measured the way clients use them:
`python -m omni.server --model <Cosmos 3 release>` as a subprocess and GET /v1/world
WebSocket clients, against diffusers' `Cosmos3OmniPipeline` called once per step in this
process (it takes one sample per call; the server is not running then).

  sessions=N  N sessions open at once, each stepping in lockstep (send actions, read the
              chunk, send the next): steps/s (chunks) and frames/s over all of them, and
              each step's latency; the pipeline does the same N x steps calls one after
              another, each from the previous chunk's last frame.

Each step: a chunk of `chunk_size` + 1 frames from 64x64 first frames (the tier-256
canvas), `--denoise` denoising steps, guidance 1 (one pass per step), domain droid_lerobot.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import hardware, say

DESCRIPTION = __doc__
DOMAIN, WIDTH, PROMPT = "droid_lerobot", 10, "open the top drawer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="a Cosmos 3 release directory (default: the tiny random fixture)")
    parser.add_argument("--sessions", default="1,8", help="concurrent sessions (1,8)")
    parser.add_argument("--steps", type=int, default=4, help="world steps per session (4)")
    parser.add_argument("--denoise", type=int, default=10, help="denoising steps (10)")
    parser.add_argument("--chunk", type=int, default=4, help="chunk_size (4: 5 frames)")
    parser.add_argument("--size", type=int, default=64, help="first frame side (64)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="")


def first_frame(i: int, side: int) -> np.ndarray:
    return np.random.RandomState(i).randint(0, 255, (side, side, 3), dtype=np.uint8)


def actions(i: int, k: int, chunk: int) -> np.ndarray:
    return np.random.RandomState(1000 * i + k).randn(chunk, WIDTH).astype(np.float32)


def pipeline_side(args: argparse.Namespace, model_dir: str, n: int) -> dict[str, Any]:
    import torch
    from diffusers import Cosmos3OmniPipeline, CosmosActionCondition
    from PIL import Image

    from omni.engines.base import resolve_device
    from omni.models.diffusion import torch_dtype

    device = resolve_device("auto")
    pipe = Cosmos3OmniPipeline.from_pretrained(model_dir, dtype=torch_dtype(args.dtype, device),
                                               enable_safety_checker=False).to(device)
    pipe.set_progress_bar_config(disable=True)

    def call(image: Image.Image, i: int, k: int) -> np.ndarray:
        action = CosmosActionCondition(
            mode="forward_dynamics", chunk_size=args.chunk, domain_name=DOMAIN,
            resolution_tier=256, raw_actions=torch.from_numpy(actions(i, k, args.chunk)),
            image=image)
        video = pipe(prompt=PROMPT, action=action, num_inference_steps=args.denoise,
                     guidance_scale=1.0, generator=torch.Generator().manual_seed(k),
                     output_type="np").video
        return (np.clip(video, 0, 1) * 255).round().astype(np.uint8)

    call(Image.fromarray(first_frame(0, args.size)), 0, 0)  # warm-up
    latencies, frames = [], 0
    start = time.perf_counter()
    for i in range(n):
        image = Image.fromarray(first_frame(i, args.size))
        for k in range(args.steps):
            t0 = time.perf_counter()
            video = call(image, i, k)
            latencies.append(time.perf_counter() - t0)
            frames += video.shape[0]
            image = Image.fromarray(video[-1])
    wall = time.perf_counter() - start
    return summary(latencies, frames, wall)


def summary(latencies: list[float], frames: int, wall: float) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {"steps_per_s": round(len(ordered) / wall, 3), "frames_per_s": round(frames / wall, 2),
            "p50_ms": round(ordered[len(ordered) // 2] * 1000, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 1),
            "wall_s": round(wall, 2), "steps": len(ordered)}


async def _session(url: str, i: int, args: argparse.Namespace, latencies: list[float],
                   counts: list[int]) -> None:
    import aiohttp

    from omni.media.image import encode_image

    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.send_json({"type": "session.open", "prompt": PROMPT, "domain": DOMAIN,
                            "steps": args.denoise, "chunk_size": args.chunk,
                            "image": base64.b64encode(encode_image(
                                first_frame(i, args.size))).decode()})
        assert (await ws.receive_json(timeout=120))["type"] == "session.created"
        for k in range(args.steps):
            t0 = time.perf_counter()
            await ws.send_json({"type": "step", "seed": k,
                                "actions": actions(i, k, args.chunk).tolist()})
            while True:
                event = await ws.receive_json(timeout=600)
                if event["type"] == "chunk":
                    await ws.receive_bytes(timeout=600)
                    break
                if event["type"] == "error":
                    raise RuntimeError(event)
            latencies.append(time.perf_counter() - t0)
            counts.append(event["frames"])


async def server_side(base: str, args: argparse.Namespace, n: int,
                      model: str) -> dict[str, Any]:
    url = base.replace("http", "ws", 1) + f"/v1/world?model={model}"
    await _session(url, 0, args, [], [])  # warm-up
    latencies: list[float] = []
    counts: list[int] = []
    start = time.perf_counter()
    await asyncio.gather(*(_session(url, i, args, latencies, counts) for i in range(n)))
    return summary(latencies, sum(counts), time.perf_counter() - start)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.ar_ours import start_server
    from bench.robots import free_device_memory, gpu_name

    model_dir = args.model
    if model_dir is None:
        from omni.fixtures.tiny_models import ensure_tiny_model
        model_dir = str(ensure_tiny_model("cosmos3"))
    levels = [int(x) for x in args.sessions.split(",") if x]
    result: dict[str, Any] = {"command": "python -m bench " + " ".join(argv),
                              "hardware": hardware(), "gpu": gpu_name(), "model": model_dir,
                              "levels": {}}
    for n in levels:
        say(f"[worlds] diffusers pipeline, {n} session(s) one call at a time")
        result["levels"][str(n)] = {"pipeline": pipeline_side(args, model_dir, n)}
    free_device_memory()
    proc, base = start_server(("--model", model_dir), args.dtype, 900)
    try:
        for n in levels:
            say(f"[worlds] ours, {n} session(s) at once")
            result["levels"][str(n)]["ours"] = asyncio.run(
                server_side(base, args, n, Path(model_dir).name))
    finally:
        proc.terminate()
        proc.wait(60)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"worlds-{args.tag}" if args.tag else "worlds"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(report(result, args))
    say(f"[worlds] wrote {out / name}.md")
    return 0


def report(r: dict[str, Any], args: argparse.Namespace) -> str:
    hw = r["hardware"]
    lines = ["# Worlds: Cosmos 3 world sessions, ours (server) vs the diffusers pipeline per step",
             "", f"Command: `{r['command']}`  ",
             f"Machine: {hw.get('cpu_model')}, {hw.get('cores')} cores, "
             f"{r.get('gpu') or 'no GPU'}  ", f"Model: `{r['model']}` (random weights)  ",
             f"Per step: chunk_size {args.chunk} ({args.chunk + 1} frames), {args.denoise} "
             f"denoising steps, guidance 1, {args.size}x{args.size} first frames", "",
             DESCRIPTION.split("\n\n", 1)[1].strip(), "",
             "| sessions | side | steps/s | frames/s | step p50 ms | step p99 ms | wall s |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for n, level in r["levels"].items():
        for side in ("pipeline", "ours"):
            s = level.get(side)
            if s:
                lines.append(f"| {n} | {side} | {s['steps_per_s']} | {s['frames_per_s']} | "
                             f"{s['p50_ms']} | {s['p99_ms']} | {s['wall_s']} |")
    lines.append("")
    for n, level in r["levels"].items():
        if "ours" in level:
            ratio = level["ours"]["steps_per_s"] / level["pipeline"]["steps_per_s"]
            lines.append(f"{n} session(s): ours {ratio:.2f}x the pipeline's steps/s.  ")
    return "\n".join(lines) + "\n"
