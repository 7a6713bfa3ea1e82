"""Robot policies over the OpenPI WebSocket, measured the way robots use them: `python -m
omni.server --model <π0 release>` as a subprocess and WebSocket clients speaking openpi's
msgpack-numpy (the same bytes openpi-client sends), against the policy called in-process.

  in-process  the π0 adapter's preprocessing + transformers' `sample_actions` + the
              chunk's un-normalising, one observation at a time, on the same device and
              dtype, in this process (the server is not running then).
  c=1         one robot through the server: round trip (frame sent -> actions received).
              Server overhead = its p50 - the in-process p50 (target <= 2 ms).
  c=N         N robots at once, each calling in lockstep: chunks/s over all of them,
              against N sequential in-process calls (target on the H200 at N=32: >= 3x).

Observation: two 224x224x3 uint8 cameras, an 8-value state and a prompt (LIBERO's keys),
about 301 KB per frame; each robot its own images and prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import hardware, say

DESCRIPTION = __doc__
PROMPTS = ("pick up the red block", "open the top drawer", "put the bowl on the plate",
           "close the microwave")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="a π0 release directory (default: the tiny random fixture)")
    parser.add_argument("--rounds", type=int, default=50, help="calls timed at c=1 (50)")
    parser.add_argument("--concurrency", default="8,32", help="robots at once (8,32)")
    parser.add_argument("--calls", type=int, default=5, help="calls per robot at c=N (5)")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--tag", default="", help="report name suffix: robots-TAG.md")


def observation(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8).astype(np.float32),
            "prompt": PROMPTS[i % len(PROMPTS)]}


def stats_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5) * 1000, 3), "p99": round(pick(0.99) * 1000, 3),
            "mean": round(sum(ordered) / len(ordered) * 1000, 3), "n": len(ordered)}


def in_process(model_dir: str, dtype: str, rounds: int) -> dict[str, Any]:
    import torch

    from omni.engines.base import resolve_device
    from omni.models import build_policy
    from omni.wire.arrays import pack_tree

    device = resolve_device("auto")
    policy = build_policy("pi0", model_dir=model_dir, device=device, dtype=dtype, options={})
    frames = [{"observation": pack_tree(observation(i))} for i in range(8)]

    def call(i: int) -> None:
        job = policy.prepare("b", frames[i % len(frames)], i, None)
        cameras = job.inputs["pixel_values"].shape[1]
        chunk = policy.model.sample_actions(
            state=job.state, input_ids=job.inputs["input_ids"],
            pixel_values=job.inputs["pixel_values"], noise=job.actions,
            attention_mask=job.inputs["attention_mask"],
            pixel_attention_mask=torch.ones(1, cameras, dtype=torch.bool, device=device))
        job.actions = chunk
        policy.finish(job)["actions"].numpy()  # to the host, as a reply needs it

    def timed() -> dict[str, float]:
        for i in range(3):
            call(i)
        samples = []
        for i in range(rounds):
            start = time.perf_counter()
            call(i)
            samples.append(time.perf_counter() - start)
        return stats_ms(samples)

    plain = timed()
    with torch.inference_mode():  # what our engine runs under: the stricter baseline
        inference = timed()
    return {"device": device, "info": policy.info(), "latency_ms": plain,
            "inference_mode_latency_ms": inference,
            "engine_latency_ms": engine_in_process(policy, frames, rounds)}


def engine_in_process(policy: Any, frames: list[dict[str, Any]], rounds: int
                      ) -> dict[str, float]:
    """The policy engine driven in this process, one request at a time: what the engine's
    loop costs over sample_actions, before any process or socket hop."""
    from omni.engines.base import EngineRequest
    from omni.engines.policy.engine import PolicyEngine

    engine = PolicyEngine(policy, {})
    samples = []
    for i in range(rounds + 3):
        start = time.perf_counter()
        engine.add(EngineRequest(f"r{i}", frames[i % len(frames)], {"seed": i}))
        while engine.has_work():
            for out in engine.step():
                out.data["actions"].numpy()
        if i >= 3:
            samples.append(time.perf_counter() - start)
    return stats_ms(samples)


async def _robot(url: str, index: int, calls: int, samples: list[float],
                 timings: list[tuple[float, float]] | None = None) -> None:
    import aiohttp

    from omni.api.openpi import codec

    frame = codec.packb(observation(index))
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url, max_msg_size=0, compress=0) as ws:
            await ws.receive(timeout=60)  # metadata
            for _ in range(calls):
                start = time.perf_counter()
                await ws.send_bytes(frame)
                reply = await ws.receive(timeout=120)
                if reply.type != aiohttp.WSMsgType.BINARY:
                    raise RuntimeError(f"robot {index}: {reply.data!r}")
                samples.append(time.perf_counter() - start)
                if timings is not None:  # after the clock: where the time went
                    reply_data = codec.unpackb(reply.data)
                    policy = reply_data["policy_timing"]
                    timings.append((reply_data["server_timing"]["infer_ms"],
                                    policy["infer_ms"], policy.get("prepare_ms") or 0.0))


# the server's own histograms (omni/runtime/metrics.py) whose means split a c=1 round trip:
# key -> (histogram, the labels a sample must carry)
SPLIT_METRICS = {"hop_in_ms": ("omni_stage_hop_seconds", {"direction": "in"}),
                 "hop_out_ms": ("omni_stage_hop_seconds", {"direction": "out"}),
                 "step_wait_ms": ("omni_stage_step_wait_seconds", {}),
                 "stage_ms": ("omni_stage_latency_seconds", {})}


async def _metric_sums(base: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each SPLIT_METRICS histogram, over all its stages."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as reply:
        text = await reply.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    sums = {}
    for key, (name, labels) in SPLIT_METRICS.items():
        total = {"_sum": 0.0, "_count": 0.0}
        family = families.get(name)
        for sample in family.samples if family else ():
            suffix = sample.name.removeprefix(name)
            if suffix in total and labels.items() <= sample.labels.items():
                total[suffix] += sample.value
        sums[key] = (total["_sum"], total["_count"])
    return sums


def _split_means(before: dict, after: dict) -> dict[str, float | None]:
    """Mean ms per request between two scrapes (None: not recorded)."""
    out: dict[str, float | None] = {}
    for key in SPLIT_METRICS:
        total, count = (after[key][i] - before[key][i] for i in (0, 1))
        out[key] = round(total / count * 1000, 3) if count else None
    return out


def _median(values: list[float]) -> float:
    return round(sorted(values)[len(values) // 2], 3)


async def through_server(base: str, rounds: int, levels: list[int],
                         calls: int) -> dict[str, Any]:
    url = base.replace("http", "ws", 1) + "/"
    warm: list[float] = []
    await _robot(url, 0, 3, warm)
    single: list[float] = []
    timings: list[tuple[float, float, float]] = []
    before = await _metric_sums(base)
    await _robot(url, 0, rounds, single, timings)
    split = _split_means(before, await _metric_sums(base))
    result: dict[str, Any] = {"c1": stats_ms(single), "levels": {},
                              "c1_server_ms": _median([t[0] for t in timings]),
                              "c1_engine_ms": _median([t[1] for t in timings]),
                              "c1_prepare_ms": _median([t[2] for t in timings]),
                              "c1_split_mean_ms": split}
    for n in levels:
        await asyncio.gather(*(_robot(url, i, 1, []) for i in range(n)))  # connect + warm
        samples: list[float] = []
        start = time.perf_counter()
        await asyncio.gather(*(_robot(url, i, calls, samples) for i in range(n)))
        wall = time.perf_counter() - start
        result["levels"][str(n)] = {"chunks_per_s": round(len(samples) / wall, 2),
                                    "latency_ms": stats_ms(samples), "wall_s": round(wall, 2)}
        say(f"[robots] c={n}: {len(samples) / wall:.1f} chunks/s")
    return result


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.ar_ours import start_server

    model_dir = args.model
    if model_dir is None:
        from omni.fixtures.tiny_models import ensure_tiny_model
        model_dir = str(ensure_tiny_model("pi0"))
    levels = [int(x) for x in args.concurrency.split(",") if x]
    say(f"[robots] in-process: {model_dir}")
    inproc = in_process(model_dir, args.dtype, args.rounds)
    free_device_memory()  # the in-process copy is gone before the server loads its own
    say(f"[robots] in-process p50 {inproc['latency_ms']['p50']} ms; starting the server")
    proc, base = start_server(("--model", model_dir), args.dtype, 900)
    try:
        ours = asyncio.run(through_server(base, args.rounds, levels, args.calls))
    finally:
        proc.terminate()
        proc.wait(60)
    sequential = 1000.0 / inproc["latency_ms"]["mean"]
    result = {"command": "python -m bench " + " ".join(argv), "hardware": hardware(),
              "model": model_dir, "observation_bytes": observation_bytes(),
              "in_process": inproc, "server": ours,
              "overhead_p50_ms": round(ours["c1"]["p50"] - inproc["latency_ms"]["p50"], 3),
              "overhead_inference_p50_ms": round(
                  ours["c1"]["p50"] - inproc["inference_mode_latency_ms"]["p50"], 3),
              "overhead_engine_p50_ms": round(
                  ours["c1"]["p50"] - inproc["engine_latency_ms"]["p50"], 3),
              "sequential_chunks_per_s": round(sequential, 2), "gpu": gpu_name()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"robots-{args.tag}" if args.tag else "robots"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(report(result))
    say(f"[robots] wrote {out / name}.md")
    return 0


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def observation_bytes() -> int:
    from omni.api.openpi import codec
    return len(codec.packb(observation(0)))


def report(r: dict[str, Any]) -> str:
    inproc, ours, hw = r["in_process"], r["server"], r["hardware"]
    lines = ["# Robots: π0 over the OpenPI WebSocket vs the policy in-process", "",
             f"Command: `{r['command']}`  ",
             f"Machine: {hw.get('cpu_model', '?')}, {hw.get('cores')} cores, "
             f"{r.get('gpu') or 'no GPU'}; device {inproc['device']}, "
             f"{inproc['info'].get('dtype')}  ",
             f"Model: `{r['model']}` (random weights; horizon {inproc['info']['horizon']}, "
             f"{inproc['info']['steps']} steps, image {inproc['info']['image_size']})  ",
             f"Observation frame: {r['observation_bytes']} bytes (2 cameras 224x224x3 "
             "uint8, state 8, prompt)", "", DESCRIPTION.split("\n\n", 1)[1].strip(), "",
             "## c=1: one robot", "",
             "| side | p50 ms | p99 ms | mean ms |", "|---|---:|---:|---:|",
             f"| in-process (sample_actions) | {inproc['latency_ms']['p50']} | "
             f"{inproc['latency_ms']['p99']} | {inproc['latency_ms']['mean']} |",
             f"| in-process (sample_actions in torch.inference_mode) | "
             f"{inproc['inference_mode_latency_ms']['p50']} | "
             f"{inproc['inference_mode_latency_ms']['p99']} | "
             f"{inproc['inference_mode_latency_ms']['mean']} |",
             f"| ours: the policy engine, in-process | {inproc['engine_latency_ms']['p50']} | "
             f"{inproc['engine_latency_ms']['p99']} | {inproc['engine_latency_ms']['mean']} |",
             f"| ours (server round trip) | {ours['c1']['p50']} | {ours['c1']['p99']} | "
             f"{ours['c1']['mean']} |", "",
             f"Server overhead p50: **{r['overhead_p50_ms']} ms** (target <= 2 ms: "
             f"{'met' if r['overhead_p50_ms'] <= 2 else 'missed'}). Where the round trip "
             f"went (p50): the server from frame received to reply sent "
             f"{ours.get('c1_server_ms')} ms, of which the engine from the observation's "
             f"arrival (preprocessed) to the chunk {ours.get('c1_engine_ms')} ms. Over "
             f"sample_actions in inference mode (what our engine runs under): "
             f"{r['overhead_inference_p50_ms']} ms; over our engine in-process (the "
             f"hops, the front end, the WebSocket): {r['overhead_engine_p50_ms']} ms.", "",
             *_split_lines(ours),
             "## c=N: robots at once", "",
             "| robots | ours chunks/s | vs sequential in-process | p50 ms | p99 ms |",
             "|---:|---:|---:|---:|---:|"]
    for n, level in ours["levels"].items():
        ratio = level["chunks_per_s"] / r["sequential_chunks_per_s"]
        lines.append(f"| {n} | {level['chunks_per_s']} | {ratio:.2f}x | "
                     f"{level['latency_ms']['p50']} | {level['latency_ms']['p99']} |")
    lines += ["", f"Sequential in-process: {r['sequential_chunks_per_s']} chunks/s "
              "(1 / its mean latency).", ""]
    return "\n".join(lines)


def _split_lines(ours: dict[str, Any]) -> list[str]:
    """The c=1 round trip split by the server's own clocks (absent in older results)."""
    split = ours.get("c1_split_mean_ms")
    if not split:
        return []
    return ["Split of one c=1 call by the server's clocks (p50 from the reply's timings, "
            "means from the server's /metrics histograms over the same calls): "
            f"preprocessing in the engine p50 {ours.get('c1_prepare_ms')} ms; "
            f"hop front -> engine mean {split['hop_in_ms']} ms, engine -> front "
            f"{split['hop_out_ms']} ms (sockets, decoding and event loops); waiting behind "
            f"a running engine step {split['step_wait_ms']} ms; the stage from submit to "
            f"its last output {split['stage_ms']} ms. The rest of the server's time is the "
            "front end (frame decode, submit, reply encode).", ""]
