"""The engine process's end of its control connection: framed messages in and out.

Between steps the engine's main thread reads the socket itself: an idle engine wakes
straight from recv, with no thread hand-off on the hop (omni/engines/proc.py says why that
matters). While a step runs, nobody on the main thread reads, and a Unix stream socket
holds only its sender's buffer (about 208 KiB by default, and an unprivileged process
cannot raise it past net.core.wmem_max): a stage fed more than that per step, such as a
talker that gets a hidden-state row of 8 KiB per request every thinker step, 32 requests
at a time, then receives one buffer per step, falls further behind every step, and its
inputs wait seconds behind steps that each took milliseconds (on an H200, 19.5 s on
average for the talker's last input at concurrency 32:
bench/results/omni-h200-c32-stream.md; bench/results/channel-lag.md reproduces it). So
during steps a drainer thread moves whatever arrives into an inbox, as libzmq's I/O thread
would; its recv runs without the GIL.

The drainer is engaged for a step only when at least ENGAGE_BYTES came in since the last
step began: a stage fed a few small messages per step (most of them) never wakes it, and
its idle receive() is the plain blocking recv of before. After an engaged step the
drainer is told to park, so the main thread is again the socket's only reader.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading

from omni.protocol import FrameReader, frame

RECV_BYTES = 1 << 20
# inbound bytes per step from which the drainer reads during the next step: a quarter of
# Linux's default socket buffer (212,992 bytes), well before the sender could be held up
ENGAGE_BYTES = 64 * 1024


class OrchestratorGone(Exception):
    """The orchestrator closed the connection: nobody is left to serve."""


class Channel:
    """Framed messages over the engine's control socket; see the module doc."""

    def __init__(self, sock: socket.socket, drainer: bool = True) -> None:
        """drainer=False: never read during steps (process option inbound_drainer), to
        measure what the drainer buys."""
        self.sock = sock
        self._engage_bytes = ENGAGE_BYTES if drainer else float("inf")
        self.reader = FrameReader()
        self._lock = threading.Lock()  # one reader of the socket (and the FrameReader)
        self._inbox: list[bytes] = []
        self._gone = False
        self._failure: Exception | None = None  # a framing error met by the drainer
        self._recent_bytes = 0  # read since the last step began, by either thread
        self._engaged = False  # the drainer reads during the current step
        self._stepping = threading.Event()
        self._parked = False  # the drainer waits for a step: it cannot be reading
        # the drainer's late finds (read as a step ended) wake a receive() in select;
        # park: the end of an engaged step; stop: close()
        self._late_r, self._late_w = os.pipe()
        self._park_r, self._park_w = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        for fd in (self._late_r, self._late_w, self._park_r, self._park_w):
            os.set_blocking(fd, False)  # a full pipe already says "look again"
        self._drainer: threading.Thread | None = threading.Thread(
            target=self._drain_during_steps, daemon=True, name="channel-drain")
        self._drainer.start()

    def close(self) -> None:
        """Stop the drainer and free its pipes (the socket is the caller's to close);
        a second call does nothing."""
        if self._drainer is None:
            return
        self._gone = True
        self._stepping.set()  # let a waiting drainer see that it is over
        os.write(self._stop_w, b"!")
        self._drainer.join(timeout=5.0)
        for fd in (self._late_r, self._late_w, self._park_r, self._park_w, self._stop_r,
                   self._stop_w):
            os.close(fd)
        self._drainer = None

    def send(self, message: bytes) -> None:
        self.sock.sendall(frame(message))

    def step_begins(self) -> None:
        """The engine starts a step: engage the drainer if the inbound stream is heavy."""
        self._engaged, self._recent_bytes = self._recent_bytes >= self._engage_bytes, 0
        if self._engaged:
            self._stepping.set()

    def step_ends(self) -> None:
        if self._engaged:
            self._stepping.clear()
            _poke(self._park_w)

    def receive(self, block: bool) -> list[bytes]:
        """Every complete message available now; waits for one only when ``block``."""
        while True:
            with self._lock:
                direct = block and self._parked and not self._inbox and not self._gone
            if direct:  # nobody else can read: wait in recv itself, as a lone reader does
                data = self.sock.recv(RECV_BYTES)
                with self._lock:
                    self._take(data)
            with self._lock:
                self._read_available()
                messages, self._inbox = self._inbox, []
            if messages:
                return messages
            if self._failure is not None:
                raise self._failure
            if self._gone:
                raise OrchestratorGone()
            if not block:
                return []
            if direct:
                continue  # only part of a message came: wait in recv again
            readable, _, _ = select.select([self.sock, self._late_r], [], [])
            if self._late_r in readable:
                _drain_pipe(self._late_r)

    def _take(self, data: bytes) -> bool:
        """Frame what recv returned (caller holds the lock); False at end of stream."""
        if not data:
            self._gone = True
            return False
        self._inbox += self.reader.feed(data)
        self._recent_bytes += len(data)
        return True

    def _read_available(self) -> bool:
        """Read what the socket holds now into the inbox (caller holds the lock)."""
        got = False
        while not self._gone:
            try:
                data = self.sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            got = self._take(data) or got
        return got

    def _drain_during_steps(self) -> None:
        try:
            while not self._gone:
                with self._lock:
                    self._parked = not self._stepping.is_set()
                self._stepping.wait()
                with self._lock:
                    self._parked = False
                readable, _, _ = select.select([self.sock, self._park_r, self._stop_r],
                                               [], [])
                if self._stop_r in readable:
                    return
                if self._park_r in readable:
                    _drain_pipe(self._park_r)
                if self.sock in readable:
                    with self._lock:
                        got = self._read_available()
                        late = got and not self._stepping.is_set()
                    if late:  # the main thread may already wait in select: wake it
                        _poke(self._late_w)
        except Exception as exc:  # a bad frame or a closed socket: the main thread raises
            self._failure = exc
            _poke(self._late_w)


def _poke(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(fd, b"!")


def _drain_pipe(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.read(fd, 4096)
