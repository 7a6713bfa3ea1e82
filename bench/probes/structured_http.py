"""The same comparison as structured_decode.py, through the HTTP server: a burst of B
concurrent /v1/chat/completions (the openai SDK) with response_format json_schema, then
B free ones, alternating ROUNDS times; completion tokens / wall seconds of each burst
(prefill included: a client's view). The server runs in this process on a background
loop, the engine in its own process, as `python -m omni.server` serves a model directory.

    OMP_NUM_THREADS=1 python bench/probes/structured_http.py [--model DIR] [--batch 8] \
        [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[2] / "tests/http")]
from httputil import Server  # noqa: E402  (the test suite's in-process server)
from structured_decode import PROMPT, SCHEMA, default_model  # noqa: E402


async def burst(server: Server, batch: int, tokens: int, constrained: bool) -> float:
    extra = ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "review", "schema": SCHEMA}}} if constrained else {"ignore_eos": True})
    async with server.client() as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"{PROMPT} ({i})"}],
            max_tokens=tokens, temperature=0.8, seed=i, extra_body=extra)
            for i in range(batch)))
        took = time.perf_counter() - started
    return sum(d.usage.completion_tokens for d in done) / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = Server({"m": default_model(args.model)}, start_timeout_s=600).start()
    try:
        server.call(burst(server, args.batch, 8, True), timeout=600)  # warm
        rates: dict[str, list[float]] = {"free": [], "json_schema": []}
        for r in range(args.rounds):
            for kind in ("free", "json_schema"):
                rate = server.call(burst(server, args.batch, args.tokens,
                                         kind == "json_schema"), timeout=600)
                rates[kind].append(rate)
                print(json.dumps({"round": r, "kind": kind, "tok_s": round(rate, 1)}))
        print(json.dumps({"batch": args.batch, "tokens": args.tokens, "pair_ratio_median": round(
            statistics.median(c / f for f, c in zip(rates["free"], rates["json_schema"],
                                                    strict=True)), 3)}))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
