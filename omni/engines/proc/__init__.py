"""The engine process: any Engine behind one ZeroMQ DEALER (main.py, loop.py, channel.py)."""

from omni.engines.proc.loop import EngineLoop
from omni.engines.proc.main import run_engine_process
from omni.engines.proc.spec import EngineSpec, stage_spec

__all__ = ["EngineLoop", "EngineSpec", "run_engine_process", "stage_spec"]
