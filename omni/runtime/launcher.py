"""Spawn every replica of a pipeline in parallel, watch them, tear them down.

EngineGroup owns the orchestrator side of one pipeline's control plane: a ZeroMQ ROUTER
(omni/runtime/control.py) that every replica's DEALER connects to, one sentinel watch
per child process, and a heartbeat check (heartbeats.py). Startup waits on READY messages
and sentinels together, so a stage that fails to load fails the start at once with its
own error. A replica is declared dead by whichever comes first: its DEAD notice, its
process's exit (read after draining what it sent), or late heartbeats from a replica
that is gone (a stopped local process, a remote one whose link timed out: liveness.py;
a local one is then killed); a replica that is only busy is not. A stage with
``restart`` starts it again (restarts.py). Nothing polls: readiness comes from the
loop's own readers; the heartbeat check is a timer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from omni.config.memory import memory_note
from omni.config.pipeline import PipelineConfig
from omni.config.stages import StageConfig
from omni.engines.proc import stage_spec
from omni.runtime.control import BindError, ControlRouter, PeerUnreachableError
from omni.runtime.heartbeats import HeartbeatWatch
from omni.runtime.leftovers import new_ipc_dir, sweep_dead_launches, unlink_arenas
from omni.runtime.liveness import probe
from omni.runtime.placement import PlacementError, RemoteReplicas
from omni.runtime.pool import Replica, StagePool, external_slot
from omni.runtime.processes import describe_exit, process_context, start_local
from omni.runtime.restarts import next_incarnation, restart_delay
from omni.runtime.teardown import Teardown
from omni.runtime.versions import wire_refusal
from omni.wire.protocol import (
    AbortAck,
    Dead,
    Outputs,
    ProtocolError,
    Ready,
    Report,
    SessionReply,
    Shutdown,
    decode_report,
    encode,
    heartbeat_owner,
    ipc_address,
    opens_incarnation,
    parse_identity,
)

log = logging.getLogger("omni.runtime.launcher")

PROGRESS_EVERY_S = 15.0


class StartupError(RuntimeError):
    """A replica failed to load; the message carries its error and last log lines."""


class ReplicaUnreachableError(ConnectionError):
    """The replica's control connection is gone (it is dying or dead)."""


# what a running engine reports: its outputs and its answers (and the frame's bytes)
ReportHandler = Callable[[Replica, Outputs | AbortAck | SessionReply, int], None]
DeathHandler = Callable[[Replica, str], None]


