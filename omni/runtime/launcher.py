"""Spawn every replica of a pipeline in parallel, watch them, tear them down.

EngineGroup owns the orchestrator side of the control plane for one pipeline: a Unix
socket server on the asyncio loop that each engine connects to (one connection per
replica, both directions, see protocol.py), and one sentinel watch per child process.
Startup waits on READY messages and sentinels together, so a stage that fails to load
fails the start at once with its own error. Nothing polls: readiness comes from the
loop's own socket and pipe readers.
"""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from omni.config.pipeline import PipelineConfig, StageConfig
from omni.engines.proc import EngineSpec, run_engine_process
from omni.protocol import FrameReader, Msg, ProtocolError, decode, encode, frame
from omni.runtime.pool import Replica, StagePool

log = logging.getLogger("omni.runtime.launcher")

PROGRESS_EVERY_S = 15.0
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # a crash loop must not spin the CPU


class StartupError(RuntimeError):
    """A replica failed to load; the message carries its error and last log lines."""


class ReplicaUnreachableError(ConnectionError):
    """The replica's control connection is gone (it is dying or dead)."""


OutputsHandler = Callable[[Replica, list, dict[str, Any], int], None]
DeathHandler = Callable[[Replica, str], None]


class _Connection(asyncio.Protocol):
    """One engine's control connection; unnamed until its first message names it."""

    def __init__(self, group: EngineGroup) -> None:
        self.group = group
        self.reader = FrameReader()
        self.replica: Replica | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = group.loop.create_future()  # resolved once everything sent was read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.reader.feed(data)
        except ProtocolError as exc:  # the stream is out of step: nothing after is usable
            log.error("closing an engine connection: %s", exc)
            self.transport.close()
            return
        for message in messages:
            self.group.on_message(self, message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set_result(None)


class EngineGroup:
    """The engine processes of one pipeline and the connections that reach them."""

    def __init__(self, pipeline: PipelineConfig, *, on_outputs: OutputsHandler,
                 on_death: DeathHandler, dtype: str = "auto", log_level: int = logging.INFO,
                 startup_timeout_s: float = 900.0) -> None:
        self.pipeline = pipeline
        self.on_outputs = on_outputs
        self.on_death = on_death
        self.dtype = dtype
        self.log_level = log_level
        self.startup_timeout_s = startup_timeout_s
        self.pools: dict[str, StagePool] = {}
        self.replicas: dict[str, Replica] = {}
        self.stopping = False
        self._exits: dict[str, asyncio.Future] = {}
        self._server: asyncio.AbstractServer | None = None
        # a private 0700 directory: only this user can reach the control socket
        self._ipc_dir = tempfile.mkdtemp(prefix="omni-ipc-")
        self.control_path = os.path.join(self._ipc_dir, "control.sock")
        # shared-memory names of this launch's payload arenas: omni-<pid>-<tag>-<replica>
        self.arena_prefix = f"omni-{os.getpid()}-{os.path.basename(self._ipc_dir)[-6:]}"

    # -- startup -----------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_unix_server(lambda: _Connection(self),
                                                          self.control_path)
        spawn = process_context(self.pipeline)
        for stage in self.pipeline.stages:
            self.pools[stage.name] = StagePool(stage.name, [
                self._spawn(spawn, stage, i) for i in range(stage.replicas)])
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    def _spawn(self, spawn: Any, stage: StageConfig, index: int) -> Replica:
        replica_id = f"{stage.name}/{index}"
        replica = Replica(replica_id, stage.name, index, None, self.loop.create_future())
        self.replicas[replica_id] = replica
        self._start_process(spawn, stage, replica)
        return replica

    def _start_process(self, spawn: Any, stage: StageConfig, replica: Replica) -> None:
        replica_id, index = replica.replica_id, replica.index
        spec = EngineSpec(
            replica_id=replica_id, stage=stage.name, engine=stage.engine,
            control_path=self.control_path, model=stage.model, model_dir=stage.model_dir,
            device=stage.devices[index % len(stage.devices)], dtype=self.dtype,
            options={k: v for k, v in stage.options.items() if k != "payload_arena_mb"},
            log_level=self.log_level, arena_name=self.arena_name(replica),
            payload_options=self._payload_options(stage), memory=stage.memory,
            memory_share=stage.memory_share)
        process = spawn.Process(target=run_engine_process, args=(spec,),
                                name=f"omni-{self.pipeline.name}-{replica_id}")
        process.start()
        replica.process = process
        self._exits[replica_id] = self.loop.create_future()
        self.loop.add_reader(process.sentinel, self._on_exit, replica, process)

    async def _wait_ready(self) -> None:
        started = time.monotonic()
        pending = {r.ready for r in self.replicas.values()}
        while pending:
            left = self.startup_timeout_s - (time.monotonic() - started)
            if left <= 0:
                raise StartupError(f"pipeline '{self.pipeline.name}': replicas not ready after "
                                   f"{self.startup_timeout_s:.0f} s: {self._loading()}")
            done, pending = await asyncio.wait(
                pending, timeout=min(PROGRESS_EVERY_S, left),
                return_when=asyncio.FIRST_EXCEPTION)
            for future in done:
                future.result()  # raises the first failure
            if pending:
                log.info("pipeline '%s': still loading %s (%.0f s)", self.pipeline.name,
                         self._loading(), time.monotonic() - started)

    def _loading(self) -> str:
        return ", ".join(r.replica_id for r in self.replicas.values() if not r.ready.done())

    # -- messages ----------------------------------------------------------------------
    def send(self, replica: Replica, message: bytes) -> int:
        """Send one message to one replica; returns the bytes sent."""
        connection = replica.connection
        if connection is None or connection.transport.is_closing():
            raise ReplicaUnreachableError(f"replica {replica.replica_id} is not connected")
        connection.transport.write(frame(message))
        return len(message)

    def try_send(self, replica: Replica, message: bytes) -> bool:
        """Send unless the peer is gone (it may have just died); True if sent."""
        try:
            self.send(replica, message)
            return True
        except ReplicaUnreachableError as exc:
            log.debug("%s", exc)
            return False

    def on_message(self, connection: _Connection, message: bytes) -> None:
        try:
            kind, body = decode(message)
            if connection.replica is None:
                self._identify(connection, kind, body)
            elif kind == Msg.OUTPUTS:
                _check_rows(body, connection.replica)
                connection.replica.stats = body[2]
                self.on_outputs(connection.replica, body[1], body[2], len(message))
            elif kind == Msg.DEAD:
                self._fail(connection.replica, body[1])
            else:
                raise ProtocolError(f"unexpected {kind.name} from a running engine")
        except ProtocolError as exc:
            log.error("dropping malformed engine message: %s", exc)
        except Exception:  # one bad message must not stop the others from being read
            log.exception("dropping malformed engine message: handling it raised")
        if connection.replica is None:  # a peer that cannot say who it is gets no more
            connection.transport.close()

    def _identify(self, connection: _Connection, kind: Msg, body: list) -> None:
        """The first message names the replica: READY, or DEAD if loading failed."""
        replica = self.replicas.get(body[0]) if isinstance(body[0], str) else None
        if kind not in (Msg.READY, Msg.DEAD) or replica is None or replica.connection:
            raise ProtocolError(f"connection opened with {kind.name} for an unknown or "
                                "already connected replica; closing it")
        connection.replica, replica.connection = replica, connection
        if kind == Msg.DEAD:
            self._fail(replica, body[1])
        elif self.stopping:  # it finished loading after we gave up on the pipeline
            self.try_send(replica, encode(Msg.SHUTDOWN))
        else:
            self._mark_ready(replica, body[1])

    def _mark_ready(self, replica: Replica, info: Any) -> None:
        if not isinstance(info, dict):
            raise ProtocolError("READY info must be a map")
        replica.info, replica.alive = info, True
        replica.ready.set_result(info)
        log.info("replica %s ready (pid %s)", replica.replica_id, replica.process.pid)

    # -- deaths ------------------------------------------------------------------------
    def _payload_options(self, stage: StageConfig) -> dict[str, Any]:
        """Where the stage's output payloads go, from its outgoing edges' `connector`."""
        kinds = {e.connector for e in self.pipeline.edges if e.src == stage.name}
        if stage.final_output:
            kinds.add("auto")  # the front end reads refs of any backend
        put = kinds.pop() if len(kinds) == 1 and kinds <= {"inline", "shm"} else "auto"
        options: dict[str, Any] = {"put": put}
        if "payload_arena_mb" in stage.options:
            options["capacity_bytes"] = int(float(stage.options["payload_arena_mb"]) * 2**20)
        return options

    def arena_name(self, replica: Replica) -> str:
        return f"{self.arena_prefix}-{replica.stage}-{replica.index}"

    def _on_exit(self, replica: Replica, process: Any) -> None:
        self.loop.remove_reader(process.sentinel)
        process.join()
        unlink_arenas(self.arena_name(replica) + "-")  # a killed producer cannot do it
        self._exits[replica.replica_id].set_result(process.exitcode)
        if not self.stopping:
            self.loop.create_task(self._after_exit(replica))

    async def _after_exit(self, replica: Replica) -> None:
        """Read what the process wrote before it died (its DEAD reason), fail it, and
        start a new process when the stage asks for restarts."""
        was_ready = replica.ready.done() and not replica.ready.exception()
        if replica.connection is not None:
            await replica.connection.closed  # EOF comes after the last byte it sent
        self._fail(replica, _describe_exit(replica))
        if was_ready and self.pipeline.stage(replica.stage).restart and not self.stopping:
            delay = RESTART_BACKOFF_S[min(replica.restarts, len(RESTART_BACKOFF_S) - 1)]
            self.loop.call_later(delay, self._restart, replica)

    def _restart(self, replica: Replica) -> None:
        if self.stopping:
            return
        replica.restarts += 1
        log.warning("restarting replica %s (restart #%d)", replica.replica_id, replica.restarts)
        replica.connection = None  # the old one is closed: EOF was read
        replica.exit_reason = None
        replica.ready = self.loop.create_future()
        replica.ready.add_done_callback(self._restarted)
        self._start_process(process_context(self.pipeline),
                            self.pipeline.stage(replica.stage), replica)

    def _restarted(self, ready: asyncio.Future) -> None:
        if not ready.cancelled() and ready.exception() is not None:
            log.error("%s", ready.exception())  # it failed to load again: stays down

    def _fail(self, replica: Replica, reason: str) -> None:
        """A DEAD notice (with the engine's own reason) or an exit, whichever comes first."""
        replica.exit_reason = replica.exit_reason or reason
        if not replica.ready.done():
            replica.ready.set_exception(StartupError(
                f"pipeline '{self.pipeline.name}': stage '{replica.stage}' failed to start: "
                f"{replica.exit_reason}"))
        elif replica.alive:
            replica.alive = False
            log.error("replica %s is down: %s", replica.replica_id, replica.exit_reason)
            self.on_death(replica, replica.exit_reason)

    # -- teardown ----------------------------------------------------------------------
    async def stop(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN every live replica, wait, then terminate/kill stragglers; free all."""
        self.stopping = True
        for replica in self.replicas.values():
            if replica.alive:
                self.try_send(replica, encode(Msg.SHUTDOWN))
            elif not (self._exits[replica.replica_id].done() or replica.exit_reason):
                replica.process.terminate()  # still loading: nothing to drain
            replica.alive = False
        await self._wait_exits(timeout_s, "terminate")
        await self._wait_exits(2.0, "kill")
        await self._wait_exits(2.0, None)
        self._close()

    async def _wait_exits(self, timeout_s: float, then: str | None) -> None:
        running = [f for f in self._exits.values() if not f.done()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for replica in self.replicas.values():
            if then and not self._exits[replica.replica_id].done():
                log.warning("replica %s did not exit; %s", replica.replica_id, then)
                getattr(replica.process, then)()

    def _close(self) -> None:
        for replica in self.replicas.values():
            if not self._exits[replica.replica_id].done():
                self.loop.remove_reader(replica.process.sentinel)
            if replica.connection is not None:
                replica.connection.transport.abort()
        if self._server is not None:
            self._server.close()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        unlink_arenas(self.arena_prefix + "-")


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
    if any(stage.engine != "echo" for stage in pipeline.stages):
        context.set_forkserver_preload(HEAVY_MODULES + _model_modules(pipeline))
    return context


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


def unlink_arenas(prefix: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove shared-memory arenas by name prefix (their producer is gone).

    Plain unlinks, not omni.connector.cleanup_stale: the orchestrator process must not
    import torch for this. Processes that still map an arena keep their mapping.
    """
    removed = []
    for path in glob.glob(os.path.join(shm_dir, glob.escape(prefix) + "*")):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def _check_rows(body: list, replica: Replica) -> None:
    if body[0] != replica.replica_id:
        raise ProtocolError(f"OUTPUTS from {replica.replica_id} names {body[0]!r}")
    rows, stats = body[1], body[2]
    if not isinstance(rows, list) or not isinstance(stats, dict) or not all(
            isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
            and (r[3] is None or _is_error(r[3])) for r in rows):
        raise ProtocolError("OUTPUTS rows must be [request_id, data, finished, error] arrays, "
                            "error null or [kind, message]")


def _is_error(error: Any) -> bool:
    return (isinstance(error, list) and len(error) == 2
            and all(isinstance(x, str) for x in error))


def _describe_exit(replica: Replica) -> str:
    code = replica.process.exitcode
    if code is None:
        return "process still running but unreachable"
    if code < 0:
        return f"process {replica.process.pid} killed by {signal.Signals(-code).name}"
    return f"process {replica.process.pid} exited with code {code}"
