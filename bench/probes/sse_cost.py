"""What one streamed SSE event costs the server's main process (the API's event loop).

Starts `python -m omni.server --pipeline <echo pipeline>` whose echo stage splits each
prompt into --chunks pieces (one engine step each, no model cost), then c concurrent
clients stream chat completions (aiohttp, stream=true). Reads the server's main process
CPU time (user + system, /proc/PID/stat) before and after the burst: CPU microseconds per
streamed event is the cost the API layer adds per token, which bounds how many tokens a
second one server process can stream (on a GPU box at c=32 and ~6 ms steps: ~5,000 a
second). The clients share the machine, so events/s is printed but is not the figure;
the per-event CPU time is.

    python bench/probes/sse_cost.py [--concurrency 32] [--chunks 200] [--bursts 3]
        [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PIPELINE = """name: echo
max_inflight: 1024
stages:
  - name: echo
    engine: echo
    devices: [cpu]
    options: {{chunks: {chunks}, delay_ms: {delay_ms}}}
    final_output: text
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(url: str, c: int, chunks: int) -> int:
    import aiohttp

    prompt = " ".join(f"w{i}" for i in range(chunks * 2))
    body = {"model": "echo", "stream": True,
            "messages": [{"role": "user", "content": prompt}]}

    async def one(session: aiohttp.ClientSession) -> int:
        events = 0
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                events += line.startswith(b"data: ")
        return events

    async with aiohttp.ClientSession() as session:
        return sum(await asyncio.gather(*(one(session) for _ in range(c))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="the echo engine's time a step (e.g. 6: a GPU's decode step)")
    args = parser.parse_args()
    from bench.ar_ours import start_server, stop_server

    with tempfile.TemporaryDirectory() as tmp:
        pipeline = Path(tmp) / "echo.yaml"
        pipeline.write_text(PIPELINE.format(chunks=args.chunks, delay_ms=args.delay_ms))
        proc, url = start_server(("--pipeline", str(pipeline)), "float32", 60)
        try:
            asyncio.run(burst(url, args.concurrency, args.chunks))  # warm
            per_event, rates = [], []
            for _ in range(args.bursts):
                cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                events = asyncio.run(burst(url, args.concurrency, args.chunks))
                wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
                per_event.append(cpu / events * 1e6)
                rates.append(events / wall)
                print(f"[sse_cost] c={args.concurrency}: {events} events in {wall:.2f} s "
                      f"({events / wall:.0f}/s), server main process {cpu:.2f} CPU s: "
                      f"{cpu / events * 1e6:.1f} us an event", flush=True)
            print(f"[sse_cost] median {statistics.median(per_event):.1f} us an event, "
                  f"{statistics.median(rates):.0f} events/s", flush=True)
        finally:
            stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
