"""The sides of the diffusion benchmark; each serves the same requests and returns one
record per request (arrival and finish times) plus side-specific counters.

Clients are closed-loop: c clients each send their next request when the previous one
returns, ``per_client`` requests each; all start together.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import torch

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import DiffusionEngine


def prompts(count: int) -> list[str]:
    subjects = ["a red fox", "a lighthouse", "a bowl of fruit", "a city at night",
                "a mountain lake", "an old robot", "a field of tulips", "a sailing ship"]
    return [f"{subjects[i % len(subjects)]}, picture number {i}, highly detailed"
            for i in range(count)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def warmed_engine_side(denoiser: Any, options: dict[str, Any], c: int, per_client: int,
                       params: dict[str, Any], warm_params: dict[str, Any]) -> dict[str, Any]:
    """engine_side after one unmeasured burst of c requests at ``warm_params``; the measured
    engine starts with the warm-up's timed calls (its row policy, rows.py), as a server's
    engine does once it has met the shape."""
    warm = DiffusionEngine(denoiser, options)
    engine_side(denoiser, options, c, 1, warm_params, engine=warm)
    measured = DiffusionEngine(denoiser, options)
    measured.rows = warm.rows
    return engine_side(denoiser, options, c, per_client, params, engine=measured)


def engine_side(denoiser: Any, options: dict[str, Any], c: int, per_client: int,
                params: dict[str, Any], engine: DiffusionEngine | None = None
                ) -> dict[str, Any]:
    """Our diffusion engine driven in this process (no processes, no HTTP): requests
    join and leave between steps exactly as in the server's engine process."""
    engine = engine or DiffusionEngine(denoiser, options)
    texts = iter(prompts(c * per_client))
    left = {client: per_client for client in range(c)}
    arrival, done, owner = {}, {}, {}
    skipped = 0

    def submit(client: int) -> None:
        rid = f"r{len(arrival)}"
        arrival[rid], owner[rid] = time.perf_counter(), client
        left[client] -= 1
        engine.add(EngineRequest(rid, {"prompt": next(texts)},
                                 {**params, "seed": len(arrival)}))

    start = time.perf_counter()
    for client in range(c):
        submit(client)
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
            if out.finished:
                done[out.request_id] = time.perf_counter()
                skipped += out.data["skipped_steps"]
                if left[owner[out.request_id]]:
                    submit(owner[out.request_id])
    wall = time.perf_counter() - start
    stats = engine.stats()
    return {"wall_s": wall, "latencies_s": [done[r] - arrival[r] for r in arrival],
            "transformer_calls": stats["transformer_calls"], "rows_run": stats["rows_run"],
            "max_rows": stats["max_rows"], "skipped_steps": skipped}


def server_side(model_dir: str, options: dict[str, Any], c: int, per_client: int,
                params: dict[str, Any]) -> dict[str, Any]:
    """The serving path without HTTP: AsyncOmni (orchestrator, engine process,
    shared-memory payloads) from the model directory's preset."""
    from omni.config.presets import load_pipeline
    from omni.runtime.async_omni import AsyncOmni

    pipeline = load_pipeline(model_dir)

    async def main() -> dict[str, Any]:
        async with AsyncOmni(_with_options(pipeline, options)) as omni:
            await asyncio.gather(*(_one(omni, "warm-up", {**params, "seed": i, "steps": 2})
                                   for i in range(c)))
            texts = iter(prompts(c * per_client))
            latencies: list[float] = []
            skipped = [0]

            async def client() -> None:
                for _ in range(per_client):
                    t0 = time.perf_counter()
                    data = await _one(omni, next(texts), {**params, "seed": len(latencies)})
                    latencies.append(time.perf_counter() - t0)
                    skipped[0] += data["skipped_steps"]
            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(c)))
            return {"wall_s": time.perf_counter() - start, "latencies_s": latencies,
                    "skipped_steps": skipped[0]}
    return asyncio.run(main())


def _with_options(pipeline: Any, options: dict[str, Any]) -> Any:
    import dataclasses

    stage = pipeline.stages[0]
    merged = {**dict(stage.options), **options}
    stages = (dataclasses.replace(stage, options=merged),) + tuple(pipeline.stages[1:])
    return dataclasses.replace(pipeline, stages=stages)


async def _one(omni: Any, prompt: str, params: dict[str, Any]) -> dict[str, Any]:
    final: dict[str, Any] = {}
    async for out in omni.generate({"prompt": prompt}, params={"*": params}):
        if out.data and "images" in out.data:
            final = out.data
    return final


def diffusers_sequential(pipe: Any, c: int, per_client: int, call: dict[str, Any],
                         device: str) -> dict[str, Any]:
    """One pipeline call per request, one at a time (first come, first served)."""
    texts = iter(prompts(c * per_client))
    queue = deque((client, time.perf_counter()) for client in range(c))
    left = {client: per_client - 1 for client in range(c)}
    latencies, start, seed = [], time.perf_counter(), 0
    while queue:
        client, arrived = queue.popleft()
        seed += 1
        pipe(prompt=next(texts), generator=torch.Generator().manual_seed(seed), **call)
        _sync(device)
        latencies.append(time.perf_counter() - arrived)
        if left[client]:
            left[client] -= 1
            queue.append((client, time.perf_counter()))
    return {"wall_s": time.perf_counter() - start, "latencies_s": latencies}


def diffusers_batched(pipe: Any, c: int, per_client: int, call: dict[str, Any],
                      device: str) -> dict[str, Any]:
    """One pipeline call with a list of c prompts per round (all c requests must arrive
    together; each round's requests all wait for the whole batch)."""
    texts = iter(prompts(c * per_client))
    latencies, start = [], time.perf_counter()
    for round_ in range(per_client):
        t0 = time.perf_counter()
        pipe(prompt=[next(texts) for _ in range(c)],
             generator=[torch.Generator().manual_seed(round_ * c + i) for i in range(c)],
             **call)
        _sync(device)
        latencies += [time.perf_counter() - t0] * c
    return {"wall_s": time.perf_counter() - start, "latencies_s": latencies}


@torch.inference_mode()
def bare_transformer(family: str, pipe: Any, height: int, width: int, batch: int,
                     device: str, repeats: int) -> float:
    """Seconds per call of the transformer alone at ``batch`` rows (the microbenchmark
    the engine's steps/s is held against)."""
    from bench.diffusion_models import transformer_inputs

    inputs = transformer_inputs(family, pipe, height, width, batch, device)

    def call() -> None:
        pipe.transformer(**inputs)
    call()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    _sync(device)
    return (time.perf_counter() - start) / repeats
