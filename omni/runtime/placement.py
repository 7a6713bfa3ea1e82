"""Replicas on other hosts: started, watched and killed through Ray.

Ray places and restarts processes across hosts and accounts their CPUs and GPUs; we do
not run a daemon of our own on every host. For each replica of a `placement: ray` stage
the launcher asks Ray for an actor (omni/runtime/ray_actor.py) with the stage's
resources; the actor starts the engine process on its node, and that engine connects
back to the server's CURVE control socket over tcp:// like any replica. Ray is imported
only here, and only for pipelines that place replicas with it.

`RayProcess` stands in for a multiprocessing.Process in the launcher: a `sentinel` file
descriptor that becomes readable when the actor's engine ends (its exit code) or the
actor dies (its node lost, or killed), `exitcode`, `kill()`/`terminate()` (kill the
actor; the engine, its child, exits with it) and `join()`. A restart creates a new actor,
which Ray places on any node whose resources allow it, so replicas of a lost host come
back on a surviving one when the stage's placement does not pin them there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Any

from omni.config.pipeline import PipelineConfig
from omni.config.placement import ClusterSettings, Placement
from omni.runtime.control import BindError, ControlRouter, MessageHandler
from omni.wire.curve import CurveKeys

log = logging.getLogger("omni.runtime.placement")

# engine environment worth keeping on other hosts (threads, caches, log verbosity)
FORWARDED_ENV = ("OMP_NUM_THREADS", "OMNI_CACHE_DIR", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE",
                 "TRANSFORMERS_OFFLINE")


REACH_TIMEOUT_S = 10.0  # a Ray head's GCS port that does not answer within this: refused


class PlacementError(RuntimeError):
    """Ray could not be joined, or refused a replica."""


def _check_reachable(address: str | None) -> None:
    """PlacementError unless a ``host:port`` address accepts a TCP connection: ray.init
    would wait for a GCS that does not answer for minutes, retrying (measured: still
    waiting after 5 min), so the server would neither start nor say why. Other forms
    (``auto``, ``ray://...``) are left to ray.init."""
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise PlacementError(f"cannot reach the Ray cluster at {address!r}: {exc} (start "
                             "one with `ray start --head`, or set cluster.ray_address)"
                             ) from None


class RemoteReplicas:
    """The remote half of a pipeline's launch: its CURVE keys (made per server start), its
    Ray placer, and the CURVE control router that replicas on other hosts connect to."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline
        self.keys = CurveKeys.generate()
        self.placer = RayPlacer(pipeline.cluster)
        self.router: ControlRouter | None = None

    @property
    def host(self) -> str:
        """The server's address on the cluster network (data sockets bind it too)."""
        return self.placer.host

    async def start(self, on_message: MessageHandler, loop: asyncio.AbstractEventLoop) -> None:
        await self.placer.connect()
        address = f"tcp://{_bracketed(self.host)}:{self.pipeline.cluster.control_port or '*'}"
        try:
            # its replicas' liveness is their link's (omni/runtime/liveness.py)
            self.router = ControlRouter(address, on_message, curve=self.keys,
                                        link_heartbeat_s=self.pipeline.heartbeat_s)
        except BindError as exc:
            raise PlacementError(f"pipeline '{self.pipeline.name}': {exc}") from None
        self.router.attach(loop)
        log.info("pipeline '%s': replicas on other hosts connect to %s (CURVE)",
                 self.pipeline.name, self.router.address)

    def spawn(self, spec: Any, stage: Any, name: str) -> RayProcess:
        return self.placer.start(spec, stage.placement, name)

    def close(self) -> None:
        if self.router is not None:
            self.router.close()
            self.router = None
        self.placer.close()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class RayPlacer:
    """This server's handle on a Ray cluster (one per pipeline with ray-placed stages)."""

    def __init__(self, cluster: ClusterSettings) -> None:
        self.cluster = cluster
        self.host: str = cluster.host or ""
        self.ray: Any = None
        self._owns_ray = False

    async def connect(self) -> None:
        """Join the cluster (in a thread: ray.init blocks for about a second)."""
        await asyncio.get_running_loop().run_in_executor(None, self._connect)

    def _connect(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise PlacementError("placement: ray needs Ray: pip install 'omni[distributed]' "
                                 f"({exc})") from None
        self.ray = ray
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or self.cluster.ray_address
            kwargs: dict[str, Any] = {"address": address, "namespace": "omni",
                                      "log_to_driver": True, "include_dashboard": False}
            if address == "local":  # a private one-node cluster of this server (tests)
                kwargs.update(address=None, configure_logging=False)
            if self.cluster.host:
                kwargs["_node_ip_address"] = self.cluster.host
            _check_reachable(address)
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError, ...
                raise PlacementError(f"cannot join the Ray cluster at {address!r}: {exc} "
                                     "(start one with `ray start --head`, or set "
                                     "cluster.ray_address)") from None
            self._owns_ray = True
        self.host = self.host or ray.util.get_node_ip_address()
        log.info("joined the Ray cluster (%d nodes alive); replicas connect back to %s",
                 sum(1 for n in ray.nodes() if n.get("Alive")), self.host)

    def start(self, spec: Any, placement: Placement, name: str) -> RayProcess:
        """An actor that starts ``spec``'s engine on a node Ray picks for ``placement``."""
        from omni.runtime.ray_actor import EngineHost

        resources = dict(placement.resources)
        if placement.node_ip:
            resources[f"node:{placement.node_ip}"] = 0.001  # Ray's per-node resource
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        actor = EngineHost.options(
            name=None, num_cpus=placement.cpus, num_gpus=placement.gpus,
            resources=resources, max_restarts=0,
            runtime_env={"env_vars": env} if env else None).remote()
        return RayProcess(self.ray, actor, actor.run.remote(spec), name)

    def close(self) -> None:
        if self._owns_ray and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()


class RayProcess:
    """A replica's engine under a Ray actor, shaped like the multiprocessing.Process the
    launcher watches (module doc)."""

    def __init__(self, ray: Any, actor: Any, done: Any, name: str) -> None:
        self.ray, self.actor, self.name = ray, actor, name
        self.pid: int | None = None  # the engine's pid on its node, once it said READY
        self.node_ip: str | None = None
        self.exitcode: int | None = None
        self.reason: str | None = None
        self._read, self._write = os.pipe()
        self.sentinel = self._read
        done.future().add_done_callback(self._ended)  # called on one of Ray's threads

    def _ended(self, future: Any) -> None:
        try:
            code = future.result()
            self.exitcode = code if isinstance(code, int) else 1
        except Exception as exc:  # noqa: BLE001 - RayActorError and the like
            self.exitcode = -signal.SIGKILL
            self.reason = f"its Ray actor died: {str(exc).splitlines()[0][:300]}"
        os.write(self._write, b"x")

    def describe(self, connected: bool = True) -> str:
        where = f" on {self.node_ip}" if self.node_ip else ""
        if self.reason:
            return f"replica process{where} lost: {self.reason}"
        return f"replica process {self.pid}{where} exited with code {self.exitcode}"

    def kill(self) -> None:
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already dead
            log.debug("killing the actor of %s: %s", self.name, exc)

    terminate = kill  # the engine has no clean stop to ask for beyond SHUTDOWN

    def join(self, timeout: float | None = None) -> None:
        if self._write >= 0 and self.exitcode is not None:
            for fd in (self._read, self._write):
                os.close(fd)
            self._write = -1
