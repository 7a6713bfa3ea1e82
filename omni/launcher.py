"""Spawn every replica of a pipeline in parallel, watch them, tear them down.

EngineGroup owns the orchestrator side of the control plane for one pipeline: the
ROUTER (requests out, READY in) and PULL (results in) sockets, read from the asyncio
loop through their file descriptors (no polling, no extra thread), and one sentinel
watch per child process. Startup waits on READY messages and sentinels together, so a
stage that fails to load fails the start at once with its own error.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from omni.config import PipelineConfig, StageConfig
from omni.engines.proc import EngineSpec, run_engine_process
from omni.pool import Replica, StagePool
from omni.protocol import Endpoints, Msg, ProtocolError, decode, encode

log = logging.getLogger("omni.launcher")

PROGRESS_EVERY_S = 15.0
DEATH_NOTICE_WAIT_S = 1.0  # a crashed child's DEAD notice may trail its exit by a moment


class StartupError(RuntimeError):
    """A replica failed to load; the message carries its error and last log lines."""


OutputsHandler = Callable[[Replica, list, dict[str, Any], int], None]
DeathHandler = Callable[[Replica, str], None]


class EngineGroup:
    """The engine processes of one pipeline and the sockets that reach them."""

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
        self._notices: dict[str, asyncio.Future] = {}
        self._ipc_dir = tempfile.mkdtemp(prefix="omni-ipc-")
        self.endpoints = Endpoints(f"ipc://{self._ipc_dir}/requests",
                                   f"ipc://{self._ipc_dir}/results")
        self._ctx = zmq.Context(io_threads=1)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._pull = self._ctx.socket(zmq.PULL)

    # -- startup -----------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._bind()
        spawn = multiprocessing.get_context("spawn")
        for stage in self.pipeline.stages:
            self.pools[stage.name] = StagePool(stage.name, [
                self._spawn(spawn, stage, i) for i in range(stage.replicas)])
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    def _bind(self) -> None:
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer -> error, not a drop
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.setsockopt(zmq.LINGER, 0)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._router.bind(self.endpoints.requests)
        self._pull.bind(self.endpoints.results)
        self._watch(self._router, self._on_router)
        self._watch(self._pull, self._on_pull)

    def _spawn(self, spawn: Any, stage: StageConfig, index: int) -> Replica:
        replica_id = f"{stage.name}/{index}"
        spec = EngineSpec(
            replica_id=replica_id, stage=stage.name, engine=stage.engine,
            endpoints=self.endpoints, model=stage.model, model_dir=stage.model_dir,
            device=stage.devices[index % len(stage.devices)], dtype=self.dtype,
            options=dict(stage.options), log_level=self.log_level)
        process = spawn.Process(target=run_engine_process, args=(spec,),
                                name=f"omni-{self.pipeline.name}-{replica_id}")
        process.start()
        replica = Replica(replica_id, stage.name, index, process, self.loop.create_future())
        self.replicas[replica_id] = replica
        self._exits[replica_id] = self.loop.create_future()
        self._notices[replica_id] = self.loop.create_future()
        self.loop.add_reader(process.sentinel, self._on_exit, replica)
        return replica

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

    # -- sockets -----------------------------------------------------------------------
    def _watch(self, sock: zmq.Socket, handler: Callable[[list], None]) -> None:
        # The zmq FD is edge-triggered: each wake-up must drain the socket completely.
        self.loop.add_reader(sock.getsockopt(zmq.FD), self._drain, sock, handler)
        self.loop.call_soon(self._drain, sock, handler)

    def _drain(self, sock: zmq.Socket, handler: Callable[[list], None]) -> None:
        while not sock.closed:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                handler(frames)
            except ProtocolError as exc:
                log.error("dropping malformed engine message: %s", exc)
            except Exception:  # one bad message must not stop the reader for good
                log.exception("dropping malformed engine message: handling it raised")

    def send(self, replica: Replica, frames: list[bytes]) -> int:
        """Send one message to one replica; returns the bytes sent."""
        self._router.send_multipart([replica.identity, *frames], zmq.NOBLOCK)
        if self._router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            # sending can consume the FD's edge; read what is already there
            self.loop.call_soon(self._drain, self._router, self._on_router)
        return len(frames[1])

    def _on_router(self, frames: list) -> None:
        kind, body = decode(frames[1:])
        replica = self.replicas.get(frames[0].decode(errors="replace"))
        if kind != Msg.READY or replica is None or not isinstance(body[1], dict):
            raise ProtocolError(f"unexpected {kind.name} on the request socket")
        if self.stopping:  # it finished loading after we gave up on the pipeline
            self.try_send(replica, encode(Msg.SHUTDOWN))
            return
        replica.info = body[1]
        replica.alive = True
        if not replica.ready.done():
            replica.ready.set_result(body[1])
        log.info("replica %s ready (pid %s)", replica.replica_id, replica.process.pid)

    def _on_pull(self, frames: list) -> None:
        kind, body = decode(frames)
        replica = self.replicas.get(body[0]) if isinstance(body[0], str) else None
        if replica is None:
            raise ProtocolError(f"{kind.name} from unknown replica")
        if kind == Msg.OUTPUTS:
            _check_rows(body[1], body[2])
            replica.stats = body[2]
            self.on_outputs(replica, body[1], body[2], len(frames[1]))
        elif kind == Msg.DEAD:
            self._record_notice(replica, body[1])
            self._fail(replica, body[1])
        else:
            raise ProtocolError(f"unexpected {kind.name} on the result socket")

    # -- deaths ------------------------------------------------------------------------
    def _on_exit(self, replica: Replica) -> None:
        process = replica.process
        self.loop.remove_reader(process.sentinel)
        process.join()
        self._drain(self._pull, self._on_pull)  # a DEAD notice may already be waiting
        self._exits[replica.replica_id].set_result(process.exitcode)
        if not self.stopping:
            self._fail(replica, replica.exit_reason or _describe_exit(replica))

    def _record_notice(self, replica: Replica, reason: str) -> None:
        replica.exit_reason = reason
        if not self._notices[replica.replica_id].done():
            self._notices[replica.replica_id].set_result(reason)

    def _fail(self, replica: Replica, reason: str) -> None:
        if not replica.ready.done():
            self.loop.create_task(self._fail_startup(replica))
            return
        if replica.alive:
            replica.alive = False
            log.error("replica %s is down: %s", replica.replica_id, reason)
            self.on_death(replica, reason)

    async def _fail_startup(self, replica: Replica) -> None:
        notice = self._notices[replica.replica_id]
        try:
            reason = await asyncio.wait_for(asyncio.shield(notice), DEATH_NOTICE_WAIT_S)
        except TimeoutError:
            reason = _describe_exit(replica)
        if not replica.ready.done():
            replica.ready.set_exception(StartupError(
                f"pipeline '{self.pipeline.name}': stage '{replica.stage}' failed to start: "
                f"{reason}"))

    # -- teardown ----------------------------------------------------------------------
    async def stop(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN every live replica, wait, then terminate/kill stragglers; free all."""
        self.stopping = True
        for replica in self.replicas.values():
            if replica.alive:
                self.try_send(replica, encode(Msg.SHUTDOWN))
            elif not (self._exits[replica.replica_id].done()
                      or self._notices[replica.replica_id].done()):
                replica.process.terminate()  # still loading: nothing to drain
            replica.alive = False
        await self._wait_exits(timeout_s, "terminate")
        await self._wait_exits(2.0, "kill")
        await self._wait_exits(2.0, None)
        self._close()

    def try_send(self, replica: Replica, frames: list[bytes]) -> bool:
        """Send unless the peer is gone (it may have just died); True if sent."""
        try:
            self.send(replica, frames)
            return True
        except zmq.ZMQError as exc:
            log.debug("cannot reach %s: %s", replica.replica_id, exc)
            return False

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
        for sock in (self._router, self._pull):
            if not sock.closed:
                self.loop.remove_reader(sock.getsockopt(zmq.FD))
                sock.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)


def _check_rows(rows: object, stats: object) -> None:
    if not isinstance(rows, list) or not isinstance(stats, dict) or not all(
            isinstance(r, list) and len(r) == 4 and isinstance(r[0], str) for r in rows):
        raise ProtocolError("OUTPUTS rows must be [request_id, data, finished, error] arrays")


def _describe_exit(replica: Replica) -> str:
    code = replica.process.exitcode
    if code is None:
        return "process still running but unreachable"
    if code < 0:
        return f"process {replica.process.pid} killed by {signal.Signals(-code).name}"
    return f"process {replica.process.pid} exited with code {code}"
