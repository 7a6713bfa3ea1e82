"""Shared by the core benchmark's modules: settings, summaries, progress, the machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import Any

TARGET_US = 150.0
PROMPT = "The quick brown fox jumps over the lazy dog. "  # 45 characters
CONCURRENCY = 8
CONCURRENCY_STAGES = 4
QUANTILES = ("p50", "p90", "p99", "mean")


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ns: list[int]) -> dict[str, Any]:
    """Percentiles in us, plus the p50 of each half of the run (a drift/noise check)."""
    us = sorted(s / 1000.0 for s in samples_ns)
    half = len(samples_ns) // 2
    halves = [sorted(s / 1000.0 for s in part) for part in (samples_ns[:half], samples_ns[half:])]
    return {
        "count": len(us),
        "p50_us": round(percentile(us, 0.50), 2),
        "p90_us": round(percentile(us, 0.90), 2),
        "p99_us": round(percentile(us, 0.99), 2),
        "mean_us": round(sum(us) / len(us), 2) if us else float("nan"),
        "min_us": round(us[0], 2) if us else float("nan"),
        "max_us": round(us[-1], 2) if us else float("nan"),
        "halves_p50_us": [round(percentile(h, 0.50), 2) for h in halves],
        "samples_us": [round(s / 1000.0, 1) for s in samples_ns],  # in arrival order
    }


def progress(label: str, done: int, total: int, every: int, samples: list[int]) -> None:
    if done % every == 0 or done == total:
        recent = sorted(samples[-every:])
        median = f"recent p50 {recent[len(recent) // 2] / 1000:.0f} us" if recent else "warmup"
        say(f"  [{label}] {done}/{total} ({median})")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def _version(module: str, attribute: str = "__version__") -> str | None:
    """A package's version, or None where it is not installed: a measurement is never lost
    at its end for want of a module that only describes the machine (pyzmq is carried to
    the GPU box as a wheel, and a run without it lost its report)."""
    try:
        value = getattr(__import__(module), attribute)
    except ImportError:
        return None
    value = value() if callable(value) else value
    return ".".join(map(str, value)) if isinstance(value, tuple) else str(value)


def hardware() -> dict[str, Any]:
    cpu = _lscpu()
    ram_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu_model": cpu.get("Model name") or platform.processor() or "unknown",
        "hypervisor": cpu.get("Hypervisor vendor")
        or ("unknown" if "hypervisor" in cpu.get("Flags", "").split() else None),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "ram_gib": ram_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "pyzmq": _version("zmq"),
        "libzmq": _version("zmq", "zmq_version"),
        "uvloop": _version("uvloop"),
        "msgpack": _version("msgpack", "version"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def cpu_times() -> list[int]:
    """The host's `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal
    ...), in clock ticks; [] where there is none."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return []


def steal_share(start: list[int], end: list[int]) -> float | None:
    """Of the vCPU time between two cpu_times(), the share the hypervisor gave to others
    (steal): on a shared VM, where wake-up latencies stop meaning much."""
    if len(start) < 8 or len(end) < 8:
        return None
    total = sum(end[:8]) - sum(start[:8])
    return round((end[7] - start[7]) / total, 3) if total > 0 else None


def free_device_memory() -> float:
    """What dropped objects held on the GPU goes back to it (the caller dropped its last
    references first), before the next side or server loads its own copy; returns the
    GiB still allocated by this process (0 without CUDA)."""
    import gc

    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return 0.0
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() / 2**30


class TokenTimes:
    """One request's token arrivals in-process (outputs of n tokens at time `now`): TTFT,
    ITL and per-token gaps, timed from a burst's start."""

    def __init__(self) -> None:
        self.first = self.last = self.done = None
        self.tokens, self.gaps = 0, []

    def add(self, n: int, now: float) -> None:
        if n:
            self.gaps += [(now - self.last) / n] * n if self.last else []
            self.first, self.last, self.tokens = self.first or now, now, self.tokens + n

    def result(self, start: float) -> dict[str, Any]:
        if self.first is None:
            raise RuntimeError("the request produced no tokens")
        itl = (self.last - self.first) / (self.tokens - 1) if self.tokens > 1 else None
        done = self.done if self.done is not None else time.perf_counter()
        return {"ttft": self.first - start, "itl": itl, "done": done - start,
                "tokens": self.tokens, "gaps": self.gaps}


