"""The Ray actor that runs one replica's engine process on a node of the cluster.

Imported only by omni/runtime/placement.py (which imports ray first) and by Ray's
workers, which import it by name: every node needs omni installed (the same version).

The engine runs in a child process of the actor, not in the actor itself: the engine
process owns its exit (os._exit after SHUTDOWN, a death notice on failure) and its
signals, which a Ray worker must keep; the actor only reports the child's exit code.
The child watches its parent (run_engine_process's parent watch), so when Ray kills the
actor, or the actor's node goes down, the engine ends with it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing

import ray

from omni.engines.proc import run_engine_process


@ray.remote(max_concurrency=1)
class EngineHost:
    def run(self, spec) -> int:  # noqa: ANN001 - an EngineSpec, pickled by Ray
        """Start the engine here and wait for it; returns its exit code."""
        node_ip = ray.util.get_node_ip_address()
        # this node's producers serve their payloads on this node's address
        spec = dataclasses.replace(spec, node=node_ip, payload_options={
            **spec.payload_options, "host": node_ip})
        process = multiprocessing.get_context("spawn").Process(
            target=run_engine_process, args=(spec,), name=f"omni-{spec.replica_id}")
        process.start()
        process.join()
        return process.exitcode
