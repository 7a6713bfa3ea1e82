"""π0 pass by pass, eager vs CUDA graphs (omni/models/pi0_graphs.py): where a chunk's
time goes, and how far the graphed passes are from the eager ones.

    python bench/probes/pi0_graphs.py MODEL_DIR [OUT_JSON]

Per batch size: the prefix pass and one flow step, each timed to the device's finish
(median of 15), graphed and eager, with the graphed step's host time alone (the call's
return, before the device is done) and ||graphed - eager|| / ||eager||; then one robot's
whole chunk through the policy engine, graphed and eager, and transformers'
sample_actions.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from omni.engines.base import EngineRequest
from omni.engines.policy.engine import PolicyEngine
from omni.models import build_policy
from omni.wire.arrays import pack_tree

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run, no graphs


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def ms(fn: Callable[[], Any], rounds: int = 15, sync: bool = True) -> float:
    fn()
    synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        if sync:
            synchronize()
        samples.append((time.perf_counter() - start) * 1000)
        synchronize()
    return round(statistics.median(samples), 3)


def observation(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": f"task {i} pick"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def passes(policy: Any, n: int) -> dict[str, Any]:
    graphs = policy.graphs
    jobs = [policy.prepare(f"p{n}-{i}", {"observation": pack_tree(observation(i))}, i,
                           None) for i in range(n)]
    row: dict[str, Any] = {"batch": n}
    with torch.inference_mode():
        for side in ("eager", "graphs"):
            policy.graphs = graphs if side == "graphs" else None
            row[f"prefix_{side}_ms"] = ms(lambda: policy.prefix(jobs))
        policy.graphs = None
        policy.prefix(jobs)
        eager_kv = [torch.cat(p) for p in jobs[-1].prefix["kv"]]
        policy.graphs = graphs
        policy.prefix(jobs)
        row["prefix_rel_err"] = max(rel(torch.cat(p), e)
                                    for p, e in zip(jobs[-1].prefix["kv"], eager_kv, strict=True))
        actions = torch.randn(n, policy.horizon, policy.max_action_dim, device=DEVICE,
                              dtype=policy.dtype)
        t = torch.rand(n, device=DEVICE)
        for side in ("eager", "graphs"):
            policy.graphs = graphs if side == "graphs" else None
            row[f"step_{side}_ms"] = ms(lambda: policy.velocity(jobs, actions, t))
            policy.idle()
        row["step_graphs_host_ms"] = ms(lambda: policy.velocity(jobs, actions, t),
                                        sync=False)
        if n == 1 and DEVICE == "cuda":
            policy.graphs = None
            try:
                row["kernels"] = kernels(lambda: policy.velocity(jobs, actions, t))
            except Exception as e:  # noqa: BLE001 - the profiler is a nice-to-have here
                row["kernels"] = repr(e)
            policy.graphs = graphs
            policy.idle()
        graphed = policy.velocity(jobs, actions, t)
        policy.graphs = None
        row["step_rel_err"] = rel(graphed, policy.velocity(jobs, actions, t))
        policy.graphs = graphs
        policy.idle()
    return row


def reference(policy: Any, frame: dict, seed: int) -> torch.Tensor:
    """transformers' sample_actions, cut and un-normalised as the engine's chunk is."""
    job = policy.prepare("ref", frame, seed, None)
    job.actions = policy.model.sample_actions(
        state=job.state, input_ids=job.inputs["input_ids"],
        pixel_values=job.inputs["pixel_values"], noise=job.actions,
        attention_mask=job.inputs["attention_mask"],
        pixel_attention_mask=torch.ones(1, 2, dtype=torch.bool, device=DEVICE))
    return policy.finish(job)["actions"]


def kernels(fn: Callable[[], Any]) -> dict[str, Any]:
    """The device's kernels in one call (the graph replays the same ones): how many, their
    summed time, the five costliest."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize()
    rows = [(e.key, e.count, e.self_device_time_total) for e in prof.key_averages()]
    rows.sort(key=lambda r: -r[2])
    return {"kernels": sum(r[1] for r in rows),
            "device_ms": round(sum(r[2] for r in rows) / 1000, 3),
            "top": [(k[:60], c, round(us / 1000, 3)) for k, c, us in rows[:5]]}


def chunks(policy: Any, rounds: int = 10) -> dict[str, float]:
    engine = PolicyEngine(policy, {})
    frame = {"observation": pack_tree(observation(0))}
    graphs, out, last = policy.graphs, {}, {}
    for side in ("eager", "graphs"):
        policy.graphs = graphs if side == "graphs" else None

        def chunk(side: str = side) -> None:
            engine.add(EngineRequest(f"c{time.perf_counter()}", frame, {"seed": 0}))
            while engine.has_work():
                for o in engine.step():
                    last[side] = o.data["actions"]
        out[f"engine_chunk_{side}_ms"] = ms(chunk, rounds, sync=False)
    policy.graphs = graphs
    out["sample_actions_ms"] = ms(lambda: reference(policy, frame, 0), rounds)
    expected = reference(policy, frame, 0)
    out.update({f"chunk_{side}_rel_err": rel(last[side], expected) for side in last})
    return out


def main(model_dir: str, out_json: str | None) -> None:
    start = time.perf_counter()
    policy = build_policy("pi0", model_dir=model_dir, device=DEVICE, dtype="auto", options={})
    result: dict[str, Any] = {"load_s": round(time.perf_counter() - start, 1),
                              "info": policy.info()}
    print("[pi0_graphs] loaded:", result, flush=True)
    result["passes"] = [passes(policy, n) for n in (1, 8, 32)]
    result["step_kernels"] = result["passes"][0].pop("kernels", None)
    result.update(chunks(policy))
    result["info_after"] = policy.info()
    if out_json:
        with open(out_json, "w") as f:
            json.dump(result, f, indent=1)
    keys = [k for k in result["passes"][0] if k != "batch"]
    print("[pi0_graphs] batch | " + " | ".join(keys))
    for row in result["passes"]:
        print(f"[pi0_graphs] {row['batch']} | " + " | ".join(
            f"{row.get(k, '-'):.4g}" if isinstance(row.get(k), float) else str(row.get(k))
            for k in keys))
    print("[pi0_graphs]", {k: v for k, v in result.items() if k.endswith(("_ms", "_err"))})
    print("[pi0_graphs] one step's kernels at batch 1:", result.get("step_kernels"))
    print("[pi0_graphs] info:", result["info_after"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
