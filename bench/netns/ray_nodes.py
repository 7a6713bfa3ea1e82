"""Ray on the netns hosts: a head in the root namespace, a worker node per namespace host,
each ``ray start`` in a session of its own so it can be stopped exactly (never ``ray
stop``: see bench/netns/__init__.py), and a driver for the test process or the server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from bench.netns.hosts import ROOT, Hosts
from bench.netns.procs import _proc_table, kill_ray_tree

# Ray's GCS health-checks every raylet: defaults (ray_config_def.h) are initial delay 5 s,
# period 3 s, timeout 10 s, 5 failures; measured here with 2.60: a killed node declared
# dead after ~13 s (each check fails at once), a cut-off one after ~63 s (each times out).
# These make it 3 failures 0.5 s apart (killed: measured ~1.5 s) with a 1 s timeout (cut
# off: ~3 x (1 + 0.5), measured ~4.5 s); a raylet must then stall ~4 s on a busy 2-core
# box to be wrongly declared dead. Read by gcs_server at start, so they go to `ray start`.
FAST_DEATH_ENV = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


# Explicit, because a machine-wide ~/.ray/auth_token (any other Ray user may create one)
# silently turns token auth on for `ray start --head` but not for `ray start --address` or
# ray.init(address=...): the worker node then fails with InvalidAuthToken. The cluster is
# a test's own, on a private bridge, for seconds; every process of it gets this.
AUTH_MODE = "disabled"


@dataclass
class RayNode:
    host: str
    ip: str
    address: str  # the head's GCS address, "ip:port": ray.init(address=...)
    temp_dir: Path
    session: int  # session id of every process of this node
    startup_s: float  # `ray start` wall time

    def rss_mb(self) -> float:
        """Resident memory of the node's processes, summed (shared pages counted twice)."""
        pages = 0
        for pid, (_, sid, _) in _proc_table().items():
            if sid == self.session:
                with suppress(OSError):
                    pages += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def _ray_start(hosts: Hosts, host: str, args: list[str]) -> RayNode:
    temp_dir = hosts.temp_root / host
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(FAST_DEATH_ENV, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE=AUTH_MODE)
    ray = str(Path(sys.executable).with_name("ray"))
    argv = [ray, "start", *args, "--temp-dir", str(temp_dir), "--num-gpus", "0",
            "--object-store-memory", str(100 * 1024 * 1024), "--include-log-monitor",
            "false", "--disable-usage-stats"]
    log = open(hosts.temp_root / f"ray-start-{host}.log", "w")
    started = time.monotonic()
    # start_new_session: the session id marks every process of this node (see the top)
    proc = hosts.exec(host, argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                      stdin=subprocess.DEVNULL, start_new_session=True)
    with open(hosts.temp_root / "sessions", "a") as sessions:  # for sweep_stale
        sessions.write(f"{proc.pid}\n")
    node = RayNode(host, hosts.ip(host), "", temp_dir, proc.pid, 0.0)
    hosts.ray_nodes.append(node)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    log.close()
    node.startup_s = time.monotonic() - started
    if rc != 0:
        tail = (hosts.temp_root / f"ray-start-{host}.log").read_text()[-3000:]
        raise RuntimeError(f"ray start on host {host} failed (rc={rc}):\n{tail}")
    return node


def start_head(hosts: Hosts, *, num_cpus: int = 1, resources: dict | None = None) -> RayNode:
    """Ray head in the root namespace, bound to the bridge address; resource host_a.

    Every port of the head is picked free: the root namespace is shared with whatever
    else runs on the machine (other agents' Ray clusters use the default 6379/8265/52365).
    No dashboard UI, no autoscaler monitor (--no-monitor), no log monitor: ~200 MB less.
    """
    ip = hosts.root_ip
    port = _free_port(ip)
    res = {f"host_{ROOT}": 1, **(resources or {})}
    node = _ray_start(hosts, ROOT, [
        "--head", "--node-ip-address", ip, "--port", str(port), "--num-cpus", str(num_cpus),
        "--resources", json.dumps(res), "--include-dashboard", "false", "--no-monitor",
        "--dashboard-port", str(_free_port("127.0.0.1")),
        "--dashboard-agent-listen-port", str(_free_port(ip))])
    node.address = f"{ip}:{port}"
    return node


def start_node(hosts: Hosts, host: str, *, num_cpus: int = 1,
               resources: dict | None = None) -> RayNode:
    """Ray worker node inside `host`'s namespace joined to the head; resource host_<x>.

    Pin an actor to it with ``.options(resources={"host_b": 0.01})``. Its ports are the
    namespace's own, so Ray's defaults cannot collide with anything.
    """
    heads = [n for n in hosts.ray_nodes if n.host == ROOT and n.address]
    if not heads:
        raise RuntimeError("start_head first")
    res = {f"host_{host}": 1, **(resources or {})}
    node = _ray_start(hosts, host, [
        "--address", heads[-1].address, "--node-ip-address", hosts.ip(host),
        "--num-cpus", str(num_cpus), "--resources", json.dumps(res)])
    node.address = heads[-1].address
    return node


def stop_node(hosts: Hosts, node: RayNode) -> None:
    """SIGKILL one node's processes (its session); `Hosts.kill` does a whole namespace."""
    kill_ray_tree(node.temp_dir, [node.session])
    hosts.ray_nodes.remove(node)


@contextmanager
def driver(head: RayNode, **init_kwargs):
    """ray.init for a driver in the root namespace (the test process, the server); yields ray.

    The explicit `_node_ip_address` pairs the driver with the head's raylet even where
    the default route would suggest another local IP (here ray.init also finds it alone:
    it asks the kernel which local address routes to the GCS). ray.shutdown() on the way
    out, before Hosts.close() kills the GCS (a connected driver would keep retrying it).
    Never address="auto" on a shared machine: it finds clusters by scanning for gcs_server
    processes, so it may join another agent's cluster.
    """
    import ray

    init_kwargs.setdefault("logging_level", "WARNING")
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = AUTH_MODE  # read by ray.init: match the cluster's
    try:
        ray.init(address=head.address, _node_ip_address=head.ip, **init_kwargs)
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop("RAY_AUTH_MODE")
        if saved is not None:
            os.environ["RAY_AUTH_MODE"] = saved
