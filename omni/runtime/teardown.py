"""How one launch of a pipeline's engines ends: SHUTDOWN, bounded waits, then terminate
and kill; free all.

The order is fixed: SHUTDOWN to every live replica (one still loading is terminated: it
has nothing to drain), bounded waits for the exits (then terminate, then kill the
stragglers), the sentinels unwatched, the control sockets closed, then the launch's IPC
directory and shared-memory arenas removed. EngineGroup (launcher.py) holds one and
hands it, at stop(), what it owns at that time: its replicas, how to send to one, its
sockets.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from omni.runtime.leftovers import unlink_arenas
from omni.runtime.pool import Replica
from omni.wire.protocol import Shutdown, encode

log = logging.getLogger("omni.runtime.launcher")


class Closable(Protocol):
    def close(self) -> None: ...


class Teardown:
    """Ends one launch: its replicas' processes first, then what the launch made."""

    def __init__(self, exits: Mapping[str, asyncio.Future], ipc_dir: str,
                 arena_prefix: str) -> None:
        self.exits = exits  # replica id -> its process's exit code, once its sentinel fired
        self.ipc_dir = ipc_dir
        self.arena_prefix = arena_prefix

    async def run(self, replicas: Mapping[str, Replica], send: Callable[[Replica, bytes], bool],
                  sockets: Iterable[Closable], timeout_s: float) -> None:
        """SHUTDOWN every live replica, wait, then terminate/kill stragglers; free all."""
        for replica in replicas.values():
            if replica.alive:
                send(replica, encode(Shutdown()))
            elif replica.process is not None and not (
                    self.exits[replica.replica_id].done() or replica.exit_reason):
                replica.process.terminate()  # still loading: nothing to drain
            replica.alive = False
        await self._wait_exits(replicas, timeout_s, "terminate")
        await self._wait_exits(replicas, 2.0, "kill")
        await self._wait_exits(replicas, 2.0, None)
        self._free(replicas, sockets)

    async def _wait_exits(self, replicas: Mapping[str, Replica], timeout_s: float,
                          then: str | None) -> None:
        running = [f for f in self.exits.values() if not f.done()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for replica in replicas.values():
            exited = self.exits.get(replica.replica_id)
            if then and exited is not None and not exited.done():
                log.warning("replica %s did not exit; %s", replica.replica_id, then)
                getattr(replica.process, then)()

    def _free(self, replicas: Mapping[str, Replica], sockets: Iterable[Closable]) -> None:
        loop = asyncio.get_running_loop()  # the group's: it watches the sentinels and runs this
        for replica in replicas.values():
            exited = self.exits.get(replica.replica_id)
            if exited is not None and not exited.done():
                loop.remove_reader(replica.process.sentinel)
        for socket in sockets:
            socket.close()
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        unlink_arenas(self.arena_prefix + "-")
