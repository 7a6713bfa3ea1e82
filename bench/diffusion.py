"""Diffusion serving: our step-level engine vs diffusers, in one run on one model.

DESCRIPTION is the --help text; the report (diffusion.md) repeats the method.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench import diffusion_sides as sides
from bench.common import code_commit, percentile, say
from bench.diffusion_models import SHAPES
from bench.media_http import encode_p50, http_rows, said

DESCRIPTION = """\
Denoising steps/s, images/s and request latency (p50/p99/mean) of text-to-image requests
at several concurrencies, for these sides, on the same pipeline, size, step count and
prompts, in one run:

  ours-engine         omni's DiffusionEngine (the engine a diffusion stage runs) driven in
                      this process: requests join and leave between denoising steps, and
                      compatible requests share one transformer call at their own timesteps
  ours-server         the same engine behind the serving path without HTTP: AsyncOmni
                      (orchestrator, engine process, shared-memory payloads); only with a
                      model directory (--model or the tiny fixture)
  ours-http           `python -m omni.server --model DIR` (the preset the directory picks,
                      its own options and defaults; a real-size --shape is saved to a temp
                      directory first) and HTTP clients on POST /v1/images/generations:
                      latency to the PNG's last byte; its calls and rows from the
                      server's /metrics around the burst. Not in the default sides;
                      runs first, at every concurrency, with the bench's own copy of
                      the pipeline parked in host memory (the server finds the GPU free)
  ours-shared         ours-engine with batch_gain 0: every call takes all the rows it can (up
                      to --max-batch-rows), where ours-engine shares a call only where its
                      own timed calls show it pays (omni/engines/diffusion/rows.py). Not in
                      the default sides
  ours-cache          ours-engine with the step cache on at its default threshold
                      (transformer calls are counted; random weights cannot judge quality)
  diffusers-seq       the pipeline's __call__ once per request, one at a time
  diffusers-batched   one __call__ with a list of c prompts per round (needs all c requests
                      to arrive together; every request waits for its whole round)
  transformer         the bare transformer, one call at batch 1, 4, 8, 16 (random inputs
                      of the same shapes): the ceiling for steps/s at that batch
  ours-fp8            ours-engine with the transformer blocks' weights in fp8 e4m3 (the
                      stage option quantization: fp8), run after every other side (the
                      weights are converted in place); with "transformer", the bare
                      transformer is timed again in fp8 too

Clients are closed-loop: c clients each send their next request when the previous one
returns, --per-client requests each, all starting together. Latency = return - send.
Steps/s = requests x steps / wall time. No classifier-free guidance (no negative prompt),
so one transformer row per image. Before each concurrency every side serves one
unmeasured burst of c requests at 2 steps (diffusers-seq: one request), so the batch
shapes of that concurrency have been seen before timing starts.

