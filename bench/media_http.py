"""bench videos' and bench diffusion's ours-http side: `python -m omni.server --model DIR`
as users run it (the preset picked from the directory's model_index.json, its own
options), and closed-loop HTTP clients on POST /v1/videos/sync (answered with the MP4) or
POST /v1/images/generations (answered with the PNG, base64 in JSON).

A request's latency is its POST to its last byte: the denoising, the VAE decode and the
MP4 / PNG encode, as a user waits for them (the in-process sides stop at the decoded
pixels).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import diffusion_sides as sides
from bench.ar_ours import start_server, stop_server
from bench.common import free_device_memory, metric_sums, percentile, say

START_TIMEOUT_S = 1200.0  # a real-size release loads from disk in a minute or more


class MediaServer:
    """The server on a model directory; ``saved``: a temp directory of save_pipeline's,
    removed with the server. A failed start leaves neither behind."""

    def __init__(self, model_dir: str, log_path: Path, saved: bool = False,
                 load_format: str = "auto") -> None:
        self.saved = model_dir if saved else None
        try:
            self.proc, self.url = start_server(("--model", model_dir), "auto",
                                               START_TIMEOUT_S, log_path,
                                               ("--load-format", load_format))
        except BaseException:
            self._remove_saved()
            raise
        try:
            self.model = asyncio.run(_served_id(self.url))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        stop_server(self.proc)
        self._remove_saved()

    def _remove_saved(self) -> None:
        if self.saved:
            shutil.rmtree(self.saved, ignore_errors=True)


def save_pipeline(pipe: Any, weights: bool = True) -> str:
    """An in-memory pipeline (--shape real, random weights) in a temp directory, for the
    server to load; MediaServer(..., saved=True) removes it. ``weights`` False saves only
    what a server started with --load-format dummy reads (save_configs)."""
    saved = tempfile.mkdtemp(prefix="bench-media-")
    started = time.perf_counter()
    try:
        if weights:
            pipe.save_pretrained(saved)
        else:
            save_configs(pipe, saved)
    except BaseException:
        shutil.rmtree(saved, ignore_errors=True)
        raise
    say(f"  saved the pipeline{'' if weights else ' (configs only)'} to {saved} in "
        f"{time.perf_counter() - started:.0f} s")
    return saved


def save_configs(pipe: Any, saved: str) -> None:
    """The pipeline's directory without its weights: model_index.json, each model's
    config.json, and the other components (tokenizers, schedulers) as save_pretrained
    writes them. A 32 B release saved with its (random) weights would not fit a GPU box's
    disk; the server draws its own with --load-format dummy (omni/models/dummy_weights.py)."""
    import torch

    pipe.save_config(saved)  # model_index.json
    for name, component in pipe.components.items():
        folder = Path(saved) / name
        if component is None:
            continue
        if not isinstance(component, torch.nn.Module):
            component.save_pretrained(folder)
        elif hasattr(component.config, "save_pretrained"):  # a transformers model
            component.config.save_pretrained(folder)
        else:  # a diffusers model
            component.save_config(folder)


@contextmanager
def pipeline_parked(pipe: Any, device: str) -> Iterator[None]:
    """The bench's own copy of the pipeline in host memory while the server runs, and back
    on the device after: the server finds the GPU as a user's server does (its budgets are
    sized from the memory it finds free), and a release too large for two copies on one
    GPU still gets its ours-http rows beside the in-process sides of the same run."""
    if pipe is None or not device.startswith("cuda"):
        yield
        return
    started = time.perf_counter()
    pipe.to("cpu")
    left = free_device_memory()
    say(f"  parked the in-process pipeline on the CPU in {time.perf_counter() - started:.0f} s"
        f" ({left:.1f} GiB still allocated here)")
    try:
        yield
    finally:
        started = time.perf_counter()
        pipe.to(device)
        say(f"  the pipeline is back on {device} in {time.perf_counter() - started:.0f} s")


def http_side(server: MediaServer, c: int, per_client: int,
              params: dict[str, Any]) -> dict[str, Any]:
    """c clients, per_client requests each, one at a time each; latencies and wall time.
    params: size, steps, and for a video frames and guidance_scale."""
    return asyncio.run(_clients(server, c, per_client, params))


def said(row: dict[str, Any]) -> dict[str, Any]:
    """A side's row, printed as it comes (bench diffusion and bench videos)."""
    say(f"    {row['steps_per_s']:.2f} steps/s, p50 {row['p50_s']:.2f} s, "
        f"p99 {row['p99_s']:.2f} s")
    return row