class EngineGroup:
    """The engine processes of one pipeline and the control socket that reaches them."""

    def __init__(self, pipeline: PipelineConfig, *, on_report: ReportHandler,
                 on_death: DeathHandler, dtype: str = "auto", log_level: int = logging.INFO,
                 startup_timeout_s: float = 900.0) -> None:
        self.pipeline = pipeline
        self.on_report = on_report
        self.on_death = on_death
        self.dtype = dtype
        self.log_level = log_level
        self.startup_timeout_s = startup_timeout_s
        self.pools: dict[str, StagePool] = {}
        self.replicas: dict[str, Replica] = {}
        self.stopping = False
        self.control: ControlRouter | None = None
        # replicas on other hosts: CURVE keys, Ray, a tcp:// router (omni/runtime/placement.py)
        self.remote = RemoteReplicas(pipeline) if pipeline.remote else None
        self.largest_sent: dict[str, int] = {}  # stage -> bytes of its largest message
        self._by_identity: dict[bytes, Replica] = {}  # current incarnations only
        self._retired: set[bytes] = set()  # identities whose late messages were seen
        self._exits: dict[str, asyncio.Future] = {}
        # late heartbeats: gone or busy? (omni/runtime/heartbeats.py, liveness.py)
        self.heartbeats = HeartbeatWatch(pipeline.heartbeat_s, self.replicas, self._drain,
                                         self._silent, self._probe, pipeline.hang_timeout_s)
        sweep_dead_launches()
        self._ipc_dir = new_ipc_dir()  # private (0700): only this user reaches its sockets
        # shared-memory names of this launch's payload arenas: omni-<pid>-<tag>-<replica>
        self.arena_prefix = f"omni-{os.getpid()}-{os.path.basename(self._ipc_dir)[-6:]}"
        self._teardown = Teardown(self._exits, self._ipc_dir, self.arena_prefix)

    @property
    def control_address(self) -> str:
        """Where engines connect (a tcp port given as * resolved)."""
        return self.control.address if self.control else ""

    # -- startup -----------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            try:
                self.control = ControlRouter(
                    self.pipeline.control_bind or ipc_address(self._ipc_dir), self.on_message,
                    # libzmq pings only where replicas this server does not start connect
                    link_heartbeat_s=self.pipeline.heartbeat_s if any(
                        s.launch == "external" for s in self.pipeline.stages) else 0.0)
            except BindError as exc:
                raise StartupError(f"pipeline '{self.pipeline.name}': {exc}") from None
            self.control.attach(self.loop)
            if self.remote is not None:
                try:
                    await self.remote.start(self.on_message, self.loop)
                except PlacementError as exc:
                    raise StartupError(str(exc)) from None
            spawn = process_context(self.pipeline)
            for stage in self.pipeline.stages:
                self.pools[stage.name] = StagePool(stage.name, [
                    self._spawn(spawn, stage, i) for i in range(stage.replicas)])
            self.heartbeats.start(self.loop)
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    def _spawn(self, spawn: Any, stage: StageConfig, index: int) -> Replica:
        replica_id = f"{stage.name}/{index}"
        replica = Replica(replica_id, stage.name, index, None, self.loop.create_future())
        self.replicas[replica_id] = replica
        if stage.launch == "external":
            log.info("waiting for replica %s to connect: python -m omni.engines.proc "
                     "--connect %s --pipeline PIPELINE --stage %s --index %d", replica_id,
                     self.control_address, stage.name, index)
        else:
            self._start_process(spawn, stage, replica)
        return replica

    def _start_process(self, spawn: Any, stage: StageConfig, replica: Replica) -> None:
        replica_id, index = replica.replica_id, replica.index
        self._by_identity[replica.identity] = replica
        remote, name = self.remote, f"omni-{self.pipeline.name}-{replica_id}"
        spec = stage_spec(self.pipeline, stage.name, index, control_address=(
            remote.router.address if stage.placement.remote else self.control_address),
            arena_name=self.arena_name(replica), incarnation=replica.incarnation,
            dtype=self.dtype, log_level=self.log_level,
            curve=remote.keys.to_dict() if remote else None,
            data_host=remote.host if remote else "127.0.0.1",
            encrypt_payloads=bool(remote and self.pipeline.cluster.encrypt_payloads))
        try:
            process = (remote.spawn(spec, stage, name) if stage.placement.remote
                       else start_local(spawn, stage, spec, name, self._ipc_dir))
        except OSError as exc:  # e.g. its interpreter is gone since the load, or no fork
            how = f" with {stage.python}" if stage.python else ""
            self._retire(replica)
            self._fail(replica, f"cannot start stage '{stage.name}'{how}: {exc}")
            return
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

    # -- teardown ----------------------------------------------------------------------
    async def stop(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN every live replica, wait, then terminate/kill stragglers; free all
        (teardown.py)."""
        self.stopping = True
        self.heartbeats.stop()
        sockets = [s for s in (self.control, self.remote) if s is not None]
        await self._teardown.run(self.replicas, self.try_send, sockets, timeout_s)
        self.control = None

    # -- messages ----------------------------------------------------------------------
    def send(self, replica: Replica, message: bytes) -> int:
        """Send one message to one replica; returns the bytes sent."""
        if not replica.connected:
            raise ReplicaUnreachableError(f"replica {replica.replica_id} is not connected")
        try:
            self._router(replica).send(replica.identity, message)
        except PeerUnreachableError as exc:
            raise ReplicaUnreachableError(f"replica {replica.replica_id}: {exc}") from exc
        # the largest control message each stage got: payloads ride the payload plane,
        # so this stays small (tests/http/test_control_message_sizes.py)
        if len(message) > self.largest_sent.get(replica.stage, 0):
            self.largest_sent[replica.stage] = len(message)
        return len(message)

    def _router(self, replica: Replica) -> ControlRouter:
        if self.remote is not None and self.pipeline.stage(replica.stage).placement.remote:
            return self.remote.router
        return self.control

    def _drain(self) -> None:
        """Read what every router holds now (messages queued behind a busy loop)."""
        for router in (self.control, self.remote and self.remote.router):
            if router is not None:
                router.drain()

    def try_send(self, replica: Replica, message: bytes) -> bool:
        """Send unless the peer is gone (it may have just died); True if sent."""
        try:
            self.send(replica, message)
            return True
        except ReplicaUnreachableError as exc:
            log.debug("%s", exc)
            return False

    def on_message(self, identity: bytes, message: bytes) -> None:
        replica = self._by_identity.get(identity)
        if replica is None:
            self._from_unknown(identity, message)
            return
        refused = None if replica.connected else wire_refusal(
            message, replica.replica_id, self.pipeline.stage(replica.stage).python)
        if refused:  # another wire version (versions.py): it fails to start, and stops
            replica.connected = True  # so that it can be told to
            self._on_dead(replica, refused)
            if replica.process is not None:
                replica.process.kill()  # it may not read a Shutdown of this version
            return
        try:
            report = decode_report(message)
            if report.replica_id != replica.replica_id:
                raise ProtocolError(f"{type(report).__name__} from {replica.replica_id} "
                                    f"names {report.replica_id!r}")
            if not replica.connected:
                self._identify(replica, report)
            elif isinstance(report, (Outputs, AbortAck, SessionReply)):
                if not isinstance(report, AbortAck) and report.stats:
                    replica.stats = report.stats  # the latest gauges (a rejection has none)
                self.on_report(replica, report, len(message))
            elif isinstance(report, Dead):
                self._on_dead(replica, report.reason)
            else:
                raise ProtocolError(f"unexpected {type(report).__name__} from a running engine")
        except ProtocolError as exc:
            log.error("dropping malformed engine message from %s: %s", replica.replica_id, exc)
        except Exception:  # one bad message must not stop the others from being read
            log.exception("dropping malformed engine message from %s: handling it raised",
                          replica.replica_id)

    def _from_unknown(self, identity: bytes, message: bytes) -> None:
        """A heartbeat, an external replica's new incarnation, or a message of a retired
        incarnation or a stranger (ignored)."""
        replica = external_slot(self.replicas, identity, self.pipeline)
        if replica is not None and opens_incarnation(message):  # a Ready (or Dead) adopts
            replica.incarnation = parse_identity(identity)[1]
            self._by_identity[identity] = replica
            self.on_message(identity, message)
            return
        owner = heartbeat_owner(identity)
        if owner is not None:  # one whose replica has not said READY yet is moot
            replica = self._by_identity.get(owner)
            if replica is not None:
                replica.last_heartbeat = time.monotonic()
            return
        if identity not in self._retired and len(self._retired) < 10_000:
            self._retired.add(identity)  # log each stranger once
            log.warning("ignoring control messages from %r: not a current replica "
                        "(a restarted replica's predecessor, or a stranger)", identity[:64])

    def _identify(self, replica: Replica, report: Report) -> None:
        """The first message of an incarnation: Ready, or Dead if loading failed."""
        if not isinstance(report, (Ready, Dead)):
            raise ProtocolError(f"{replica.replica_id} opened with {type(report).__name__}; "
                                "expected Ready or Dead")
        replica.connected = True
        replica.last_heartbeat = time.monotonic()
        if isinstance(report, Dead):
            self._on_dead(replica, report.reason)
        elif self.stopping:  # it finished loading after we gave up on the pipeline
            self.try_send(replica, encode(Shutdown()))
        else:
            self._mark_ready(replica, report.info)

    def _mark_ready(self, replica: Replica, info: dict[str, Any]) -> None:
        replica.info, replica.alive = info, True
        replica.ready_at = time.monotonic()
        replica.ready.set_result(info)
        if replica.process is not None and replica.process.pid is None:  # Ray's
            replica.process.pid = info.get("pid")
        log.info("replica %s ready (pid %s%s, %s%s%s)", replica.replica_id,
                 replica.process.pid if replica.process else "external",
                 f" on {info.get('host')}" if self._router(replica) is not self.control else "",
                 info.get("device", "device not reported"), memory_note(info),
                 f", {info.get('python')}" if self.pipeline.stage(replica.stage).python
                 else "")

    def _on_dead(self, replica: Replica, reason: str) -> None:
        """The engine's own death notice: fail it, then let it exit (it waits for this)."""
        self._fail(replica, reason)
        self.try_send(replica, encode(Shutdown()))

    # -- deaths ------------------------------------------------------------------------
    def arena_name(self, replica: Replica) -> str:
        return f"{self.arena_prefix}-{replica.stage}-{replica.index}"

    def _probe(self, replica: Replica) -> tuple[str | None, str]:
        """Gone or busy, for a replica whose heartbeats are late (liveness.py): a child of
        ours by its process state, any other by its link."""
        router = self._router(replica)
        return probe(replica, router, router is self.control and replica.process is not None)

    def _silent(self, replica: Replica, reason: str) -> None:
        """Late heartbeats of a replica that is gone (heartbeats.py): dead; a local
        process is killed."""
        self._retire(replica)
        self._fail(replica, reason)
        if replica.process is not None and replica.process.exitcode is None:
            replica.process.kill()  # the sentinel then restarts it, if configured

    def _retire(self, replica: Replica) -> None:
        """Forget this incarnation's identity: whatever it still sends is ignored."""
        self._by_identity.pop(replica.identity, None)
        replica.connected = False

    def _on_exit(self, replica: Replica, process: Any) -> None:
        self.loop.remove_reader(process.sentinel)
        process.join()
        unlink_arenas(self.arena_name(replica) + "-")  # a killed producer cannot do it
        self._drain()  # what it sent before it ended (a DEAD notice) comes first
        self._retire(replica)
        self._exits[replica.replica_id].set_result(process.exitcode)
        if not self.stopping:
            self._after_exit(replica)

    def _after_exit(self, replica: Replica) -> None:
        """Fail the replica and start a new incarnation when the stage asks for restarts."""
        was_ready = replica.ready.done() and not replica.ready.exception()
        self._fail(replica, describe_exit(replica))
        if was_ready and self.pipeline.stage(replica.stage).restart and not self.stopping:
            self.loop.call_later(restart_delay(replica), self._restart, replica)

    def _restart(self, replica: Replica) -> None:
        if self.stopping:
            return
        replica.restarts += 1
        replica.crash_streak += 1
        log.warning("restarting replica %s (restart #%d)", replica.replica_id, replica.restarts)
        next_incarnation(replica, self.loop)
        self._start_process(process_context(self.pipeline),
                            self.pipeline.stage(replica.stage), replica)

    def _fail(self, replica: Replica, reason: str) -> None:
        """A DEAD notice (with the engine's own reason), an exit or silence, whichever
        comes first."""
        replica.exit_reason = replica.exit_reason or reason
        if not replica.ready.done():
            replica.ready.set_exception(StartupError(
                f"pipeline '{self.pipeline.name}': stage '{replica.stage}' failed to start: "
                f"{replica.exit_reason}"))
        elif replica.alive:
            replica.alive = False
            log.error("replica %s is down: %s", replica.replica_id, replica.exit_reason)
            self.on_death(replica, replica.exit_reason)
            if replica.process is None and not self.stopping:
                self._await_next_incarnation(replica)

    def _await_next_incarnation(self, replica: Replica) -> None:
        """An external replica is gone: its slot waits for a newer incarnation."""
        self._retire(replica)
        next_incarnation(replica, self.loop)
        log.warning("waiting for replica %s to connect again with --incarnation %d or later",
                    replica.replica_id, replica.incarnation)
