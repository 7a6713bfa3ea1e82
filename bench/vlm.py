"""Image chat (Qwen2.5-VL / Qwen3-VL) and Whisper in the HF layout: omni's server and
engine vs the model's own transformers generate(), on the same model and inputs in one
run.

Sides (--sides, default all three, run in this order, one model in memory at a time):
  ours-http    `python -m omni.server --model DIR --port 0`, c concurrent streaming
               clients (bench/vlm_http.py: chat completions with an image_url data: PNG
               and a question; Whisper: /v1/audio/transcriptions with a WAV file each);
               the server's /metrics read around each measured burst gives its media
               encoder's batches, prompts and busy seconds in that burst
  hf-generate  transformers' model.generate() with the release's processor, one request
               after another, greedy, min_new_tokens = max_new_tokens (bench/vlm_hf.py)
  ours-inproc  the engine in this process (bench/vlm_sides.py): AREngine with the N
               requests added at once, plus the vision encoder alone (N prompts in one
               encode_batch, one tower call, vs one encode per prompt); Whisper: the
               GenerationEngine over the whisper_hf runner (one generate() per group of
               ready clips), plus the runner one clip per call

At each concurrency c every side first runs a warm-up burst of c other inputs
(unmeasured; hf-generate: one request, once), then one measured burst of c distinct
images (c clips of --clip-seconds noise) that all sides share. Every answer is meant to
be --new-tokens long: chat asks ignore_eos, hf-generate min_new_tokens; the whisper_hf
runner takes only a maximum, but the release build's weights never pick an end token
(the tiny Whisper's may: the report counts short answers). Image chat: tokens/s = output
tokens / the burst's wall time, TTFT from the burst's start (queueing included:
hf-generate serves the burst one request after another). Whisper: real-time factor =
wall / audio seconds.

--shape tiny (default): the tiny random fixture of --family (CPU-sized: the numbers say
what the batching costs or saves, not a real model's speed). --shape release: random
bf16 weights at the release's shapes (omni/fixtures/vl_release.py: Qwen2.5-VL-7B-Instruct,
Qwen3-VL-8B-Instruct, whisper-large-v3), built on --device once into --model-dir-out
(default: under OMNI_CACHE_DIR) and loaded by every side from there; --layers N cuts the
text model's depth (Whisper: both stacks) for a dry run. --model DIR serves a release
directory instead. Writes vlm-<family>-<tag>.md and .json under --out, rewritten after
every side (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any

from bench.common import code_commit, hardware, say

DESCRIPTION = __doc__
SIDES = ("ours-http", "hf-generate", "ours-inproc")
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "whisper_hf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", choices=FAMILIES, default="qwen2_5_vl")
    parser.add_argument("--shape", choices=("tiny", "release"), default="tiny",
                        help="tiny: the CPU-sized fixture; release: the release's shapes, "
                             "random bf16 weights built on --device")
    parser.add_argument("--layers", type=int, default=None,
                        help="release shape: text model layers (default the release's)")
    parser.add_argument("--model", help="a release directory (default: built per --shape)")
    parser.add_argument("--model-dir-out", default=None, metavar="DIR",
                        help="where --shape release builds its model (default "
                             "OMNI_CACHE_DIR/<family>_release[_lN]); reused when complete")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sides", default=",".join(SIDES), help="a comma list of sides")
    parser.add_argument("--concurrency", default="1,8", help="requests at once, a list")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="tokens per answer, exactly (default 16 tiny, 64 release)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="square images, pixels (default 112 tiny, 448 release)")
    parser.add_argument("--clip-seconds", type=float, default=5.0)
    parser.add_argument("--server-timeout", type=float, default=1200.0,
                        help="seconds to wait for the server to listen (a real-size model "
                             "loads in a minute or more)")
    parser.add_argument("--tag", default=None,
                        help="report name's tag (default: the device, -release for that shape)")
    parser.add_argument("--out", default="bench/results")


def _model_dir(args: argparse.Namespace) -> str:
    if args.model:
        return str(Path(args.model).resolve())
    if args.shape == "tiny":
        from omni.fixtures.tiny_models import ensure_tiny_model

        return str(ensure_tiny_model(args.family, progress=say))
    import time

    from omni.fixtures.vl_release import builder_name, ensure_release
    from omni.models.cache import default_cache_dir

    out = Path(args.model_dir_out or default_cache_dir() / builder_name(args.family, args.layers))
    started = time.perf_counter()
    say(f"[vlm] building (or reusing) {args.family} at the release's shapes in {out}")
    ensure_release(args.family, out, device=args.device, layers=args.layers)
    say(f"[vlm] model ready in {time.perf_counter() - started:.0f} s")
    return str(out.resolve())


def _sides(text: str) -> list[str]:
    asked = [s for s in text.split(",") if s]
    if unknown := set(asked) - set(SIDES):
        raise SystemExit(f"unknown sides {sorted(unknown)}; known: {', '.join(SIDES)}")
    return [s for s in SIDES if s in asked]


def _side(side: str, family: str, model_dir: str, work: dict[int, Any],
          args: argparse.Namespace, stem: str) -> tuple[dict[str, Any], str | None]:
    """One side's rows per level, and the processor it used (hf-generate's)."""
    whisper = family == "whisper_hf"
    if side == "ours-http":
        from bench.vlm_http import http_side

        return http_side(family, model_dir, work, args,
                         Path(args.out) / f"{stem}-server.log"), None
    if side == "hf-generate":
        from bench import vlm_hf

        return vlm_hf.hf_whisper(model_dir, work, args) if whisper else \
            vlm_hf.hf_vl(family, model_dir, work, args)
    from bench import vlm_sides

    return (vlm_sides.inproc_whisper if whisper else vlm_sides.inproc_vl)(
        model_dir, work, args), None


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.vlm_http import Skipped
    from bench.vlm_sides import workload

    release = args.shape == "release"
    args.new_tokens = args.new_tokens or (64 if release else 16)
    args.image_size = args.image_size or (448 if release else 112)
    tag = args.tag or args.device.replace(":", "") + ("-release" if release else "")
    stem = f"vlm-{args.family}-{tag}"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    sides = _sides(args.sides)
    model_dir = _model_dir(args)
    levels = [int(c) for c in str(args.concurrency).split(",") if c]
    work = workload(args.family == "whisper_hf", levels, args.image_size, args.clip_seconds)
    result = _header(args, argv, model_dir, levels, sides)
    failed = False
    for side in sides:
        say(f"[vlm] {args.family}: {side}")
        try:
            result["results"][side], processor = _side(side, args.family, model_dir, work,
                                                       args, stem)
            if processor:
                result["settings"]["hf_processor"] = processor
        except Skipped as e:
            say(f"[vlm] {side} skipped: {e}")
            result["results"][side] = {"skipped": str(e)}
        except Exception as e:  # the other sides still run; the exit status says it failed
            traceback.print_exc()
            result["results"][side] = {"error": f"{type(e).__name__}: {e}"}
            failed = True
        _write(Path(args.out), stem, result)
    say(f"[vlm] wrote {Path(args.out) / stem}.md")
    return 1 if failed else 0


def _header(args: argparse.Namespace, argv: list[str], model_dir: str, levels: list[int],
            sides: list[str]) -> dict[str, Any]:
    from bench.ar_report import environment
    from omni.fixtures.vl_release import RELEASES

    shape = "given directory" if args.model else args.shape
    return {"family": args.family, "shape": shape,
            "release": RELEASES[args.family] if shape == "release" else None,
            "model_dir": model_dir, "command": "python -m bench " + " ".join(argv),
            "commit": code_commit(), "hardware": hardware() | environment(args.device),
            "settings": {"device": args.device, "sides": sides, "concurrency": levels,
                         "new_tokens": args.new_tokens, "layers": args.layers,
                         "image_size": args.image_size, "clip_seconds": args.clip_seconds},
            "results": {}}


def _write(out: Path, stem: str, result: dict[str, Any]) -> None:
    from bench.vlm_report import markdown

    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result, DESCRIPTION))