def http_rows(pipe: Any, model_dir: str | None, device: str, run: dict[str, Any],
              summary: Callable[[str, int, dict[str, Any]], dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """ours-http at every concurrency, before the in-process sides, with their copy of the
    pipeline parked in host memory (pipeline_parked); the server is stopped after. run:
    concurrency (a comma list), per_client, params, warm_steps (the other sides' warm-up
    length), log (the server's log path) and optionally load_format (dummy: the server
    draws random weights, an in-memory pipeline saved without its own); summary(side, c, record) -> the report's row."""
    load_format = run.get("load_format", "auto")
    directory = model_dir or save_pipeline(pipe, weights=load_format != "dummy")
    rows = []
    try:
        with pipeline_parked(pipe, device):
            server = MediaServer(directory, run["log"], saved=model_dir is None,
                                 load_format=load_format)
            try:
                for c in (int(v) for v in run["concurrency"].split(",")):
                    say(f"  ours-http c={c} ...")
                    http_side(server, c, 1, {**run["params"], "steps": run["warm_steps"]})
                    logged = _log_size(run["log"])
                    record = http_side(server, c, run["per_client"], run["params"])
                    record["encode_s"] = encode_times(run["log"], logged)
                    rows.append(said(summary("ours-http", c, record)))
            finally:
                server.close()  # removes a saved directory
    finally:  # and where no server came to own it (parking failed): here
        if model_dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return rows


# the server's log line for each MP4 / image file it encodes (omni/api/videos.py _mp4,
# omni/api/images.py ImageCall.encode)
ENCODED = re.compile(r" encoded in ([0-9.]+) s \(")


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def encode_times(log_path: Path, offset: int) -> list[float]:
    """The server's MP4 / image encode times (s) logged after byte ``offset`` of its log:
    the part of an ours-http latency that the in-process sides never pay (noise from
    random weights takes an encoder ~10x a real picture's time)."""
    if not log_path.exists():
        return []
    with open(log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode("utf-8", "replace")
    return [float(m) for m in ENCODED.findall(text)]


def encode_p50(record: dict[str, Any]) -> float | None:
    """An ours-http record's median server-side encode time (s), None where none was
    logged (the in-process sides)."""
    times = record.get("encode_s")
    return round(percentile(sorted(times), 0.5), 3) if times else None


async def _clients(server: MediaServer, c: int, per_client: int,
                   params: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    texts = iter(sides.prompts(c * per_client))
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def client() -> None:
            for _ in range(per_client):
                sent = time.perf_counter()
                await _one(session, server, next(texts), params, len(latencies))
                latencies.append(time.perf_counter() - sent)
        before = await metric_sums(session, server.url, ENGINE_COUNTERS)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(c)))
        wall = time.perf_counter() - start
        after = await metric_sums(session, server.url, ENGINE_COUNTERS)
        # the burst's transformer calls and rows, as ours-engine's rows count them
        counts = {k: round(v - before.get(k, 0.0)) for k, v in after.items()}
        return {"wall_s": wall, "latencies_s": latencies, **counts}


# the diffusion engine's counters in /metrics (omni/runtime/metrics.py ENGINE_GAUGES)
ENGINE_COUNTERS = {"omni_replica_transformer_calls": "transformer_calls",
                   "omni_replica_denoise_rows": "rows_run"}


async def _one(session: Any, server: MediaServer, prompt: str, params: dict[str, Any],
               seed: int) -> None:
    body = {"model": server.model, "prompt": prompt, "size": params["size"],
            "num_inference_steps": params["steps"], "seed": seed}
    if "frames" in params:
        body.update(num_frames=params["frames"], guidance_scale=params["guidance_scale"])
        route, magic = "/v1/videos/sync", lambda data: data[4:8] == b"ftyp"  # MP4's box
    else:
        route, magic = "/v1/images/generations", _png
    async with session.post(f"{server.url}{route}", json=body) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {route}: {resp.status} {data[:300]!r}")
    if not magic(data):
        raise RuntimeError(f"POST {route} answered {len(data)} bytes, not its media")


def _png(data: bytes) -> bool:
    return base64.b64decode(json.loads(data)["data"][0]["b64_json"])[:8] == b"\x89PNG\r\n\x1a\n"


async def _served_id(url: str) -> str:
    import aiohttp

    from bench.ar_ours import served_id

    async with aiohttp.ClientSession() as session:
        return await served_id(session, url)
