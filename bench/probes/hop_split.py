"""One-way hops each way in AsyncOmni over echo pipelines (bench/probes/README.md)."""

from __future__ import annotations

import logging
import statistics

import uvloop

from bench.ours import pipeline_dict
from omni import AsyncOmni
from omni.config.pipeline import parse_pipeline
from omni.runtime import request_transit as transit

REQUESTS, WARMUP = 600, 100
inbound: list[float] = []  # orchestrator -> engine: sent to handled in the engine, us
outbound: list[float] = []  # engine -> orchestrator: published to handled, us


_add_output, _add_inbound = transit.RequestTransit.add_output, transit.RequestTransit.add_inbound


def _record_output(self, stage, sent_at, now):  # noqa: ANN001, ANN202 - as add_output
    if transit.is_time(sent_at):
        outbound.append((now - sent_at) * 1e6)
    _add_output(self, stage, sent_at, now)


def _record_inbound(self, stage, times):  # noqa: ANN001, ANN202 - as add_inbound
    if isinstance(times, (tuple, list)) and times:
        inbound.append(times[0] * 1e6)
    _add_inbound(self, stage, times)


async def run(n: int) -> str:
    transit.RequestTransit.add_output = _record_output  # this process only: a probe
    transit.RequestTransit.add_inbound = _record_inbound
    cfg = parse_pipeline(pipeline_dict(n))
    async with AsyncOmni(cfg, log_level=logging.WARNING) as omni:
        for i in range(REQUESTS):
            if i == WARMUP:
                inbound.clear()
                outbound.clear()
            async for _ in omni.generate({"prompt": "hello there"}):
                pass
    return (f"N={n}: orchestrator -> engine hop p50 {statistics.median(inbound):.0f} us, "
            f"engine -> orchestrator hop p50 {statistics.median(outbound):.0f} us")


if __name__ == "__main__":
    for n in (1, 8, 1, 8):
        print(uvloop.run(run(n)), flush=True)
