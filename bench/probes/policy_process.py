"""Is the policy engine slower in an engine process than in-process? Times the π0 policy
engine at c=1 (add -> chunk) in this process, in a child forked from a fork server that
preloaded torch + transformers (how omni starts engines), and in a spawned child.

    python bench/probes/policy_process.py MODEL_DIR
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time


def measure(model_dir: str, rounds: int = 20) -> dict:
    import numpy as np

    from omni.engines.base import EngineRequest
    from omni.engines.policy.engine import PolicyEngine
    from omni.models import build_policy
    from omni.wire.arrays import pack_tree

    policy = build_policy("pi0", model_dir=model_dir, device="cuda", dtype="auto", options={})
    engine = PolicyEngine(policy, {})
    rng = np.random.default_rng(0)
    obs = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/state": rng.standard_normal(8), "prompt": "pick"}
    frame = {"observation": pack_tree(obs)}
    samples = []
    for i in range(rounds + 3):
        start = time.perf_counter()
        engine.add(EngineRequest(f"r{i}", frame, {"seed": i}))
        while engine.has_work():
            engine.step()
        if i >= 3:
            samples.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": round(statistics.median(samples), 1), "min_ms": round(min(samples), 1)}


def child(model_dir: str, queue) -> None:
    queue.put(measure(model_dir))


def in_context(kind: str, model_dir: str) -> dict:
    context = multiprocessing.get_context(kind)
    if kind == "forkserver":
        context.set_forkserver_preload(["torch", "transformers", "omni.engines.proc"])
    queue = context.Queue()
    process = context.Process(target=child, args=(model_dir, queue))
    process.start()
    result = queue.get(timeout=300)
    process.join(60)
    return result


if __name__ == "__main__":
    model = sys.argv[1]
    print("spawned child:", in_context("spawn", model), flush=True)
    print("fork-server child:", in_context("forkserver", model), flush=True)
    print("this process:", measure(model), flush=True)
