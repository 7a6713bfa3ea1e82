"""Start one replica by hand (or from another supervisor) and connect it to a server.

    python -m omni.engines.proc --connect tcp://127.0.0.1:5555 --pipeline my.yaml --stage talker

The pipeline's stage must say `launch: external`: the server then waits for replicas to
connect instead of starting them. A replica that is started again after a death takes
the next --incarnation (its predecessor's identity is retired by the server).

`--spec-stdin` is how the server starts a replica of a stage in its own Python environment
(`python:` / `env:`, omni/runtime/env_process.py): the spec comes on stdin (stdin.py).
"""

from __future__ import annotations

import argparse
import logging
import os

from omni.config.presets import load_pipeline
from omni.engines.proc.main import run_engine_process
from omni.engines.proc.spec import stage_spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m omni.engines.proc",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", metavar="ADDRESS",
                        help="the pipeline's control address: ipc://PATH or tcp://HOST:PORT "
                             "(loopback only until the control plane is authenticated)")
    parser.add_argument("--pipeline", metavar="FILE_OR_PRESET",
                        help="the same pipeline file (or built-in preset) the server serves")
    parser.add_argument("--stage", help="the stage this replica serves")
    parser.add_argument("--index", type=int, default=0,
                        help="which replica of the stage (0-based; default 0)")
    parser.add_argument("--incarnation", type=int, default=0,
                        help="0 for the first start, +1 for each restart (default 0)")
    parser.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="default info")
    parser.add_argument("--spec-stdin", action="store_true",
                        help="read the whole spec from stdin, as the server writes it for a "
                             "stage in its own environment (the other options are unused); "
                             "the engine exits when stdin closes")
    args = parser.parse_args(argv)
    missing = [f"--{name}" for name in ("connect", "pipeline", "stage")
               if getattr(args, name) is None]
    if missing and not args.spec_stdin:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.spec_stdin:
        from omni.engines.proc.stdin import spec_from_parent

        return run_engine_process(spec_from_parent())  # never returns: it exits the process
    pipeline = load_pipeline(args.pipeline)
    stage = pipeline.stage(args.stage)  # KeyError names the stage
    if not 0 <= args.index < stage.replicas or args.incarnation < 0:
        raise SystemExit(f"--index must be 0..{stage.replicas - 1} and --incarnation >= 0")
    arena = f"omni-{os.getpid()}-ext-{stage.name}-{args.index}"  # swept once this pid dies
    run_engine_process(stage_spec(
        pipeline, stage.name, args.index, control_address=args.connect, arena_name=arena,
        incarnation=args.incarnation, dtype=args.dtype,
        log_level=getattr(logging, args.log_level.upper())))


if __name__ == "__main__":
    main()
