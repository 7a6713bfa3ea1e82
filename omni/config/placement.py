"""Where a stage's replicas run (`placement:`) and how the server reaches other hosts
(`cluster:`); the machinery is omni/runtime/placement.py.

    cluster:                    # only for pipelines with replicas on other hosts
      ray_address: auto         # the Ray cluster to join: auto (RAY_ADDRESS, or the one
                                #   `ray start` made here), HOST:PORT of its head, or local
                                #   (a private one-node cluster of this server)
      host: 10.0.0.1            # this server's address other hosts reach (default: the
                                #   address Ray knows this node by)
      control_port: 0           # the CURVE-encrypted control socket's port (0: any free)
      encrypt_payloads: true    # zmq data sockets with CURVE too (false: plain TCP, for
                                #   private networks: about 4x the throughput at 64 MiB)
    stages:
      - name: talker
        placement: {kind: ray, cpus: 1, gpus: 1, node_ip: 10.0.0.2}

A `placement: ray` stage's replicas are engine processes started by Ray actors on the
cluster's nodes; they connect back to the server's control socket over tcp:// with the
launch's CURVE keys. `node_ip` pins them to one node; `resources` asks for Ray custom
resources (e.g. `{host_b: 0.01}`); `cpus`/`gpus` are what Ray accounts.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from omni.config.checks import ConfigError, as_bool, as_int, check_keys, describe, optional

PLACEMENT_KEYS = ("kind", "cpus", "gpus", "node_ip", "resources")
CLUSTER_KEYS = ("ray_address", "host", "control_port", "encrypt_payloads")
PLACEMENT_KINDS = ("local", "ray")


@dataclass(frozen=True)
class Placement:
    kind: str = "local"
    cpus: float = 1.0
    gpus: float = 0.0
    node_ip: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return self.kind == "ray"


@dataclass(frozen=True)
class ClusterSettings:
    ray_address: str = "auto"
    host: str | None = None  # None: Ray's address of this node
    control_port: int = 0
    # payloads crossing hosts on CURVE-encrypted zmq sockets (the control plane always is);
    # bench/results/distributed.md: CURVE bounds a zmq socket's throughput (libsodium on
    # libzmq's one I/O thread per side), so a private network may turn it off
    encrypt_payloads: bool = True


LOCAL = Placement()


def parse_placement(src: str, path: str, raw: object) -> Placement:
    """`placement: local`, `placement: ray`, or a mapping with `kind` and resources."""
    if raw is None or raw == "local":
        return LOCAL
    if raw == "ray":
        return Placement(kind="ray")
    if not isinstance(raw, Mapping):
        raise ConfigError(src, path, f"expected local, ray or a mapping, got {describe(raw)}",
                          "Write e.g. 'placement: {kind: ray, gpus: 1}'")
    check_keys(src, path, raw, PLACEMENT_KEYS)
    kind = optional(raw, "kind", "ray")
    if kind not in PLACEMENT_KINDS:
        raise ConfigError(src, f"{path}.kind", f"unknown placement {describe(kind)}",
                          "Use local or ray")
    if kind == "local" and set(raw) - {"kind"}:
        raise ConfigError(src, path, "resources are for placement kind ray",
                          "Set kind: ray, or remove them")
    return Placement(
        kind=kind,
        cpus=_amount(src, f"{path}.cpus", optional(raw, "cpus", 1.0)),
        gpus=_amount(src, f"{path}.gpus", optional(raw, "gpus", 0.0)),
        node_ip=_address(src, f"{path}.node_ip", raw.get("node_ip")),
        resources=MappingProxyType(_resources(src, f"{path}.resources", raw.get("resources"))))


def stage_placement(src: str, path: str, raw: Mapping[str, Any]) -> Placement:
    """A stage's `placement` (Ray starts the replicas, so `launch` stays local)."""
    placement = parse_placement(src, f"{path}.placement", raw.get("placement"))
    if placement.remote and raw.get("launch", "local") != "local":
        raise ConfigError(src, f"{path}.placement", "Ray starts this stage's replicas",
                          "Remove launch: external, or placement")
    return placement


def parse_cluster(src: str, raw: object, stages: Any) -> ClusterSettings | None:
    """`cluster:`; a pipeline with ray-placed stages gets the defaults when it names none."""
    if raw is None:
        return ClusterSettings() if any(s.placement.remote for s in stages) else None
    if not isinstance(raw, Mapping):
        raise ConfigError(src, "cluster", f"expected a mapping, got {describe(raw)}",
                          "Write e.g. 'cluster: {ray_address: auto, host: 10.0.0.1}'")
    check_keys(src, "cluster", raw, CLUSTER_KEYS)
    address = optional(raw, "ray_address", "auto")
    if not isinstance(address, str) or not address:
        raise ConfigError(src, "cluster.ray_address", f"expected a string, got "
                          f"{describe(address)}", "Use auto or the head's HOST:PORT")
    port = as_int(src, "cluster.control_port", optional(raw, "control_port", 0), 0)
    if port > 65535:
        raise ConfigError(src, "cluster.control_port", f"{port} is not a port",
                          "Use 0 (any free port) or 1..65535")
    return ClusterSettings(ray_address=address,
                           host=_address(src, "cluster.host", raw.get("host")),
                           control_port=port,
                           encrypt_payloads=as_bool(src, "cluster.encrypt_payloads",
                                                    optional(raw, "encrypt_payloads", True)))


def _amount(src: str, path: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value >= 0):
        raise ConfigError(src, path, f"expected a number >= 0, got {describe(value)}",
                          "Use e.g. 1 or 0.5")
    return float(value)


def _address(src: str, path: str, value: object) -> str | None:
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(value if isinstance(value, str) else ""))
    except ValueError:
        raise ConfigError(src, path, f"expected an IP address, got {describe(value)}",
                          "Write the node's address as Ray knows it, e.g. 10.0.0.2") from None


def _resources(src: str, path: str, value: object) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(src, path, f"expected a mapping, got {describe(value)}",
                          "Write e.g. '{host_b: 0.01}'")
    return {str(name): _amount(src, f"{path}.{name}", amount) for name, amount in value.items()}

