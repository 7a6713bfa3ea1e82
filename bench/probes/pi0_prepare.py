"""Where the π0 adapter's `prepare` (an observation's preprocessing) spends its time, piece by
piece, in this process and in a spawned child (as an engine process runs it).

    python bench/probes/pi0_prepare.py MODEL_DIR
"""
# ruff: noqa: B023 (each lambda runs at once, inside the loop iteration that made it)

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time


def measure(model_dir: str, rounds: int = 50) -> dict:
    import numpy as np
    import torch

    from omni.models import build_policy
    from omni.models.policy_images import resize_pad
    from omni.wire.arrays import pack_tree, unpack_tree

    policy = build_policy("pi0", model_dir=model_dir,
                          device="cuda" if torch.cuda.is_available() else "cpu", dtype="auto",
                          options={})
    rng = np.random.default_rng(0)
    obs = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/state": rng.standard_normal(8).astype(np.float32), "prompt": "pick"}
    frame = {"observation": pack_tree(obs)}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times: dict[str, list[float]] = {}

    def timed(name, fn):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        times.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
        return out

    with torch.inference_mode():  # as the engine runs prepare
        for i in range(rounds + 5):
            if i == 5:
                times.clear()
            timed("prepare (whole)", lambda: policy.prepare("p", frame, i, None))
            o = timed("unpack_tree", lambda: unpack_tree(frame["observation"]))
            read = timed("layout.read (keys, frames to uint8, state)",
                         lambda: policy.layout.read(o))
            u8 = [frame for _, frame in read.cameras]
            px = timed("resize_pad (upload uint8, normalise there)", lambda: [
                resize_pad(x, policy.image_size, device=policy.device) for x in u8])
            timed("stack + to(dtype)", lambda: torch.stack(px)[None].to(policy.dtype))
            timed("_prompt (cached after the first)", lambda: policy._prompt("pick", 2))
            timed("state (normalise, pad, upload)", lambda: policy._state(read.state))
            timed("noise randn (CPU generator)", lambda: torch.randn(
                1, policy.horizon, policy.max_action_dim,
                generator=torch.Generator().manual_seed(i)).to(policy.device, policy.dtype))
    return {"threads": torch.get_num_threads(),
            **{k: round(statistics.median(v), 3) for k, v in times.items()}}


def child(model_dir: str, queue: multiprocessing.Queue) -> None:
    queue.put(measure(model_dir))


def main() -> None:
    model_dir = sys.argv[1]
    print("[pi0_prepare] this process:", measure(model_dir), flush=True)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(model_dir, queue))
    proc.start()
    print("[pi0_prepare] spawned child:", queue.get(timeout=300), flush=True)
    proc.join(60)


if __name__ == "__main__":
    main()
