"""Hosts as network namespaces: one bridge in the root namespace (host A), a namespace per
other host joined by its veth pair; making, cutting off, killing and sweeping them (the
topology and naming are in bench/netns/__init__.py)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from bench.netns.procs import _kill_and_wait, _pid_alive, kill_ray_tree

if TYPE_CHECKING:
    from bench.netns.ray_nodes import RayNode

ROOT = "a"  # the root namespace is host A
SUBNET = "10.213"
_NS_RE = re.compile(r"^omni-t(\d+)-\d+-\w+$")
_LINK_RE = re.compile(r"^ot(\d+)-\d+\w+$")
_DIR_RE = re.compile(r"^omni-t(\d+)-\d+$")
_LOCK = Path("/run/lock/omni-netns.lock")
_seq = 0


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
