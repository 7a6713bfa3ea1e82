"""Decode under mixed load, through the server as users run it (issue #44 item 2).

`python bench/probes/mixed_load.py --model DIR [--engine-option K=V ...] [--label L]`:
starts `python -m omni.server` on DIR (its preset, plus the engine options), then
1. steady: D streams decode alone (short prompts, ignore_eos) for S seconds; their
   inter-token gaps give the steady ITL;
2. mixed: the same D streams decode while P clients keep sending fresh LEN-token prompts
   (8 new tokens each, one after another per client) for S seconds; the decoding streams'
   gaps (p50 / p99 / max) against the steady ITL, and the prompt tokens the server took in
   per second (completed requests' prompt tokens / seconds).
Gaps are between consecutive SSE chunks that carry text (one token each, as the server
streams). The client is plain aiohttp. Prints one JSON line per phase and writes them to
--out if given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)]
from structured_http import start_server  # noqa: E402 - the other probes' server start

from bench.ar_ours import cuda_available, target_for  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _decoder(http, url: str, i: int, stop: float, gaps: list[float]) -> None:
    """One stream that restarts until `stop`, recording gaps between its tokens."""
    while time.monotonic() < stop:
        body = {"model": "m", "prompt": f"Stream {i}: tell a long story.", "max_tokens": 256,
                "ignore_eos": True, "temperature": 0, "stream": True}
        last = None
        async with http.post(f"{url}/v1/completions", json=body) as r:
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                now = time.monotonic()
                if last is not None and now < stop:
                    gaps.append((now - last) * 1e3)
                last = now


async def _prefiller(http, url: str, rng: random.Random, length: int, vocab: int,
                     stop: float, done: list[int]) -> None:
    while time.monotonic() < stop:
        ids = [rng.randrange(100, vocab) for _ in range(length)]
        body = {"model": "m", "prompt": ids, "max_tokens": 8, "ignore_eos": True}
        async with http.post(f"{url}/v1/completions", json=body) as r:
            answer = await r.json()
            if r.status != 200:
                raise RuntimeError(answer)
            if time.monotonic() < stop:
                done.append(answer["usage"]["prompt_tokens"])


async def phase(url: str, args: argparse.Namespace, prefill: bool) -> dict:
    gaps: list[float] = []
    done: list[int] = []
    rng = random.Random(args.seed + prefill)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        started = time.monotonic()
        stop = started + args.seconds
        tasks = [_decoder(http, url, i, stop, gaps) for i in range(args.decoders)]
        if prefill:
            tasks += [_prefiller(http, url, rng, args.prompt_len, args.vocab, stop, done)
                      for _ in range(args.prefill_clients)]
        await asyncio.gather(*tasks)
        took = time.monotonic() - started
    return {"phase": "mixed" if prefill else "steady", "gaps": len(gaps),
            "itl_p50_ms": round(_percentile(gaps, 0.5), 2),
            "itl_p99_ms": round(_percentile(gaps, 0.99), 2),
            "itl_max_ms": round(max(gaps, default=0.0), 2),
            "prompts": len(done), "prompt_tok_s": round(sum(done) / took)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine-option", action="append", default=[], metavar="K=V")
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--prefill-clients", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=8000)
    parser.add_argument("--vocab", type=int, default=30000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import yaml

    options = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.engine_option)}
    with tempfile.TemporaryDirectory() as tmp:
        device = "cuda" if cuda_available() else "cpu"
        flag, target = target_for(args.model, device, Path(tmp), options or None)
        proc, url, log = start_server(target, flag)
        try:
            rows = [asyncio.run(phase(url, args, prefill)) for prefill in (False, True)]
        finally:
            proc.terminate()
            proc.wait(60)
    for row in rows:
        row.update(label=args.label, engine_options=options)
        print(f"[mixed] {json.dumps(row)}", flush=True)
    lines = [line for line in log.read_text().splitlines() if "step model" in line]
    print("\n".join(lines[-1:]))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
