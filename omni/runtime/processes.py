"""How engine processes start on this host: forked from a fork server, or, for a stage in
its own Python environment, started with that environment's interpreter."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

from omni.config.pipeline import PipelineConfig
from omni.config.stages import StageConfig
from omni.engines.kinds import preloads
from omni.engines.proc import EngineSpec, run_engine_process
from omni.runtime.env_process import EnvProcess, omni_path

# What a model engine imports anyway; the fork server imports it once, before any fork.
HEAVY_MODULES = ["torch", "transformers", "omni.engines.proc"]


def process_context(pipeline: PipelineConfig) -> Any:
    """How engine processes start: forked from a fork server, not spawned from scratch.

    A spawned engine re-imports torch and transformers (~4 s of CPU each); with several
    stages on 2 cores that made READY take 13 s for 3 tiny stages. The fork server (one
    per server process, started with the first engine) imports them once and forks every
    engine from there, so imports happen once and their pages are shared copy-on-write.
    It never touches CUDA, so children initialise CUDA themselves, safely. The preload is
    decided by the first pipeline that starts an engine.
    """
    context = multiprocessing.get_context("forkserver")
    if preloads(stage.engine for stage in pipeline.stages):
        context.set_forkserver_preload(HEAVY_MODULES + _model_modules(pipeline))
    return context


def start_local(spawn: Any, stage: StageConfig, spec: EngineSpec, name: str,
                launch_dir: str) -> Any:
    """A replica's process on this host: forked from the fork server (``spawn``,
    process_context's), or, for a stage with its own environment (`python:`), a subprocess
    of that interpreter (env_process.py; OSError when it cannot start at all). The launch's
    private directory ``launch_dir`` holds the link to the server's omni such an
    environment may need."""
    if stage.python:
        return EnvProcess(stage.python, spec, name, omni_path(launch_dir))
    process = spawn.Process(target=run_engine_process, args=(spec,), name=name)
    process.start()
    return process


def _model_modules(pipeline: PipelineConfig) -> list[str]:
    """transformers' modeling module of each stage's model directory, by its model_type
    (a missing one is skipped by the fork server: preloading is only an optimisation)."""
    modules = []
    for stage in pipeline.stages:
        config = os.path.join(stage.model_dir or "", "config.json")
        try:
            with open(config) as f:
                model_type = json.load(f).get("model_type")
        except (OSError, ValueError):
            continue
        if isinstance(model_type, str) and model_type.isidentifier():
            modules.append(f"transformers.models.{model_type}.modeling_{model_type}")
    return sorted(set(modules))


def stop_helper_processes() -> None:
    """Stop multiprocessing's fork server and resource tracker and wait for them, so a
    server exits only after every process it started (both would otherwise end a moment
    after it, reparented to init). Private multiprocessing API, hence each guarded: a
    Python without it leaves them to end on their own, as before."""
    from multiprocessing import forkserver, resource_tracker

    for helper in (getattr(forkserver, "_forkserver", None),
                   getattr(resource_tracker, "_resource_tracker", None)):
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            try:
                stop()
            except (OSError, ChildProcessError, RuntimeError):
                pass  # already gone


def describe_exit(replica: Any) -> str:
    """How a replica's process ended, for logs and errors."""
    # a Ray-placed one, or one in its own environment, says itself
    describe = getattr(replica.process, "describe", None)
    if describe is not None:
        return describe(replica.connected)
    code = replica.process.exitcode
    if code is None:
        return "process still running but unreachable"
    if code < 0:
        return f"process {replica.process.pid} killed by {signal.Signals(-code).name}"
    reason = f"process {replica.process.pid} exited with code {code}"
    return reason + _main_guard_hint() if code == 1 and not replica.connected else reason


def _main_guard_hint() -> str:
    """Why a child may die before saying anything: it re-imports the user's main script
    (the fork server starts children that way), and a script that starts AsyncOmni at
    import time fails there with multiprocessing's bootstrapping error on the child's
    stderr, which the user would otherwise have to find."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file or Path(main_file).resolve().is_relative_to(Path(__file__).parents[1]):
        return ""  # omni's own entry points are guarded
    return (f"; it exited before connecting, as a child does when the script it re-imports "
            f"({main_file}) starts AsyncOmni at import: put that code under "
            "`if __name__ == \"__main__\":` (the child's traceback is on stderr)")
