"""run_engine_process(): any Engine behind one control channel, in its own process.

The main thread owns the engine and its DEALER (omni/engines/proc/channel.py) and runs
the loop (loop.py); a heartbeat thread and, for a child of our launcher, a thread that
watches for the parent's death are the only others. The parent owns shutdown: SIGINT is
ignored here (a terminal's Ctrl-C reaches the whole process group), and the process
exits on SHUTDOWN or when its parent dies. A replica started by something else (another
host's launcher) runs `python -m omni.engines.proc` (__main__.py).
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from omni.config.memory import over_budget
from omni.engines.base import EngineLoadError, flag_option
from omni.engines.proc.channel import Channel
from omni.engines.proc.environment import environment_info
from omni.engines.proc.loop import EngineLoop
from omni.engines.proc.spec import EngineSpec
from omni.heap import freeze_loaded_objects
from omni.wire.curve import CurveKeys
from omni.wire.payloads import PayloadPlane
from omni.wire.protocol import WIRE_VERSION, Dead, Ready, encode, identity

log = logging.getLogger("omni.engine")

LOG_TAIL_LINES = 30


class _TailHandler(logging.Handler):
    """Keeps the last log lines, so a death notice can say what happened before it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _exit_with_parent() -> None:
    """Parent gone (even by kill -9) -> exit at once, even in the middle of a long step."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)


def _setup_logging(spec: EngineSpec) -> _TailHandler:
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s [{spec.replica_id}] %(message)s")
    tail = _TailHandler()
    tail.setFormatter(fmt)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [stream, tail]
    root.setLevel(spec.log_level)
    return tail


def _thread_lock_for_tqdm() -> None:
    """tqdm takes a multiprocessing lock for its first bar, even a disabled one
    (a model library may make one per request). In a process forked from the fork server
    that lock is a named semaphore registered with the resource tracker, and an engine ends
    with os._exit, so the tracker reported it as leaked when the server stopped. Bars of
    one engine are written by its own threads only: a thread lock is all they need."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def run_engine_process(spec: EngineSpec) -> None:
    """Process entry: connect, load the engine, say READY, serve until SHUTDOWN."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _thread_lock_for_tqdm()
    tail = _setup_logging(spec)
    if multiprocessing.parent_process() is not None:
        threading.Thread(target=_exit_with_parent, daemon=True, name="parent-watch").start()
    code, channel = 0, None
    try:
        channel = Channel(spec.control_address, identity(spec.replica_id, spec.incarnation),
                          spec.replica_id, spec.heartbeat_s,
                          CurveKeys.from_dict(spec.curve) if spec.curve else None)
        _serve(spec, channel)
    except BaseException as exc:  # noqa: BLE001 - any death must be reported
        code = 1
        reason = _death_reason(spec, exc, tail)
        log.error("%s", reason)
        if channel is not None:
            channel.say_dead(encode(Dead(spec.replica_id, reason)))
    finally:
        if channel is not None:
            channel.close()
    os._exit(code)


def arena_options(spec: EngineSpec, largest: int) -> dict[str, Any]:
    """The payload options with an arena that holds the engine's largest output: a video
    stage at its limits (1280x720, 129 frames: 340 MiB) did not fit the 64 MiB default,
    which refused it outright. A stage that sets payload_arena_mb keeps it (a container's
    /dev/shm may be small), with a warning when one output cannot fit."""
    from omni.connector import DEFAULT_CAPACITY

    options = dict(spec.payload_options)
    if "capacity_bytes" in options:
        if largest > options["capacity_bytes"]:
            log.warning("stage '%s': payload_arena_mb holds %.0f MiB, less than one output "
                        "at its limits (%.0f MiB): larger requests fail", spec.stage,
                        options["capacity_bytes"] / 2**20, largest / 2**20)
    elif largest > DEFAULT_CAPACITY:
        options["capacity_bytes"] = -(-largest // 2**20) * 2**20  # whole MiB
        log.info("stage '%s': payload arena of %d MiB, one output at its limits", spec.stage,
                 options["capacity_bytes"] // 2**20)
    return options


def _lower_priority(nice: Any) -> None:
    """Stage option `nice` (0 to 19): this engine process yields the CPU to the others when
    both could run. On a machine with fewer cores than busy stages, an upstream stage that
    keeps generating (a thinker) otherwise takes the CPU from the stages that make the first
    packet (talker, vocoder): bench/results/archive/omni-cpu-nice*.md. Work-conserving: a stage waiting for
    its input leaves the CPU to the one that feeds it, whatever their priorities."""
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise EngineLoadError(f"option nice must be an integer from 0 to 19, got {nice!r}")
    if nice:
        os.nice(nice)


def _serve(spec: EngineSpec, channel: Channel) -> None:
    from omni.engines import build_engine
    from omni.engines.base import resolve_device

    log.info("loading %s engine for stage '%s'", spec.engine, spec.stage)
    _lower_priority(spec.options.get("nice", 0))
    engine = build_engine(spec)
    payloads = PayloadPlane(spec.arena_name or spec.replica_id.replace("/", "-"),
                            {**arena_options(spec, engine.largest_output_bytes()),
                             "device": resolve_device(spec.device)})
    frozen = freeze_loaded_objects() if flag_option(spec.options, "gc_freeze", True) else 0
    memory = {**_memory(), "gc_frozen": frozen}
    warning = over_budget(spec.stage, memory.get("cuda_bytes"),
                          getattr(engine, "memory_bytes", None),
                          getattr(engine, "memory_advice", None))
    if warning:
        log.warning("%s", warning)
    for note in getattr(engine, "load_warnings", list)():
        log.warning("stage '%s': %s", spec.stage, note)
    info = {**engine.info(), **memory, **environment_info(), "pid": os.getpid(),
            "host": spec.node or socket.gethostname()}
    info.setdefault("device", resolve_device(spec.device))  # for the READY log line
    channel.send(encode(Ready(spec.replica_id, info, WIRE_VERSION)))
    try:
        EngineLoop(spec.replica_id, engine, channel, payloads).run()
    finally:
        engine.shutdown()
        payloads.close()


def _memory() -> dict[str, int]:
    """What the loaded engine occupies, for READY: host RSS and, if used, GPU memory."""
    memory = {}
    try:
        with open("/proc/self/statm") as statm:
            memory["rss_bytes"] = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        memory["cuda_bytes"] = int(torch.cuda.memory_reserved())
    return memory


def _death_reason(spec: EngineSpec, exc: BaseException, tail: _TailHandler) -> str:
    last = "".join(traceback.format_exception(exc)[-6:]).rstrip()
    logs = "\n".join(list(tail.lines)[-10:])
    return f"{spec.replica_id} died: {type(exc).__name__}: {exc}\n{last}\n-- last log lines --\n{logs}"
