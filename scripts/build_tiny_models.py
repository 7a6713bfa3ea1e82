#!/usr/bin/env python
"""Build the tiny random-weight model directories used by tests and the default server.

Each model lands in OUT/<name>, in the exact layout of a Hugging Face release (config,
generation config, safetensors weights, tokenizer files, chat template) plus the marker
file omni_fixture.json saying the weights are random. Everything is built offline.

    python scripts/build_tiny_models.py --out ~/.cache/omni/models
    python scripts/build_tiny_models.py --out /tmp/models --only qwen3_moe --force
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

try:
    from omni.fixtures.tiny_models import TINY_MODELS, default_cache_dir, ensure_tiny_model
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni.fixtures.tiny_models import TINY_MODELS, default_cache_dir, ensure_tiny_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build tiny random-weight model directories (offline).")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="directory to build into; each model goes to OUT/<name> "
             f"(default: $OMNI_CACHE_DIR or {default_cache_dir()})")
    parser.add_argument(
        "--only", default=None, metavar="NAMES",
        help="comma-separated subset to build (default: all of "
             f"{','.join(TINY_MODELS)})")
    parser.add_argument(
        "--force", action="store_true",
        help="rebuild even if OUT/<name> already holds a complete build")
    args = parser.parse_args(argv)

    names = list(TINY_MODELS) if not args.only else [
        n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in TINY_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(TINY_MODELS)}")
    out = args.out if args.out is not None else default_cache_dir()
    for name in names:
        if args.force and (out / name).exists():
            shutil.rmtree(out / name)
        t0 = time.perf_counter()
        path = ensure_tiny_model(name, out, progress=lambda msg: print(msg, flush=True))
        print(f"{name}: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
