"""Qwen3-TTS's streamed talker step, in-process: where a step's time goes.

Runs the fused stage's runner (omni/models/qwen3_tts.py) in the qwen3-tts environment on a
model directory (a release-shape random build on a GPU box: bench/qwen3_tts.py's fixture),
greedy. For each batch size B, B sentences start together and the probe times
--steps talker steps after --warm ones: the whole step (mean) (SentenceStream.advance, chunk
decodes included), the talker's forward less its code predictor, the code predictor
(generate, or its graphs), and the Code2Wav decoder calls, each with the device
synchronised around it; with the predictor's CUDA graphs off and on.

    /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_step.py --model DIR
        [--device cuda] [--batch 1,8,64] [--steps 30] [--warm 5] [--staggered]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TEXT = "The ship sailed north across the cold sea, carrying wheat, wool, iron and passengers."


def timed(spent: dict[str, list[float]], name: str, fn: Any, sync: Any) -> Any:
    """fn wrapped: each call's wall time (synchronised) appended to spent[name]."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        spent[name].append(time.perf_counter() - t0)
        return out
    return wrapper


def hook_time(spent: dict[str, list[float]], name: str, module: Any, sync: Any) -> list[Any]:
    """Forward hooks that append each call's synchronised wall time to spent[name] (a
    wrapped forward would hide its signature from transformers' generate)."""
    start: list[float] = []

    def before(*_: Any) -> None:
        sync()
        start[:] = [time.perf_counter()]

    def after(*_: Any) -> None:
        sync()
        spent[name].append(time.perf_counter() - start[0])

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


def run(runner: Any, batch: int, steps: int, warm: int, sync: Any,
        staggered: bool) -> dict[str, float]:
    import torch

    tts = runner.tts.model
    spent: dict[str, list[float]] = defaultdict(list)
    talker, predictor = tts.talker, tts.talker.code_predictor
    decoder = tts.speech_tokenizer.model.decoder
    hooks = hook_time(spent, "talker", talker, sync) + hook_time(spent, "decoder", decoder, sync)
    predictor.generate = timed(spent, "predictor", predictor.generate, sync)
    graphs = runner.graphed.graphs if runner.graphed else None
    if graphs is not None:
        graphs.run = timed(spent, "predictor", graphs.run, sync)
    try:
        with torch.inference_mode():
            params = {"voice": "vivian"}
            first = 1 if staggered else batch
            job = runner.start_items([TEXT] * first, [params] * first)
            step_times = []
            joins = batch - 1 if staggered else 0  # one row joins each warm-up step
            warm = max(warm, joins + 1)
            for i in range(warm + steps):
                if i < joins:
                    runner.join_items(job, [TEXT], [params])
                if i == warm:
                    spent.clear()
                sync()
                t0 = time.perf_counter()
                runner.advance(job)
                sync()
                if i >= warm:
                    step_times.append(time.perf_counter() - t0)
            runner.drop_items(job, list(job.rows))
    finally:
        for hook in hooks:
            hook.remove()
        predictor.__dict__.pop("generate", None)
        if graphs is not None:
            graphs.__dict__.pop("run", None)
    step = statistics.mean(step_times) * 1e3  # chunk decodes land on some steps
    total = {k: sum(v) * 1e3 / steps for k, v in spent.items()}
    return {"warm": warm, "step_ms": step, "talker_ms": total.get("talker", 0) - total.get("predictor", 0),
            "predictor_ms": total.get("predictor", 0), "decoder_ms": total.get("decoder", 0),
            "frames_per_s": batch / (step / 1e3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", default="1,8,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--staggered", action="store_true",
                        help="rows join one a step (the batch's KV cache left-padded)")
    args = parser.parse_args()
    import torch

    from omni.models.qwen3_tts import Qwen3TTSRunner, load_qwen3_tts

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tts = load_qwen3_tts(args.model, args.device, "bfloat16" if cuda else "float32")
    frames = args.warm + args.steps + 10  # no row ends while timed
    frames += max(int(x) for x in args.batch.split(",")) if args.staggered else 0
    print("| predictor | batch" + (" (joined one a step)" if args.staggered else "") + " | step ms | talker ms | code predictor ms | decoder ms "
          "(a step's share) | frames/s |\n|---|---:|---:|---:|---:|---:|---:|")
    for graphs in (False, True):
        runner = Qwen3TTSRunner(tts, args.device, {
            "do_sample": False, "subtalker_dosample": False, "max_new_tokens": frames,
            "predictor_graphs": graphs})
        for b in (int(x) for x in args.batch.split(",")):
            r = run(runner, b, args.steps, args.warm, sync, args.staggered)
            print(f"| {'graphs' if runner.graphed else 'generate'} | {b} | {r['step_ms']:.1f} "
                  f"| {r['talker_ms']:.1f} | {r['predictor_ms']:.1f} | {r['decoder_ms']:.1f} "
                  f"| {r['frames_per_s']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
