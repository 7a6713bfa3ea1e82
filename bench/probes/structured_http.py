"""The same comparison as structured_decode.py, through the server as users run it:
`python -m omni.server --model DIR` in its own process, then a burst of B concurrent
/v1/chat/completions with response_format json_schema, then B free ones (ignore_eos),
then B with a required tool call (tool_choice: "required", one function whose arguments
have the same schema), alternating ROUNDS times; completion tokens / wall seconds of
each burst (prefill included: a client's view). The client is plain aiohttp (no SDK),
so it runs on a box with only the server's own dependencies.

    OMP_NUM_THREADS=1 python bench/probes/structured_http.py [--model DIR] [--batch 8] \
        [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path[:0] = [str(Path(__file__).parent)]
from structured_decode import PROMPT, SCHEMA, default_model  # noqa: E402

KINDS = ("free", "json_schema", "tool_call")


def body(kind: str, i: int, tokens: int) -> dict:
    request = {"model": "m", "messages": [{"role": "user", "content": f"{PROMPT} ({i})"}],
               "max_tokens": tokens, "temperature": 0.8, "seed": i}
    if kind == "free":
        request["ignore_eos"] = True
    elif kind == "json_schema":
        request["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "review", "schema": SCHEMA}}
    else:
        request["tools"] = [{"type": "function", "function": {
            "name": "review", "parameters": SCHEMA}}]
        request["tool_choice"] = "required"
    return request


async def burst(url: str, kind: str, batch: int, tokens: int) -> float:
    async with aiohttp.ClientSession() as http:
        async def one(i: int) -> int:
            async with http.post(f"{url}/v1/chat/completions",
                                 json=body(kind, i, tokens)) as r:
                answer = await r.json()
                if r.status != 200:
                    raise RuntimeError(answer)
                return answer["usage"]["completion_tokens"]
        started = time.perf_counter()
        made = await asyncio.gather(*(one(i) for i in range(batch)))
        return sum(made) / (time.perf_counter() - started)


def start_server(model: str, flag: str = "--model") -> tuple[subprocess.Popen, str, Path]:
    """`python -m omni.server FLAG MODEL` (--model DIR, or --pipeline FILE) served as "m" on
    a free port: (process, base URL, its log file)."""
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "omni.server", flag, model,
                             "--served-model-name", "m", "--port", "0"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://[0-9.]+:[0-9]+)", log.read_text())
        if found:
            return proc, found.group(1), log
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start in 600 s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    proc, url, log = start_server(default_model(args.model))
    try:
        for kind in KINDS:  # warm: compile, the grammar tokenizer table, kernels
            asyncio.run(burst(url, kind, args.batch, 8))
        rates: dict[str, list[float]] = {k: [] for k in KINDS}
        for r in range(args.rounds):
            for kind in KINDS:
                rate = asyncio.run(burst(url, kind, args.batch, args.tokens))
                rates[kind].append(rate)
                print(json.dumps({"round": r, "kind": kind, "tok_s": round(rate, 1)}))
        print(json.dumps({"batch": args.batch, "tokens": args.tokens, **{
            f"{k}_pair_ratio_median": round(statistics.median(
                c / f for f, c in zip(rates["free"], rates[k], strict=True)), 3)
            for k in KINDS[1:]}}))
    finally:
        proc.terminate()
        proc.wait(60)
        print(f"server log: {log}")


if __name__ == "__main__":
    main()
