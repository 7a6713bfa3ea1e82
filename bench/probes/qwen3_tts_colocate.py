"""Would Qwen3-TTS's Code2Wav decodes overlap the talker's steps if they ran in its process?

Served, the talker and the Code2Wav stage are two processes on one GPU, and at c=64 the
talker's step took 24.3 ms with the decodes beside it against 14.0 ms without (H100,
bench/results/qwen3-tts-gpu.md): without MPS the two processes' kernels take turns. In one
process, kernels of two CUDA streams can run at the same time, and a stream's priority
decides who goes first. Before building that layout, this probe measures it. In-process, B
requests decode on the talker's AR engine (as bench/probes/qwen3_tts_ar_step.py) while
Code2Wav decode calls of (B rows, --frames frames, the first --skip of them left out of the
conv stack: a streamed 50-frame chunk after its context) loop:

- alone: the talker's steps with nothing beside them; then the decoder's calls alone;
- thread: the decoder's loop in a thread of this process on a stream of its own;
- thread-prio: the same, the talker's steps on a high-priority stream;
- process: the decoder's loop in a child process (the served layout).

Per phase: the talker's mean step (the device synchronised after each) and the decoder's
calls per second. Runs in the qwen3-tts environment on a release-shape model directory:

    /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_colocate.py --model DIR
        [--batch 64] [--steps 60] [--frames 75] [--skip 15] [--device cuda]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TEXT = "The ship sailed north across the cold sea, carrying wheat, wool, iron and passengers."


def load_decoder(model: str, device: str) -> Any:
    from omni.models.qwen3_tts_codec import build_qwen3_tts_code2wav_runner

    dtype = "bfloat16" if device == "cuda" else "float32"
    return build_qwen3_tts_code2wav_runner(model_dir=model, device=device, dtype=dtype,
                                           options={}).c2w


def decode_loop(c2w: Any, args: argparse.Namespace, stop: Any, stream: Any) -> float:
    """Decode calls until stop is set; calls completed per second."""
    import torch

    codes = torch.randint(0, c2w.codebook_size, (args.batch, c2w.num_quantizers, args.frames))
    calls, t0 = 0, time.perf_counter()
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        while not stop.is_set():
            c2w.decode(codes, args.skip)  # returns on the host: the call has completed
            calls += 1
    return calls / (time.perf_counter() - t0)


def warm_decoder(c2w: Any, args: argparse.Namespace) -> None:
    """The call shape once (first-use costs: cuDNN plans, the fused kernel's compile)."""
    import torch

    c2w.decode(torch.zeros(args.batch, c2w.num_quantizers, args.frames, dtype=torch.long),
               args.skip)


def child(model: str, args: argparse.Namespace, ready: Any, stop: Any, out: Any) -> None:
    c2w = load_decoder(model, args.device)
    warm_decoder(c2w, args)
    ready.set()
    out.put(decode_loop(c2w, args, stop, None))


def talker_steps(engine: Any, steps: int, sync: Any, stream: Any) -> float:
    """Mean ms of ``steps`` engine steps, the device synchronised after each."""
    import torch

    times = []
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        for _ in range(steps):
            t0 = time.perf_counter()
            outs = engine.step()
            sync()
            times.append(time.perf_counter() - t0)
            assert all(o.error is None for o in outs), [o.error for o in outs]
    return statistics.mean(times) * 1e3


def start_talker(args: argparse.Namespace) -> Any:
    from omni.engines.ar.feedback import FeedbackAREngine
    from omni.engines.base import EngineRequest

    engine = FeedbackAREngine(
        "qwen3_tts_ar_talker", args.model, device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        options={"subtalker_dosample": False, "max_num_seqs": args.batch,
                 "kv_cache_mb": 4096})
    for i in range(args.batch):  # long enough for every phase
        engine.add(EngineRequest(f"r{i}", {"text": TEXT},
                                 {"temperature": 0, "max_tokens": 6 * args.steps + 40}))
    while any(not seq.output for seq in engine._seqs.values()):
        engine.step()
    for _ in range(3):
        engine.step()
    return engine


def with_thread(engine: Any, c2w: Any, args: argparse.Namespace, sync: Any,
                talker_stream: Any) -> tuple[float, float]:
    import torch

    stop, result = threading.Event(), []
    stream = torch.cuda.Stream() if args.device == "cuda" else None
    worker = threading.Thread(target=lambda: result.append(decode_loop(c2w, args, stop, stream)))
    worker.start()
    try:
        time.sleep(0.5)  # the loop is running
        step = talker_steps(engine, args.steps, sync, talker_stream)
    finally:  # the decoder thread ends with the phase, failed or not
        stop.set()
        worker.join()
    return step, result[0]


def with_process(engine: Any, args: argparse.Namespace, sync: Any) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=child, args=(args.model, args, ready, stop, out))
    proc.start()
    if not ready.wait(300):
        proc.kill()
        raise RuntimeError("the decoder process did not start")
    try:
        time.sleep(0.5)
        step = talker_steps(engine, args.steps, sync, None)
        stop.set()
        return step, out.get(timeout=120)
    finally:  # a failed phase leaves no decoder process holding the GPU
        stop.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--frames", type=int, default=75)
    parser.add_argument("--skip", type=int, default=15)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run (float32)")
    args = parser.parse_args()
    import torch

    cuda = args.device == "cuda"
    # the talker's own stream, not the device: a device-wide sync would also wait for the
    # decoder thread's stream and count its kernels in the talker's step
    sync = (lambda: torch.cuda.current_stream().synchronize()) if cuda else (lambda: None)
    c2w = load_decoder(args.model, args.device)
    warm_decoder(c2w, args)
    engine = start_talker(args)
    rows = [("alone", talker_steps(engine, args.steps, sync, None), None)]
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    rows.append(("decoder alone", None, decode_loop(c2w, args, stop, None)))
    rows.append(("thread", *with_thread(engine, c2w, args, sync, None)))
    if cuda:
        high = torch.cuda.Stream(priority=-1)  # lower is higher; the default is 0
        rows.append(("thread-prio", *with_thread(engine, c2w, args, sync, high)))
    rows.append(("process", *with_process(engine, args, sync)))
    print(f"B={args.batch}, decoder calls of ({args.batch}, {args.frames}) frames, "
          f"{args.skip} left out of the conv stack")
    print("| phase | talker step ms | decoder calls/s |")
    print("|---|---:|---:|")
    for name, step, rate in rows:
        print(f"| {name} | {'-' if step is None else f'{step:.1f}'} | "
              f"{'-' if rate is None else f'{rate:.2f}'} |", flush=True)
    engine.abort(list(engine._seqs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
