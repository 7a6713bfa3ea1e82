"""Several "hosts" on one machine: Linux network namespaces, one Ray node per host.

Used by tests/distributed and by `python -m bench distributed` (bench.netns). Needs root
and iproute2; `available()` says why not. By role: hosts.py (namespaces, the bridge,
cutting and killing a host), procs.py (the process table, killing process trees),
ray_nodes.py (a Ray node per host, a driver in the root namespace).

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

from bench.netns.hosts import ROOT, SUBNET, Hosts, available, sweep_stale
from bench.netns.procs import _proc_table, kill_ray_tree
from bench.netns.ray_nodes import (
    AUTH_MODE,
    FAST_DEATH_ENV,
    RayNode,
    driver,
    start_head,
    start_node,
    stop_node,
)

__all__ = ["AUTH_MODE", "FAST_DEATH_ENV", "ROOT", "SUBNET", "Hosts", "RayNode", "_proc_table",
           "available", "driver", "kill_ray_tree", "start_head", "start_node", "stop_node",
           "sweep_stale"]
