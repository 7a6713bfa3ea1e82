"""Where one decode step of the AR engine goes: the host's phases vs the GPU's replay.

``python -m bench.ar_step --model DIR [--device cuda] [--batch 1,8,32] [--steps 50]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.common import hardware, say
from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest

METHOD = """The engine (omni/engines/ar/engine.py) is loaded in this process and fed `batch`
requests of 128 random prompt token ids each (greedy, ignore_eos). Once every request has
its first token, `steps` consecutive decode steps are timed one by one (`step` = one
AREngine.step() call; back to back, so with overlap on it is the steady period), and inside
each, the engine's own phases, by wrapping its methods. Each batch is measured with the
engine's step order `off` (each step finishes before the next is scheduled), `on`
(overlap_steps: the outputs of one step are built while the GPU runs the next) and `chain`
(overlap_steps + chain_decode: a greedy decode step is launched on the tokens the device
picked, before the host reads them; omni/engines/ar/steps.py), same engine:

- `schedule`: Scheduler.schedule (who runs, KV blocks for the new tokens);
- `forward`: AREngine._forward: on CUDA with graphs, filling the graph's static inputs
  and launching its replay (the host does not wait for the GPU here);
- `collect`: StepRunner._collect: waits for the GPU to finish the step, picks the tokens
  (sampling.sample; chain: reads the ones picked on the device) and records them; with
  overlap on, for the step launched by the previous call;
- `emit`: AREngine._emit over the batch (detokenizing, stop strings, the output dicts);
- `rest`: the step minus those (finish_step, bookkeeping).

With chain, `forward` includes the chained launch, made before `collect` waits.

`replay` is the GPU's time for the same decode graph replayed back to back (synchronized
once at the end), with the last step's inputs: the step's time with no host work at all.
`step - replay` is the time the GPU waits on the host each step. Not in `step`: the
engine process's loop (reading messages, publishing outputs), which a served request also
pays; compare with `step p50` in bench ar's report."""

PHASES = ("schedule", "forward", "collect", "emit")


class _PhaseTimer:
    """Accumulates the wall time of wrapped callables for the current step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - started
        return timed

    def take(self) -> dict[str, float]:
        taken, self.current = dict(self.current), defaultdict(float)
        return taken


def _instrument(engine: AREngine, timer: _PhaseTimer) -> Callable[[], None]:
    """Wrap the engine's phases (instance attributes shadow the methods); returns undo."""
    engine.scheduler.schedule = timer.wrap("schedule", engine.scheduler.schedule)
    engine._forward = timer.wrap("forward", engine._forward)
    engine._emit = timer.wrap("emit", engine._emit)
    engine.runner._collect = timer.wrap("collect", engine.runner._collect)

    def undo() -> None:
        del engine.scheduler.schedule, engine._forward, engine._emit, engine.runner._collect
    return undo


def _sync(engine: AREngine) -> None:
    if engine.lm.device.type == "cuda":
        torch.cuda.synchronize(engine.lm.device)


def _replay_ms(engine: AREngine, rounds: int, kernels: int = 0) -> tuple[float | None, str]:
    """GPU time of the last replayed decode graph, replayed back to back; with kernels > 0,
    also torch.profiler's table of the kernels with the most GPU time in those replays."""
    graphs = engine.graphs
    if graphs is None or not graphs.replays:
        return None, ""
    running = engine.scheduler.running
    graph = graphs.graphs[graphs.bucket(len(running), max(s.computed for s in running))][0]
    _sync(engine)
    started = time.perf_counter()
    for _ in range(rounds):
        graph.replay()
    _sync(engine)
    elapsed = (time.perf_counter() - started) / rounds * 1e3
    if not kernels:
        return elapsed, ""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            graph.replay()
        _sync(engine)
    return elapsed, prof.key_averages().table(sort_by="cuda_time_total", row_limit=kernels)


def measure_batch(engine: AREngine, batch: int, steps: int, prompt_len: int,
                  mode: str, kernels: int = 0) -> dict[str, Any]:
    engine.runner.overlap, engine.runner.chain = mode != "off", mode == "chain"
    rng = random.Random(f"{batch}-{mode}")  # distinct prompts per mode: no prefix-cache hits
    vocab = engine.lm.vocab_size
    ids = [f"b{batch}-{mode}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add(EngineRequest(rid, {"prompt_token_ids": [rng.randrange(100, vocab - 100)
                                                            for _ in range(prompt_len)]},
                                 {"temperature": 0, "ignore_eos": True, "max_tokens": 100_000}))
    timer = _PhaseTimer()
    undo = _instrument(engine, timer)
    prefill = _until_first_tokens(engine, timer, batch)
    for _ in range(5):  # a few decode steps before timing
        engine.step()
    timer.take()
    rows = []
    try:
        for _ in range(steps):
            begun = time.perf_counter()
            outputs = engine.step()
            total = time.perf_counter() - begun
            assert len(outputs) == batch, f"{len(outputs)} outputs for {batch} requests"
            phases = timer.take()
            phases["step"] = total
            phases["rest"] = total - sum(phases.get(p, 0.0) for p in PHASES)
            rows.append(phases)
    finally:
        undo()
    replay, table = _replay_ms(engine, max(steps, 20), kernels)
    engine.abort(ids)
    result = {name: round(statistics.median(r.get(name, 0.0) for r in rows) * 1e3, 3)
              for name in (*PHASES, "rest", "step")}
    result.update(batch=batch, mode=mode, kernels=table, prefill=prefill,
                  replay=None if replay is None else round(replay, 3),
                  graphed=engine.graphs is not None and engine.graphs.replays > 0)
    say(f"[ar_step] batch {batch}, {mode}: " + ", ".join(
        f"{k} {result[k]} ms" for k in (*PHASES, "rest", "step", "replay")))
    say(f"[ar_step] batch {batch}, {mode}: every first token after {prefill['first_tokens']} ms"
        f" in {len(prefill['steps'])} steps: " + "; ".join(
            ", ".join(f"{k} {v}" for k, v in row.items()) for row in prefill["steps"]))
    return result


