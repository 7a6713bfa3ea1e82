"""EngineGroup's teardown: SHUTDOWN, bounded waits, then terminate and kill; free all.

A mixin of omni/runtime/launcher.py's EngineGroup, kept apart to keep that file short;
it uses the group's replicas, exits, routers and launch names.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Any

from omni.runtime.leftovers import unlink_arenas
from omni.wire.protocol import Shutdown, encode

log = logging.getLogger("omni.runtime.launcher")


class Teardown:
    replicas: dict[str, Any]
    _exits: dict[str, asyncio.Future]

    async def stop(self, timeout_s: float = 5.0) -> None:
        """SHUTDOWN every live replica, wait, then terminate/kill stragglers; free all."""
        self.stopping = True
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        for replica in self.replicas.values():
            if replica.alive:
                self.try_send(replica, encode(Shutdown()))
            elif replica.process is not None and not (
                    self._exits[replica.replica_id].done() or replica.exit_reason):
                replica.process.terminate()  # still loading: nothing to drain
            replica.alive = False
        await self._wait_exits(timeout_s, "terminate")
        await self._wait_exits(2.0, "kill")
        await self._wait_exits(2.0, None)
        self._close()

    async def _wait_exits(self, timeout_s: float, then: str | None) -> None:
        running = [f for f in self._exits.values() if not f.done()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for replica in self.replicas.values():
            exited = self._exits.get(replica.replica_id)
            if then and exited is not None and not exited.done():
                log.warning("replica %s did not exit; %s", replica.replica_id, then)
                getattr(replica.process, then)()

    def _close(self) -> None:
        for replica in self.replicas.values():
            exited = self._exits.get(replica.replica_id)
            if exited is not None and not exited.done():
                self.loop.remove_reader(replica.process.sentinel)
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.remote is not None:
            self.remote.close()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        unlink_arenas(self.arena_prefix + "-")
