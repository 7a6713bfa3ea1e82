"""The engine process's end of the control plane: one ZeroMQ DEALER, plus a heartbeat.

The DEALER's identity is ``<replica id>@<incarnation>`` (omni/wire/protocol.py). Only the
main thread touches it: between steps it takes every queued message without blocking,
and blocks in recv only when the engine has no work, waking straight from it. During a
step libzmq's I/O thread keeps receiving into the socket's queue (bounded by
CONTROL_HWM), so a heavy inbound stream never waits behind a full kernel buffer.

Heartbeats go from a thread of their own on a second DEALER (identity + ``#hb``), so a
long step never looks like a dead engine. A thread can still be late on a loaded machine
(no CPU, no GIL), so two missed intervals only make the orchestrator ask whether the
replica is gone: its process state here, or whether this socket's connection still
answers libzmq's own heartbeats from elsewhere (omni/runtime/liveness.py). Those probes
arrive on this socket as empty messages, and the heartbeat thread discards them.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import zmq

from omni.wire.curve import CurveKeys, connect_curve
from omni.wire.protocol import (
    CONTROL_HWM,
    HEARTBEAT_SUFFIX,
    LINGER_MS,
    Heartbeat,
    Shutdown,
    check_address,
    decode_command,
    encode,
)

log = logging.getLogger("omni.engine")

# plain ints: pyzmq's flag enums cost an extra ~2 us per use, on every message
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class Channel:
    """Messages to and from the orchestrator; see the module doc."""

    def __init__(self, address: str, identity: bytes, replica_id: str,
                 heartbeat_s: float = 0.0, curve: CurveKeys | None = None) -> None:
        self.curve = curve  # a server on another host: CURVE client (omni/wire/curve.py)
        self.address = check_address(address, authenticated=curve is not None)
        self.context = zmq.Context(io_threads=1)
        self.sock = self._dealer(identity)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if heartbeat_s > 0:
            self._beat = threading.Thread(
                target=self._heartbeats, args=(identity + HEARTBEAT_SUFFIX, replica_id,
                                               heartbeat_s),
                daemon=True, name="heartbeat")
            self._beat.start()

    def _dealer(self, identity: bytes) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, CONTROL_HWM)
        sock.setsockopt(zmq.RCVHWM, CONTROL_HWM)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        if self.curve is not None:
            connect_curve(sock, self.curve)
        sock.connect(self.address)
        return sock

    def send(self, message: bytes) -> None:
        self.sock.send(message, copy=len(message) < 65536)

    def receive(self, block: bool, wait_s: float = 0.0) -> list[bytes]:
        """Every message queued now; waits for one first when ``block``, else up to
        ``wait_s`` seconds (an engine gathering a batch: nothing to step until then)."""
        sock, messages = self.sock, []
        if block:
            messages.append(sock.recv())
        elif wait_s > 0:
            sock.poll(math.ceil(wait_s * 1000))  # whole ms, rounded up: no early wake-up
        while sock.get(_EVENTS) & _POLLIN:  # cheaper than a raised zmq.Again
            messages.append(sock.recv(_NOBLOCK))
        return messages

    def say_dead(self, message: bytes, wait_s: float = LINGER_MS / 1000) -> None:
        """Send a DEAD notice and wait (bounded) until the orchestrator acknowledges it
        with SHUTDOWN, so the notice is read before the process's exit is seen."""
        self.sock.send(message)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                return
            try:
                command = decode_command(self.sock.recv(zmq.NOBLOCK))
            except Exception:  # noqa: BLE001 - anything else queued is moot now
                continue
            if isinstance(command, Shutdown):
                return

    def close(self) -> None:
        """Stop the heartbeat, flush what is queued (bounded by LINGER_MS), free all."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5.0)
            self._beat = None
        self.sock.close()
        self.context.term()

    def _heartbeats(self, identity: bytes, replica_id: str, interval_s: float) -> None:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, 4)  # a heartbeat that cannot go now is moot later
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            connect_curve(sock, self.curve)
        sock.connect(self.address)
        beat = encode(Heartbeat(replica_id))
        try:
            while True:
                try:
                    sock.send(beat, zmq.NOBLOCK)
                except zmq.Again:
                    pass
                while sock.get(_EVENTS) & _POLLIN:  # the orchestrator's link probes
                    sock.recv(_NOBLOCK)
                if self._stop.wait(interval_s):
                    return
        finally:
            sock.close()
