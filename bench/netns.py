"""Several "hosts" on one machine: Linux network namespaces, one Ray node per host.

Used by tests/distributed and by `python -m bench distributed` (bench.netns). Needs root
and iproute2; `available()` says why not.

Topology: one Linux bridge in the ROOT namespace holding 10.213.<k>.1/24 ("host A": the
test process, the future server, the Ray head), and per host a namespace joined to the
bridge by its own veth pair, namespace side ``eth0`` = 10.213.<k>.<2, 3, ...>/24. One flat
L2 subnet lets every namespace reach the root's address AND every other namespace with
no routes and no ``net.ipv4.ip_forward`` (a per-pair /24 design needs forwarding: a
machine-wide sysctl on a VM other agents share). <k> is picked free under a file lock, so
concurrent test processes get disjoint subnets.

Names carry the test's pid (namespaces ``omni-t<pid>-<seq>-<host>``, links
``ot<pid>-<seq><host>``, bridge ``ot<pid>-<seq>0``, Ray temp dirs
``/tmp/omni-t<pid>-<seq>/<host>``) so `sweep_stale()` can remove what a dead (SIGKILLed)
test process left behind.

Ray: never ``ray stop``. It kills every Ray process of the machine by name (psutil scan),
other agents' clusters included, whatever --temp-dir says. Each ``ray start`` runs in a
session of its own (setsid); every process of that node (gcs, raylet, agents, workers,
which rename themselves ``ray::...``) inherits the session id, so a node is stopped by
SIGKILLing exactly its session, plus anything whose command line names our temp dir.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = "a"  # the root namespace is host A
SUBNET = "10.213"
_NS_RE = re.compile(r"^omni-t(\d+)-\d+-\w+$")
_LINK_RE = re.compile(r"^ot(\d+)-\d+\w+$")
_DIR_RE = re.compile(r"^omni-t(\d+)-\d+$")
_LOCK = Path("/run/lock/omni-netns.lock")
_seq = 0

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


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when namespaces and veths can be made here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 `ip` not found"
    ns, link = f"omni-t{os.getpid()}-99-probe", f"ot{os.getpid()}-99p"
    try:
        made = _ip("netns", "add", ns, check=False)
        if made.returncode:
            return False, f"ip netns add failed: {made.stderr.strip()}"
        veth = _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns,
                   check=False)
        if veth.returncode:
            return False, f"veth creation failed: {veth.stderr.strip()}"
        return True, ""
    finally:
        _ip("link", "del", link, check=False)
        _ip("netns", "del", ns, check=False)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, command line) of every live (non-zombie) process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), cmdline)
    return table


def _kill_and_wait(pids: Iterable[int], timeout: float = 10.0) -> None:
    pids = {p for p in pids if p != os.getpid()}
    # SIGSTOP all, then SIGKILL all: one by one, a raylet would see its agent die first
    # and unregister gracefully, which a host losing power never does
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        live = _proc_table()  # zombies count as gone: their parent (init) reaps them
        pids = {p for p in pids if p in live}
        if pids:
            time.sleep(0.05)


def kill_ray_tree(temp_root: Path, sessions: Iterable[int] = ()) -> None:
    """SIGKILL every process of the given sessions or naming `temp_root`, and descendants."""
    table = _proc_table()
    marker = f"{temp_root}/"
    sessions = set(sessions)
    # "ray" in the command line too: a recorded session id of a long-dead test may since
    # have been reused by an unrelated process (every Ray process names ray somewhere)
    doomed = {p for p, (_, sid, cmd) in table.items()
              if marker in cmd or (sid in sessions and "ray" in cmd)}
    while extra := {p for p, (ppid, _, _) in table.items() if ppid in doomed} - doomed:
        doomed |= extra  # and their descendants (a worker that called setsid)
    _kill_and_wait(doomed)


def _netns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def sweep_stale() -> None:
    """Remove namespaces, links, Ray processes and temp dirs of test processes now dead."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _NS_RE.match(name)
        if match and not _pid_alive(int(match[1])):
            _kill_and_wait(_netns_pids(name))
            _ip("netns", "del", name, check=False)
    for link in json.loads(_ip("-j", "link", "show", check=False).stdout or "[]"):
        match = _LINK_RE.match(link.get("ifname", ""))
        if match and not _pid_alive(int(match[1])):
            _ip("link", "del", link["ifname"], check=False)
    for entry in Path("/tmp").glob("omni-t*"):
        match = _DIR_RE.match(entry.name)
        if match and entry.is_dir() and not _pid_alive(int(match[1])):
            sessions = (entry / "sessions").read_text().split() if (
                entry / "sessions").exists() else []
            kill_ray_tree(entry, map(int, sessions))
            shutil.rmtree(entry, ignore_errors=True)