def _until_first_tokens(engine: AREngine, timer: _PhaseTimer, batch: int) -> dict[str, Any]:
    """Step until every request has its first token: the time that took (the engine's
    share of TTFT for a burst of `batch` prompts) and each step's phases, in ms."""
    started: set[str] = set()
    steps = []
    begun = time.perf_counter()
    while len(started) < batch:
        step_begun = time.perf_counter()
        outputs = engine.step()
        phases = timer.take()
        phases["step"] = time.perf_counter() - step_begun
        steps.append({k: round(v * 1e3, 2) for k, v in phases.items()})
        started |= {o.request_id for o in outputs if o.data and o.data.get("token_ids")}
    return {"first_tokens": round((time.perf_counter() - begun) * 1e3, 2), "steps": steps}


def render(data: dict[str, Any]) -> str:
    m, info = data["machine"], data["engine"]
    gpu = torch.cuda.get_device_name() if info["device"].startswith("cuda") else "none"
    lines = ["# Where an AR decode step goes: host phases vs the GPU's replay", "",
             f"Command: `{data['command']}`  ",
             f"Machine: {m['cpu_model']}, {m['cores']} cores; GPU {gpu}; torch "
             f"{torch.__version__}  ",
             f"Model: `{info['model_dir']}` ({info['dtype']} on {info['device']}, random "
             f"weights {info['random_weights']}); prompts {data['prompt_len']} tokens", "",
             "| batch | mode | schedule | forward (fill + launch) | collect (waits for GPU) | "
             "emit | rest | **step** | replay (GPU only) | GPU waits on host | graphed |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in data["rows"]:
        wait = "-" if r["replay"] is None else f"{r['step'] - r['replay']:.3f}"
        lines.append(f"| {r['batch']} | {r['mode']} | {r['schedule']} | {r['forward']} | {r['collect']} | "
                     f"{r['emit']} | {r['rest']} | **{r['step']}** | {r['replay'] or '-'} | "
                     f"{wait} | {r['graphed']} |")
    lines += ["", "All times in ms, median over the timed steps. Method: " + METHOD, "",
              "Before the timed steps, from the first step() call until every request of the "
              "batch had its first token (the engine's part of a burst's TTFT), in ms:", ""]
    for r in data["rows"]:
        steps = "; ".join(", ".join(f"{k} {v}" for k, v in step.items())
                          for step in r["prefill"]["steps"])
        lines.append(f"- batch {r['batch']}, {r['mode']}: {r['prefill']['first_tokens']} "
                     f"({steps})")
    for r in data["rows"]:
        if r.get("kernels"):
            lines += ["", f"Kernels of the batch-{r['batch']} replays (torch.profiler):", "",
                      "```", r["kernels"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ar_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=METHOD)
    parser.add_argument("--model", required=True, help="HF-format model directory")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    parser.add_argument("--batch", default="1,8,32", help="batch sizes (default 1,8,32)")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed per batch")
    parser.add_argument("--modes", default="off,on,chain",
                        help="step orders measured per batch, on the same engine: off (each "
                        "step finishes first), on (overlap_steps), chain (overlap_steps + "
                        "chain_decode); default off,on,chain")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens")
    parser.add_argument("--engine-option", action="append", default=[], metavar="K=V",
                        help="an AR engine option (the value read as YAML), repeatable")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also list the N kernels with the most GPU time in the replays "
                        "(torch.profiler), once per batch")
    parser.add_argument("--tag", default="", help="report name suffix")
    parser.add_argument("--out", default="bench/results", help="directory for the report")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    options: dict[str, Any] = {"max_graph_context": 1024}  # 128 + steps fit: quicker load
    for item in args.engine_option:  # values as YAML: 8, true, triton
        key, _, value = item.partition("=")
        options[key] = yaml.safe_load(value)
    say(f"[ar_step] loading {args.model} on {args.device} ...")
    engine = AREngine(args.model, dtype=args.dtype, device=args.device, options=options)
    modes = args.modes.split(",")
    if not set(modes) <= {"off", "on", "chain"}:
        parser.error(f"--modes takes off, on, chain; got {args.modes!r}")
    rows = [measure_batch(engine, int(b), args.steps, args.prompt_len, mode,
                          args.kernels if mode == modes[-1] else 0)
            for b in args.batch.split(",") for mode in modes]
    argv_used = argv if argv is not None else sys.argv[1:]
    data = {"command": "python -m bench.ar_step " + " ".join(argv_used),
            "machine": hardware(), "engine": engine.info(), "prompt_len": args.prompt_len,
            "options": options, "rows": rows}
    engine.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "ar-step" + (f"-{args.tag}" if args.tag else "")
    (out / f"{name}.md").write_text(render(data))
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    say(f"[ar_step] wrote {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
