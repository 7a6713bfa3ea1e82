"""Every open WebSocket session of the server, so that stopping it closes them properly.

On SIGTERM (omni/server.py's drain) ``OpenSockets.drain``: new upgrades get HTTP 503
``shutting_down`` before the upgrade (what openpi-client and the OpenAI SDK report as an
invalid status); a socket whose client waits on an answer (an OpenPI infer, a realtime
response) keeps it until it is sent or the drain deadline passes; then every socket is
closed with 1001 (going away) and a reason, at once for idle ones. Without this, the
sockets stayed open until aiohttp's shutdown cancelled their handlers, seconds later, and
clients saw the connection drop without a close frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

from aiohttp import WSCloseCode, web

from omni.errors import ShuttingDownError

log = logging.getLogger("omni.api.sockets")
GOING_AWAY_REASON = b"server shutting down"
# how long a client has to answer our close frame (aiohttp waits 10 s by default): one
# that does not answer by then is cut, the server does not wait on it
CLOSE_ANSWER_S = 2.0


class SocketWork:
    """One socket's in-flight work: what a drain lets finish before it closes the socket."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.going_away = False  # the server closes it: its session ends, no resume
        self._busy = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def begin(self) -> None:
        """Work whose answer the client waits for has started; `end` when it is sent."""
        self._busy += 1
        self.idle.clear()

    def end(self) -> None:
        self._busy -= 1
        if not self._busy:
            self.idle.set()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    async def close_going_away(self, deadline: float) -> None:
        """Wait (until ``deadline``, loop time) for the work in flight, then close 1001."""
        self.going_away = True
        loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), max(0.0, deadline - loop.time()))
        if self.ws.closed:
            return
        with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
            await asyncio.wait_for(self.ws.close(code=WSCloseCode.GOING_AWAY,
                                                 message=GOING_AWAY_REASON), CLOSE_ANSWER_S)


class OpenSockets:
    """The app's WebSocket sessions (see the module doc)."""

    def __init__(self) -> None:
        self.draining = False
        self._open: set[SocketWork] = set()
        self._late: set[asyncio.Task] = set()  # closes of sockets held after the drain began

    def admit(self) -> None:
        """Before an upgrade: a draining server takes no new session (503)."""
        if self.draining:
            raise ShuttingDownError("server is shutting down; not accepting new WebSocket "
                                    "sessions (reconnect shortly)")

    @contextlib.asynccontextmanager
    async def hold(self, work: SocketWork) -> AsyncIterator[SocketWork]:
        """While a handler serves its socket: a drain starting meanwhile closes it."""
        self._open.add(work)
        if self.draining:  # admitted just before the drain, upgraded after it began
            task = asyncio.ensure_future(work.close_going_away(asyncio.get_running_loop().time()))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
        try:
            yield work
        finally:
            self._open.discard(work)

    async def drain(self, timeout_s: float) -> None:
        self.draining = True
        if not self._open:
            return
        log.info("closing %d WebSocket sessions (1001 going away)", len(self._open))
        deadline = asyncio.get_running_loop().time() + timeout_s
        await asyncio.gather(*(work.close_going_away(deadline) for work in list(self._open)))


SOCKETS_KEY = web.AppKey("sockets", OpenSockets)