async def text_stream_times(session: Any, url: str, body: dict[str, Any] | bytes, start: float,
                            text_of: Any) -> dict[str, Any]:
    """POST a streamed completion (`body` asks for usage; its JSON text as bytes when
    the caller made it before the clock started) and time it from `start`: first
    chunk (ttft), first chunk with text (ttft_text), inter-token latency, gaps between
    text chunks, completion tokens. `text_of(choice)`: a choice's text (completions:
    choice["text"], chat: its delta's content)."""
    first = last = tokens = None
    text_times: list[float] = []  # arrivals of chunks that carry text
    async for now, event in sse_events(session, url, body):
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices") or ():
            first = first or now
            if text_of(choice):
                text_times.append(now)
                last = now
            if choice.get("finish_reason"):
                last = now  # the final chunk follows the last token at once
    if first is None or tokens is None:
        raise RuntimeError("the stream had no choices or no usage")
    gaps = [b - a for a, b in zip(text_times, text_times[1:], strict=False)]
    return {"ttft": first - start, "ttft_text": (text_times or [last])[0] - start,
            "itl": (last - first) / (tokens - 1) if tokens > 1 and last else None,
            "done": time.perf_counter() - start, "tokens": tokens, "gaps": gaps,
            "text_chunks": len(text_times)}


async def sse_events(session: Any, url: str, body: dict[str, Any] | bytes,
                     clock: Any = time.perf_counter) -> Any:
    """POST `body` (a dict, or its JSON text as bytes) and yield (arrival time by `clock`,
    event) for each SSE data event up to [DONE]; an HTTP error or an error event raises
    RuntimeError."""
    import json

    sent = {"data": body, "headers": {"Content-Type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}
    async with session.post(url, **sent) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            now, event = clock(), json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            yield now, event


def code_commit(tree: str | os.PathLike[str] | None = None,
                paths: tuple[str, ...] = ()) -> str | None:
    """The commit the measured code is: $OMNI_COMMIT where the caller says (a GPU box's
    copy of the tree has no history of its own: give it `OMNI_COMMIT=$(git rev-parse
    --short HEAD)` from the checkout that sent it), else HEAD's short hash, marked where
    tracked files differ (only ``paths``, where given); None without either. ``tree``: a
    checkout other than this one (a "before" side), whose HEAD is read whatever
    $OMNI_COMMIT says."""
    given = os.environ.get("OMNI_COMMIT", "").strip()
    if given and tree is None:
        return given
    repo = tree or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    except (OSError, subprocess.SubprocessError):
        return None
    return (f"{head} + uncommitted changes" if dirty else head) or None


async def metric_sums(session: Any, url: str, names: dict[str, str]) -> dict[str, float]:
    """The server's /metrics families named in ``names`` (metric -> key), each summed over
    its samples (its replicas), as of each replica's last output: a burst's count is
    after - before. A family the server does not report is left out."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = names.get(family.name)
        if key is not None:
            sums[key] = sum(sample.value for sample in family.samples)
    return sums


async def stage_step_totals(url: str) -> dict[str, tuple[float, float]]:
    """Per stage, the server's engine steps so far as (count, seconds), from /metrics'
    omni_engine_step_seconds: a level's mean step is the difference of two readings."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "omni_engine_step_seconds":
            continue
        for sample in family.samples:
            slot = {"omni_engine_step_seconds_count": 0,
                    "omni_engine_step_seconds_sum": 1}.get(sample.name)
            if slot is not None:
                totals.setdefault(sample.labels["stage"], [0.0, 0.0])[slot] += sample.value
    return {stage: (count, seconds) for stage, (count, seconds) in totals.items()}


def step_means(before: dict[str, tuple[float, float]],
               after: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Per stage, the steps between two stage_step_totals readings and their mean in ms."""
    means = {}
    for stage, (count, seconds) in after.items():
        count0, seconds0 = before.get(stage, (0.0, 0.0))
        if count > count0:
            means[stage] = {"steps": count - count0,
                            "mean_ms": 1000 * (seconds - seconds0) / (count - count0)}
    return means