--shape tiny uses the tiny random Qwen-Image fixture (omni.fixtures, built on first use);
--shape qwen-image builds the real Qwen-Image transformer (60 layers, 20.4 B parameters)
and VAE with random weights in memory on the device (bf16), with a 2-layer text encoder
of the real width (the text encoder runs once per request and is not what is measured);
that shape needs a large GPU (about 45 GB). --shape flux1-tiny / flux1-dev do the same for
FLUX.1-dev (tiny fixture; the real 11.9 B transformer and VAE, CLIP-L and T5-XXL widths with
2 layers each, about 30 GB); guidance_scale stays at the pipeline's default (distilled
guidance, one row per image); --shape flux2-tiny / flux2-dev for FLUX.2-dev (the real 32 B
transformer and VAE, a 30-layer text encoder of Mistral Small's width with a narrow MLP,
about 75 GB: an H200, or --layers 4 on an H100); --shape hunyuan-image-tiny /
hunyuan-image-2.1 for HunyuanImage 2.1 (the real ~17 B transformer, VAE and APG guiders,
text encoders of the release's widths with 3 / 2 layers, about 40 GB; every request is
guided: two rows per image).
"""

WARMUP_STEPS = 2
SIDES = ("ours-engine", "ours-server", "ours-cache", "diffusers-seq", "diffusers-batched",
         "transformer", "ours-fp8")
EXTRA_SIDES = ("ours-http", "ours-shared")  # known, not in the default
LAST_SIDES = ("ours-fp8",)  # they change the model: after the others


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", choices=tuple(SHAPES), default="tiny",
                        help="model: a tiny fixture, or a real-size random Qwen-Image or FLUX.1 built "
                             "in memory (GPU)")
    parser.add_argument("--layers", type=int, default=None,
                        help="transformer layers of a real-size --shape (default: the "
                             "release's: qwen-image 60, flux1-dev 19 double blocks + 38 "
                             "single)")
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="a Qwen-Image pipeline directory instead of --shape")
    parser.add_argument("--size", default="256x256", help="WxH of every image (default "
                        "256x256)")
    parser.add_argument("--steps", type=int, default=20, help="denoising steps (default 20)")
    parser.add_argument("--concurrency", default="1,4,8,16",
                        help="comma-separated client counts (default 1,4,8,16)")
    parser.add_argument("--per-client", type=int, default=2,
                        help="requests each client sends, one after another (default 2)")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"comma-separated subset of {','.join(SIDES)}")
    parser.add_argument("--http-load-format", choices=("auto", "dummy"), default="auto",
                        help="ours-http: dummy starts the server with --load-format dummy (it draws random weights on its GPU from the configs; a --shape built in memory is saved without its weights): for a release whose saved weights would not fit the disk (default auto)")
    parser.add_argument("--max-batch-rows", type=int, default=16,
                        help="the engine's max_batch_rows (default 16)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="directory for diffusion[-TAG].md/.json (default bench/results)")
    parser.add_argument("--tag", default=None, help="suffix of the result files")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from bench.diffusion_models import load

    torch.set_num_threads(1)
    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    width, height = (int(v) for v in args.size.split("x"))
    wanted = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = set(wanted) - set(SIDES + EXTRA_SIDES)
    if unknown:
        raise SystemExit(f"unknown sides {sorted(unknown)}; known: "
                         f"{', '.join(SIDES + EXTRA_SIDES)}")
    say(f"diffusion bench: loading {args.model or args.shape} on {device} ...")
    family, pipe, model_dir = load(args.shape, args.model, device, args.layers)
    params = {"size": args.size, "steps": args.steps}
    call = {"height": height, "width": width, "num_inference_steps": args.steps,
            "output_type": "np",
            **({"true_cfg_scale": 1.0} if family == "qwen_image" else {})}
    options = {"max_batch_rows": args.max_batch_rows}
    micro: dict[str, float] = {}
    micro_fp8: dict[str, float] = {}
    if "transformer" in wanted:
        micro = _bare_transformer(family, pipe, height, width, device, "")
    rows = []
    if "ours-http" in wanted:
        rows = http_rows(pipe, model_dir, device, {
            "concurrency": args.concurrency, "per_client": args.per_client, "params": params,
            "warm_steps": WARMUP_STEPS, "load_format": args.http_load_format,
            "log": args.out / f"diffusion-{args.tag or 'run'}-server.log"},
            lambda side, c, record: _summary(side, c, record, args))
    serve = partial(_serve, model=(family, pipe), model_dir=model_dir, device=device,
                    options=options, args=args, params=params, call=call)
    rows += serve([s for s in wanted if s not in (*LAST_SIDES, "ours-http")])
    if "ours-fp8" in wanted:
        _quantize(family, pipe, device)
        if "transformer" in wanted:
            micro_fp8 = _bare_transformer(family, pipe, height, width, device, "fp8 ")
        rows += serve(["ours-fp8"])
    result = {"command": "python -m bench " + " ".join(argv), "device": _device(device),
              "shape": args.model or (args.shape if args.layers is None
                                        else f"{args.shape} ({args.layers} layers)"),
              "size": args.size, "steps": args.steps,
              "per_client": args.per_client, "transformer_s": micro,
              "transformer_fp8_s": micro_fp8, "rows": rows, "commit": code_commit(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    from bench.diffusion_report import write

    path = write(result, args.out, args.tag)
    say(f"wrote {path}")
    return 0


def _bare_transformer(family: str, pipe: Any, height: int, width: int, device: str,
                      label: str) -> dict[str, float]:
    micro = {}
    for batch in (1, 4, 8, 16):
        micro[str(batch)] = sides.bare_transformer(family, pipe, height, width, batch, device,
                                                   repeats=5 if device == "cpu" else 10)
        say(f"  {label}transformer batch {batch}: {micro[str(batch)] * 1000:.1f} ms/call")
    return micro


def _serve(wanted: list[str], *, model: tuple[str, Any], model_dir: str | None, device: str,
           options: dict[str, Any], args: argparse.Namespace, params: dict[str, Any],
           call: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per serving side and concurrency, concurrency by concurrency."""
    rows = []
    for c in (int(v) for v in args.concurrency.split(",")):
        for side in wanted:
            if side == "transformer" or (side == "ours-server" and model_dir is None):
                continue
            say(f"  {side} c={c} ...")
            record = _side(side, model, model_dir, device, options, c, args, params, call)
            rows.append(said(_summary(side, c, record, args)))
    return rows


