"""Start the built-in default in-process, run one request, print what ran where.

    python scripts/smoke_default.py [--cache-dir DIR] [--max-tokens N]

Useful on a new machine (e.g. a GPU box): shows each replica's device and dtype as the
engine reports them, and the request's per-stage timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from omni import AsyncOmni, load_pipeline
from omni.fixtures.tiny_models import ensure_tiny_model


async def main(args: argparse.Namespace) -> None:
    model_dir = ensure_tiny_model("qwen3", Path(args.cache_dir) if args.cache_dir else None,
                                  progress=print)
    async with AsyncOmni(load_pipeline(model_dir)) as omni:
        for replica in omni.orchestrator.engines.replicas.values():
            print("replica", replica.replica_id, json.dumps(replica.info))
        inputs = {"messages": [{"role": "user", "content": "hello"}]}
        params = {"*": {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}}
        text, last = "", None
        async for out in omni.generate(inputs, params=params):
            text += (out.data or {}).get("text", "")
            last = out
        print("text", repr(text))
        print("metrics", json.dumps(last.metrics))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="where the tiny model is built (default: "
                        "$OMNI_CACHE_DIR or ~/.cache/omni/models)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate")
    asyncio.run(main(parser.parse_args()))
