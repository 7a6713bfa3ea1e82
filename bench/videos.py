"""Video serving: our step-level engine vs diffusers' pipeline __call__, per family.

DESCRIPTION is the --help text; the JSON and Markdown report repeat the method.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench import diffusion_sides as sides
from bench.common import code_commit, percentile, say
from bench.media_http import encode_p50, http_rows, said

DESCRIPTION = """\
Denoising steps/s, videos/s and request latency (p50/p99) of text-to-video requests at
several concurrencies, for two sides, on the same pipeline, size, frames, steps and
prompts, in one run:

  ours-engine     omni's DiffusionEngine (what a diffusion stage runs) in this process:
                  requests join and leave between denoising steps; requests at different
                  steps share one transformer call (Wan 2.2 A14B: per expert, so requests
                  on the two sides of the boundary run in separate calls)
  ours-shared     ours-engine with batch_gain 0: every call takes all the rows it can (up to
                  --max-batch-rows), where ours-engine shares a call only where its own
                  timed calls show it pays (omni/engines/diffusion/rows.py); not in the
                  default sides
  diffusers-seq   the release's pipeline __call__ once per request, one at a time
  ours-http       `python -m omni.server --model DIR` (the preset the directory picks, its
                  own options; --shape real saves the random pipeline to a temp directory
                  first) and HTTP clients on POST /v1/videos/sync: latency to the MP4's
                  last byte (VAE decode and MP4 encode included); its calls from the
                  server's /metrics around the burst. Not in the default
                  sides; runs first, at every concurrency, with the bench's own copy
                  of the pipeline parked in host memory (the server finds the GPU free);
                  the server's log goes beside the report, and each video's MP4 encode
                  time from it into the row (MP4 encode p50: random weights make noise
                  frames, which take x264 ~10x a real video's time)

Clients are closed-loop: c clients each send their next request when the previous one
returns, --per-client requests each. Guidance is off (guidance_scale 1: one row per
video), as diffusers-seq would otherwise run cond and uncond as two calls; except for
ltx2, whose pipeline defaults are run on both sides (video guidance 3, audio 7, STG,
modality isolation: per step and request the pipeline makes 3 transformer calls of 2, 1
and 1 rows, our engine 2 calls for all the requests of a step). Before each
concurrency each side serves one unmeasured burst at 2 steps.

--family: wan22_t2v (Wan 2.2 T2V A14B, two experts), wan22_ti2v (Wan 2.2 TI2V-5B),
ltx_video (LTX-Video 2B), ltx2 (LTX-2 19B, video + audio), hunyuan_video (HunyuanVideo 1.5
T2V 480p, 8.3 B; guidance off is its guider at scale 1). --shape tiny uses the tiny fixture;
--shape real builds the release's transformer(s) and VAE with random bf16 weights on the
device (A14B: ~57 GB of weights, an H200; TI2V-5B, LTX-Video, LTX-2 (~40 GB) and
HunyuanVideo 1.5 fit an H100). --model DIR serves a local release.
"""

SIDES = ("ours-engine", "diffusers-seq")  # the default; ours-http, ours-shared also known
GUIDANCE = {"ltx2": 3.0}  # the pipeline's default (the others: off, see DESCRIPTION)
# what each family's __call__ needs besides the common arguments
CALL_EXTRAS = {"ltx2": {"frame_rate": 24.0}}
WARMUP_STEPS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", choices=("wan22_t2v", "wan22_ti2v", "ltx_video", "ltx2",
                                             "hunyuan_video"),
                        default="ltx_video")
    parser.add_argument("--shape", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--model", default=None, help="a local release directory")
    parser.add_argument("--layers", type=int, default=None,
                        help="transformer layers of --shape real (default: the release's)")
    parser.add_argument("--size", default="64x64", help="WxH (default 64x64, tiny)")
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--per-client", type=int, default=1)
    parser.add_argument("--max-batch-rows", type=int, default=8)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--http-load-format", choices=("auto", "dummy"), default="auto",
                        help="ours-http: dummy starts the server with --load-format dummy (it draws random weights on its GPU from the configs; a --shape built in memory is saved without its weights): for a release whose saved weights would not fit the disk (default auto)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from bench.video_models import load_video_pipeline

    torch.set_num_threads(1)
    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    say(f"videos bench: {args.family} ({args.model or args.shape}) on {device} ...")
    pipe = load_video_pipeline(args.family, args.shape, args.model, device, args.layers)
    wanted = [s.strip() for s in args.sides.split(",") if s.strip()]
    model_dir = args.model or (None if args.shape == "real" else str(_tiny_dir(args.family)))
    params = {"size": args.size, "steps": args.steps, "frames": args.frames,
              "guidance_scale": GUIDANCE.get(args.family, 1.0)}
    rows = []
    if "ours-http" in wanted:
        rows = http_rows(pipe, model_dir, device, {
            "concurrency": args.concurrency, "per_client": args.per_client, "params": params,
            "warm_steps": WARMUP_STEPS, "load_format": args.http_load_format,
            "log": Path(args.out) / f"videos-{args.family}-{args.tag or 'run'}-server.log"},
            lambda side, c, record: _summary(side, c, record, args))
    for c in (int(v) for v in args.concurrency.split(",")):
        for side in (s for s in wanted if s != "ours-http"):
            say(f"  {side} c={c} ...")
            rows.append(said(_summary(side, c, _side(side, pipe, args, device, c, params),
                                       args)))
    result = {"command": "python -m bench " + " ".join(argv), "family": args.family,
              "shape": args.model or args.shape, "layers": args.layers, "size": args.size,
              "frames": args.frames, "steps": args.steps, "device": _device(device),
              "guidance_scale": params["guidance_scale"],
              "rows": rows, "commit": code_commit(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    path = _write(result, args)
    say(f"wrote {path}")
    return 0


def _denoiser(pipe: Any, family: str, device: str) -> Any:
    from omni.models.hunyuan_video import HunyuanVideoDenoiser
    from omni.models.ltx2 import LTX2Denoiser
    from omni.models.ltx_video import LTXVideoDenoiser
    from omni.models.wan import WanDenoiser

    cls = {"ltx_video": LTXVideoDenoiser, "ltx2": LTX2Denoiser,
           "hunyuan_video": HunyuanVideoDenoiser}.get(family, WanDenoiser)
    return cls(pipe, device, {"max_steps": 1000, "max_side": 4096, "max_pixels": 4096 ** 2,
                              "max_frames": 257})


def _tiny_dir(family: str) -> Path:
    from bench.video_models import FIXTURES
    from omni.fixtures.tiny_models import ensure_tiny_model

    return ensure_tiny_model(FIXTURES[family])


def _side(side: str, pipe: Any, args: argparse.Namespace, device: str, c: int,
          params: dict[str, Any]) -> dict[str, Any]:
    warm = {**params, "steps": WARMUP_STEPS}
    if side in ("ours-engine", "ours-shared"):
        denoiser = _denoiser(pipe, args.family, device)
        options = {"max_batch_rows": args.max_batch_rows,
                   **({"batch_gain": 0} if side == "ours-shared" else {})}
        return sides.warmed_engine_side(denoiser, options, c, args.per_client, params, warm)
    if side == "diffusers-seq":
        extras = CALL_EXTRAS.get(args.family, {})
        _pipeline_calls(pipe, 1, warm, extras)
        return _pipeline_calls(pipe, c * args.per_client, params, extras)
    raise SystemExit(f"unknown side {side!r}; known: {', '.join(SIDES)}, ours-http, "
                     "ours-shared")


def _pipeline_calls(pipe: Any, count: int, params: dict[str, Any],
                    extras: dict[str, Any]) -> dict[str, Any]:
    """One __call__ per request, back to back; a request's latency counts its wait."""
    import torch

    width, height = (int(v) for v in params["size"].split("x"))
    guidance = {"guidance_scale": params["guidance_scale"]}
    if getattr(pipe, "guider", None) is not None:  # a guider pipeline: set on the guider
        pipe.guider, guidance = pipe.guider.new(**guidance), {}
    start, latencies = time.perf_counter(), []
    for i, prompt in enumerate(sides.prompts(count)):
        pipe(prompt=prompt, height=height, width=width, num_frames=params["frames"],
             num_inference_steps=params["steps"], output_type="np",
             generator=torch.Generator().manual_seed(i), **guidance, **extras)
        latencies.append(time.perf_counter() - start)
    return {"wall_s": time.perf_counter() - start, "latencies_s": latencies}


def _summary(side: str, c: int, record: dict[str, Any], args: argparse.Namespace) -> dict:
    lat = sorted(record["latencies_s"])
    videos = len(lat)
    return {"side": side, "concurrency": c, "videos": videos,
            "wall_s": round(record["wall_s"], 3),
            "steps_per_s": round(videos * args.steps / record["wall_s"], 3),
            "videos_per_s": round(videos / record["wall_s"], 4),
            "p50_s": round(percentile(lat, 0.5), 3), "p99_s": round(percentile(lat, 0.99), 3),
            "transformer_calls": record.get("transformer_calls"),
            "max_rows": record.get("max_rows"),
            # ours-http: the server's MP4 encode of each video, inside its latency
            "encode_p50_s": encode_p50(record)}


def _device(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"


def _write(result: dict[str, Any], args: argparse.Namespace) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"videos-{args.family}" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# videos: {result['family']} ({result['shape']}) on {result['device']}", "",
             f"`{result['command']}` ({result['when']}); {result['size']}, "
             f"{result['frames']} frames, {result['steps']} steps, guidance_scale "
             f"{result['guidance_scale']}; commit {result.get('commit') or 'unknown'}.", "",
             "| side | c | videos | steps/s | videos/s | p50 s | p99 s | calls | max rows "
             "| MP4 encode p50 s |", "| --- " * 10 + "|"]
    for r in result["rows"]:
        lines.append(f"| {r['side']} | {r['concurrency']} | {r['videos']} | "
                     f"{r['steps_per_s']} | {r['videos_per_s']} | {r['p50_s']} | "
                     f"{r['p99_s']} | {r['transformer_calls'] or '-'} | "
                     f"{r['max_rows'] or '-'} | {r.get('encode_p50_s') or '-'} |")
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path
