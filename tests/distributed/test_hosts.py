"""The netns harness itself: namespaces reach each other and the root, Ray nodes per host,
an actor pinned to a host connects back to the root and dies with its host.

Skipped where namespaces cannot be made (not root, no iproute2): see netns.available().
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from bench import netns
from bench.netns import Hosts, RayNode, _proc_table, driver, start_head, start_node

_OK, _WHY = netns.available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

# An upper-casing echo server on port 7000 of the given address, and a client; both run
# inside namespaces through Hosts.exec, so they are separate processes by design.
SERVER = """import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.recv(64).upper()); c.close()
"""
CLIENT = """import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
c.sendall(sys.argv[3].encode()); print(c.recv(64).decode())
"""


def _client(hosts: Hosts, host: str, ip: str, port: int, word: str,
            timeout: float = 5.0) -> subprocess.CompletedProcess:
    proc = hosts.exec(host, [sys.executable, "-c", CLIENT, ip, str(port), word, str(timeout)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _listener(ip: str) -> socket.socket:
    sock = socket.create_server((ip, 0))
    sock.settimeout(30)
    return sock


def _visible(hosts: Hosts) -> list[str]:
    """Our namespaces, links and processes still visible on the machine."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                      text=True).stdout)
    left = [line.split()[0] for line in names.splitlines() if hosts.tag in line]
    left += [link["ifname"] for link in links if link["ifname"].startswith(f"ot{hosts.tag}")]
    left += [f"pid {pid}: {cmd[:80]}" for pid, (_, _, cmd) in _proc_table().items()
             if str(hosts.temp_root) in cmd]
    left += [str(hosts.temp_root)] if hosts.temp_root.exists() else []
    return left


def test_namespaces_reach_root_and_each_other():
    with Hosts(2) as hosts:
        server = hosts.exec("b", [sys.executable, "-c", SERVER, hosts.ip("b")],
                            stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        # c -> b (namespace to namespace, across the bridge)
        got = _client(hosts, "c", hosts.ip("b"), 7000, "from-c")
        assert got.stdout.strip() == "FROM-C", got.stderr
        # root -> b
        with socket.create_connection((hosts.ip("b"), 7000), timeout=5) as conn:
            conn.sendall(b"from-a")
            assert conn.recv(64) == b"FROM-A"
        # b and c -> root (how a remote engine reaches the orchestrator)
        with _listener(hosts.root_ip) as listener:
            port = listener.getsockname()[1]
            for host in hosts.names:
                client = hosts.exec(host, [sys.executable, "-c", CLIENT, hosts.root_ip,
                                           str(port), f"hi-{host}", "5"],
                                    stdout=subprocess.PIPE, text=True)
                conn, (peer, _) = listener.accept()
                with conn:
                    assert peer == hosts.ip(host)
                    assert conn.recv(64) == f"hi-{host}".encode()
                    conn.sendall(b"ok")
                assert client.communicate(timeout=10)[0].strip() == "ok"
        # down(c): c can no longer reach b; b still reaches root... and c again after up()
        hosts.down("c")
        got = _client(hosts, "c", hosts.ip("b"), 7000, "x", timeout=1.0)
        assert got.returncode != 0, got.stdout
        hosts.up("c")
        assert _client(hosts, "c", hosts.ip("b"), 7000, "back").stdout.strip() == "BACK"
        hosts.kill("b")  # the server: kill() empties the namespace
        assert server.wait(timeout=5) == -9
        assert _client(hosts, "c", hosts.ip("b"), 7000, "x").returncode != 0
        assert _visible(hosts)  # sanity: the check below sees things while they exist
    assert _visible(hosts) == []


def _probe_class(ray):
    # Defined inside a function: cloudpickle then ships the class by value; the worker
    # in namespace b could not import this test module by name.
    @ray.remote(num_cpus=0)
    class Probe:
        def node_ip(self):
            return ray.util.get_node_ip_address()

        def connect_back(self, ip, port):
            with socket.create_connection((ip, port), timeout=10) as conn:
                conn.sendall(b"engine-up")
                return conn.recv(16)

        def sleep(self, seconds):
            time.sleep(seconds)

    return Probe


def _wait_nodes(ray, count: int, *, alive: bool = True, timeout: float = 30.0) -> None:
    """Until `count` nodes are alive (alive=True), or at most `count` (alive=False)."""
    deadline = time.monotonic() + timeout
    while (sum(n["Alive"] for n in ray.nodes()) < count) if alive else (
            sum(n["Alive"] for n in ray.nodes()) > count):
        assert time.monotonic() < deadline, ray.nodes()
        time.sleep(0.05)


@pytest.mark.parametrize("cut", ["kill", "down"])
def test_actor_on_host_b_reports_its_address_and_dies_with_it(cut):
    pytest.importorskip("ray")
    with Hosts(1) as hosts:
        head = start_head(hosts)
        node: RayNode = start_node(hosts, "b")
        sessions = [head.session, node.session]
        started = time.monotonic()
        with driver(head) as ray:
            print(f"\nray start: head {head.startup_s:.1f} s, node b {node.startup_s:.1f} s;"
                  f" ray.init {time.monotonic() - started:.1f} s")
            _wait_nodes(ray, 2)
            print(f"idle RSS: head {head.rss_mb():.0f} MB, node b {node.rss_mb():.0f} MB")

            probe = _probe_class(ray).options(resources={"host_b": 0.01}).remote()
            assert ray.get(probe.node_ip.remote(), timeout=60) == hosts.ip("b")
            with _listener(hosts.root_ip) as listener:
                reply = probe.connect_back.remote(hosts.root_ip, listener.getsockname()[1])
                conn, (peer, _) = listener.accept()
                with conn:
                    assert peer == hosts.ip("b")
                    assert conn.recv(16) == b"engine-up"
                    conn.sendall(b"welcome")
                assert ray.get(reply, timeout=30) == b"welcome"

            pending = probe.sleep.remote(600)
            assert ray.wait([pending], timeout=0.5)[1] == [pending]  # running, not done
            cut_at = time.monotonic()
            getattr(hosts, cut)("b")
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(pending, timeout=30)
            noticed = time.monotonic() - cut_at
            _wait_nodes(ray, 1, alive=False)
            dead = time.monotonic() - cut_at
            print(f"{cut}(b): the driver saw the actor die after {noticed:.2f} s,"
                  f" node b declared dead after {dead:.2f} s")
            assert dead < 15  # ~1.5 s (killed) / ~4.5 s (cut off) with FAST_DEATH_ENV
    assert _visible(hosts) == []
    assert not [p for p, (_, sid, cmd) in _proc_table().items()
                if sid in sessions and "ray" in cmd]