def _quantize(family: str, pipe: Any, device: str) -> None:
    """The pipeline's transformer blocks in fp8, in place, as a stage's quantization: fp8."""
    from bench.diffusion_models import denoiser as make_denoiser
    from omni.engines.diffusion.quantize import quantize_denoiser

    done = quantize_denoiser(make_denoiser(family, pipe, device, {}), "fp8")
    say(f"  fp8: {done['quantized_weights']} linear weights of the transformer blocks")


def _side(side: str, model: tuple[str, Any], model_dir: str | None, device: str,
          options: dict[str, Any], c: int, args: argparse.Namespace,
          params: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    from bench.diffusion_models import denoiser as make_denoiser

    family, pipe = model
    # warm-up: one unmeasured burst of c requests at WARMUP_STEPS steps, so every side
    # meets the batch shapes of this concurrency (kernel choice, allocator) before timing
    warm_params = {**params, "steps": WARMUP_STEPS}
    warm_call = {**call, "num_inference_steps": WARMUP_STEPS}
    if side in ("ours-engine", "ours-cache", "ours-fp8", "ours-shared"):  # fp8: quantized
        opts = {**options, "step_cache": side == "ours-cache",
                **({"batch_gain": 0} if side == "ours-shared" else {})}
        denoiser = make_denoiser(family, pipe, device, {"max_steps": 1000, "max_side": 4096,
                                                        "max_pixels": 4096 * 4096})
        return sides.warmed_engine_side(denoiser, opts, c, args.per_client, params,
                                        warm_params)
    if side == "ours-server":
        return sides.server_side(model_dir, {**options, "max_side": 4096,
                                             "max_pixels": 4096 * 4096}, c, args.per_client,
                                 params)
    if side == "diffusers-seq":
        sides.diffusers_sequential(pipe, 1, 1, warm_call, device)
        return sides.diffusers_sequential(pipe, c, args.per_client, call, device)
    sides.diffusers_batched(pipe, c, 1, warm_call, device)
    return sides.diffusers_batched(pipe, c, args.per_client, call, device)


def _summary(side: str, c: int, record: dict[str, Any], args: argparse.Namespace) -> dict:
    lat = sorted(record["latencies_s"])
    n = len(lat)
    mean = sum(lat) / n
    out = {"side": side, "concurrency": c, "requests": n, "wall_s": round(record["wall_s"], 3),
           "images_per_s": round(n / record["wall_s"], 3),
           "steps_per_s": round(n * args.steps / record["wall_s"], 2),
           "p50_s": round(percentile(lat, 0.5), 3), "p99_s": round(percentile(lat, 0.99), 3),
           "mean_s": round(mean, 3), "p99_over_mean": round(percentile(lat, 0.99) / mean, 3)}
    for key in ("transformer_calls", "rows_run", "max_rows", "skipped_steps"):
        if key in record:
            out[key] = record[key]
    encode = encode_p50(record)  # ours-http: the server's image encode, in its latency
    if encode is not None:
        out["encode_p50_s"] = encode
    return out


def _device(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    return f"{platform.processor() or 'cpu'}, {len(__import__('os').sched_getaffinity(0))} " \
           f"cores (torch {torch.__version__}, 1 thread)"