class Hosts:
    """N namespaces ("b", "c", ...) on a bridge with the root namespace (host "a").

    Use as a context manager; teardown (kill everything inside, delete veths, bridge,
    namespaces and temp dirs) runs even when the test body raised.
    """

    def __init__(self, count: int = 2):
        global _seq
        if not 1 <= count <= 20:
            raise ValueError("1..20 hosts")
        _seq += 1
        self.tag = f"{os.getpid()}-{_seq}"
        self.names = [chr(ord("b") + i) for i in range(count)]
        self.temp_root = Path(f"/tmp/omni-t{self.tag}")
        self.bridge = f"ot{self.tag}0"
        self.subnet = ""  # "10.213.<k>", chosen in __enter__
        self.ray_nodes: list[RayNode] = []

    # -- addressing ------------------------------------------------------------------
    def ns(self, host: str) -> str:
        self._check(host)
        return f"omni-t{self.tag}-{host}"

    def veth(self, host: str) -> str:
        """Root-side end of the host's veth pair (the namespace side is ``eth0``)."""
        self._check(host)
        return f"ot{self.tag}{host}"

    def ip(self, host: str = ROOT) -> str:
        if host == ROOT:
            return f"{self.subnet}.1"
        self._check(host)
        return f"{self.subnet}.{self.names.index(host) + 2}"

    @property
    def root_ip(self) -> str:
        return self.ip(ROOT)

    def _check(self, host: str) -> None:
        if host not in self.names:
            raise KeyError(f"no namespace host {host!r} (have {self.names}; {ROOT!r} is root)")

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Hosts:
        sweep_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:  # also when the test body raised
        self.close()

    def _create(self) -> None:
        self.temp_root.mkdir(mode=0o755)
        _LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(_LOCK, "w") as lock:  # held until the bridge owns its subnet
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = set(re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.",
                                  _ip("-4", "-o", "addr", "show").stdout))
            free = [k for k in range(1, 255) if str(k) not in used]
            if not free:
                raise RuntimeError(f"no free {SUBNET}.x.0/24 subnet")
            k = min(free, key=lambda k: (k - os.getpid()) % 254)  # spread by pid
            self.subnet = f"{SUBNET}.{k}"
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.root_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.names:
            ns = self.ns(host)
            _ip("netns", "add", ns)
            _ip("link", "add", self.veth(host), "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("link", "set", self.veth(host), "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def close(self) -> None:
        # Links up first: a process killed while its host is cut off leaves orphaned TCP
        # sockets retransmitting FIN, which pin the (deleted) namespace and its veth for
        # minutes; with the link up they finish at once. The veths are deleted by name
        # anyway, so nothing visible outlives close() either way.
        for host in self.names:
            _ip("link", "set", self.veth(host), "up", check=False)
        for host in self.names:
            _kill_and_wait(_netns_pids(self.ns(host)))
        kill_ray_tree(self.temp_root, [n.session for n in self.ray_nodes])
        self.ray_nodes.clear()
        for host in self.names:
            _ip("link", "del", self.veth(host), check=False)
            _ip("netns", "del", self.ns(host), check=False)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.temp_root, ignore_errors=True)

    # -- running and breaking hosts ---------------------------------------------------
    def exec(self, host: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start `argv` inside the host's namespace (host "a" = root, plain Popen)."""
        prefix = [] if host == ROOT else ["ip", "netns", "exec", self.ns(host)]
        return subprocess.Popen([*prefix, *argv], **popen_kwargs)

    def down(self, host: str) -> None:
        """Cut the host off (its link down): its processes live on, unreachable."""
        _ip("link", "set", self.veth(host), "down")

    def up(self, host: str) -> None:
        _ip("link", "set", self.veth(host), "up")

    def kill(self, host: str) -> None:
        """SIGKILL every process in the host's namespace (a machine losing power)."""
        for _ in range(5):  # again, in case something forked meanwhile
            pids = _netns_pids(self.ns(host))
            if not pids:
                return
            _kill_and_wait(pids)
        raise RuntimeError(f"processes keep appearing in {self.ns(host)}")


# -- Ray ---------------------------------------------------------------------------------
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
