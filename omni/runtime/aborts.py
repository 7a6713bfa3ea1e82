"""Consumer-acknowledged aborts: an aborted request's payloads are freed only after every
replica that could read them has let go.

Before, ABORT went to every replica a request touched at once, and each producer freed
the request's shared-memory blocks on receipt. A consumer still inside a step (or with an
input message queued before the ABORT) could then read a block the producer had already
re-used for another request. Now:

    orchestrator ── Abort([id]) ──► every live replica the request was bound to
    each replica: the engine drops the request, forgets the views it received (no
        release), and answers AbortAck([id])
    when every one of them has answered (or died: a dead process reads nothing)
    orchestrator ── Free([id]) ──► the same replicas: each frees what it produced for id

Messages on one ROUTER/DEALER pair keep their order, so nothing the orchestrator sent a
replica before the ABORT (an APPEND carrying a ref) can reach it after its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni.runtime.pool import Replica
from omni.wire.protocol import Abort, Free, encode


class AbortFences:
    """Per aborted request: the replicas that have not answered its Abort yet."""

    def __init__(self, send: Callable[[Replica, bytes], Any],
                 on_freed: Callable[[str], None] = lambda engine_id: None) -> None:
        self._send = send  # sends unless the peer is gone (EngineSet.try_send)
        self._on_freed = on_freed  # the front end's own payloads of it (request media)
        self._waiting: dict[str, tuple[set[str], list[Replica]]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def abort(self, engine_id: str, replicas: list[Replica]) -> None:
        """Send ABORT to these replicas; FREE follows once they have all answered."""
        message = encode(Abort([engine_id]))
        sent = [r for r in replicas if r.alive and self._send(r, message)]
        if sent:
            self._waiting[engine_id] = ({r.replica_id for r in sent}, sent)
        else:  # nothing runs it any more (a request that ended well comes here too)
            self._on_freed(engine_id)

    def answered(self, replica: Replica, engine_ids: list[str]) -> None:
        """A replica's AbortAck."""
        for engine_id in engine_ids:
            self._let_go(engine_id, replica.replica_id)

    def died(self, replica: Replica) -> None:
        """A dead replica reads nothing: it no longer holds back any request's FREE."""
        for engine_id in list(self._waiting):
            self._let_go(engine_id, replica.replica_id)

    def _let_go(self, engine_id: str, replica_id: str) -> None:
        entry = self._waiting.get(engine_id)
        if entry is None:
            return
        waiting, replicas = entry
        waiting.discard(replica_id)
        if waiting:
            return
        del self._waiting[engine_id]
        message = encode(Free([engine_id]))
        for replica in replicas:
            if replica.alive:
                self._send(replica, message)
        self._on_freed(engine_id)
