"""The orchestrator's end of the control plane: one ZeroMQ ROUTER per pipeline.

Every replica connects a DEALER named ``<replica id>@<incarnation>`` (omni/wire/protocol.py);
this class knows nothing of replicas beyond those identity bytes: it binds, receives
``(identity, message)`` pairs for its owner (the launcher), and sends to an identity.

Receiving runs on the event loop's own reader for the socket's file descriptor, which
is what zmq.asyncio does underneath, minus a future and a task wake-up per message: on
a 2-core VM each loop iteration is tens of microseconds, and every hop pays it. The
descriptor is edge-triggered (it signals "the socket's state changed", and reading
``EVENTS`` re-arms it), so a reader drains until nothing is left, and a send, which can
consume that signal, checks for pending input and schedules a drain itself.

A router for replicas on other hosts is a CURVE server (omni/wire/curve.py): it binds a
routable tcp:// address and admits only peers holding the launch's client key.

Sends never block the loop and never drop silently: ``ROUTER_MANDATORY`` turns a send to
an identity that is not connected into EHOSTUNREACH, and a send past the peer's
high-water mark into EAGAIN; both raise ``PeerUnreachableError`` for the caller to
handle (fail the requests bound there).

A router that replicas reach from elsewhere (other hosts, or processes this server did
not start) runs ZMTP heartbeats (``link_heartbeat_s``): libzmq's I/O thread pings every
connection and closes one whose peer stays silent (within two intervals), which drops the
peer's routing id; ``reaches`` asks whether an identity is still routable. That is how
a remote replica's liveness is judged without its Python (omni/runtime/liveness.py). A
router of local children runs none: their process state is the truth there, and a link
closed under a merely starved child would lose the messages queued on it. (A pipeline with
`launch: external` stages has one router for all its replicas, so its local children are
pinged too; their libzmq threads answer without the GIL, so only a child whose threads
get no CPU for 1.5 intervals would lose its link. Not split yet: a known limit.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

from omni.wire.curve import CurveKeys, Gatekeeper, serve_curve
from omni.wire.protocol import CONTROL_HWM, check_address

log = logging.getLogger("omni.runtime.control")

MessageHandler = Callable[[bytes, bytes], None]

# plain ints: pyzmq's flag enums cost an extra ~2 us per use, on every hop
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)


class PeerUnreachableError(ConnectionError):
    """A control message could not be queued for its peer (gone, or its queue is full)."""


class BindError(OSError):
    """The control socket cannot listen at its address."""


class ControlRouter:
    """Bind, receive on the loop, send by identity; see the module doc."""

    def __init__(self, address: str, on_message: MessageHandler,
                 curve: CurveKeys | None = None, link_heartbeat_s: float = 0.0) -> None:
        self.on_message = on_message
        self.context = zmq.Context(io_threads=1)
        self.gatekeeper = Gatekeeper(self.context, curve) if curve is not None else None
        self.sock = self.context.socket(zmq.ROUTER)
        if curve is not None:
            serve_curve(self.sock, curve)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, CONTROL_HWM)
        self.sock.setsockopt(zmq.RCVHWM, CONTROL_HWM)
        self.sock.setsockopt(zmq.LINGER, 0)  # at close every peer is gone or being killed
        if link_heartbeat_s > 0:
            watch_links(self.sock, link_heartbeat_s)
        try:
            self.sock.bind(check_address(address, authenticated=curve is not None))
        except zmq.ZMQError as exc:  # e.g. a tcp port in use: nothing of ours stays open
            self._close_context()
            raise BindError(f"cannot bind the control socket to {address}: {exc}") from exc
        # what engines connect to: a tcp port given as * is the one the OS picked
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._fd = self.sock.getsockopt(zmq.FD)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_pending = False
        self._draining = False  # inside drain(): its loop looks at EVENTS after each message

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._fd, self.drain)

    def drain(self) -> None:
        """Hand every message queued now to the handler (also called by the launcher to
        read what a replica sent before its process ended)."""
        self._drain_pending = False
        sock = self.sock
        if sock.closed:  # a drain scheduled by a send just before close
            return
        # EVENTS, not recv until zmq.Again: it re-arms the descriptor's signal too, and
        # costs half of a raised Again (2.5 vs 5.6 us on the 2-core VM)
        self._draining = True
        try:
            while sock.get(_EVENTS) & _POLLIN:
                frames = sock.recv_multipart(_NOBLOCK)
                if len(frames) != 2:  # a DEALER sends one frame; the ROUTER adds the identity
                    log.error("dropping a control message of %d frames from %r",
                              len(frames) - 1, frames[0][:64])
                    continue
                self.on_message(frames[0], frames[1])
        finally:
            self._draining = False

    def send(self, identity: bytes, message: bytes) -> None:
        try:
            # two sends, not send_multipart: the same frames without its per-frame checks;
            # with ROUTER_MANDATORY the identity frame is where an unknown peer raises
            self.sock.send(identity, _NOBLOCK | _SNDMORE)
            self.sock.send(message, _NOBLOCK, copy=len(message) < 65536)
        except zmq.Again as exc:
            raise PeerUnreachableError(
                f"{identity.decode(errors='replace')} has {CONTROL_HWM} control messages "
                "queued and takes no more") from exc
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerUnreachableError(
                    f"{identity.decode(errors='replace')} is not connected") from exc
            raise
        finally:
            self._after_send()

    def reaches(self, identity: bytes) -> bool:
        """Whether a peer of this identity is connected now (an empty frame to it is
        queued; with ROUTER_MANDATORY an unknown identity raises EHOSTUNREACH). The
        heartbeat socket that such a probe reaches discards it (channel.py)."""
        try:
            self.send(identity, b"")
        except PeerUnreachableError as exc:
            return isinstance(exc.__cause__, zmq.Again)  # its queue is full: connected
        return True

    def _after_send(self) -> None:
        """A send may have consumed the descriptor's signal of input: look, and drain on
        the next loop iteration if something waits (never inside a caller's handler).
        A send made while drain() runs needs no look: drain's loop reads EVENTS next."""
        if (not self._draining and not self._drain_pending and self._loop is not None
                and self.sock.get(_EVENTS) & _POLLIN):
            self._drain_pending = True
            self._loop.call_soon(self.drain)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None
        self._close_context()

    def _close_context(self) -> None:
        self.sock.close(linger=0)
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
        self.context.term()


def watch_links(sock: zmq.Socket, interval_s: float) -> None:
    """ZMTP heartbeats on a socket: a PING every half interval, and a connection whose
    peer has sent nothing (no PONG, no message) for 1.5 intervals after a PING is closed:
    a dead link is gone within two intervals of its last word, by the check that finds
    its app heartbeats two intervals late (the timing of the old silence rule). The
    peer's libzmq I/O thread answers PINGs by itself, without the GIL, so 1.5 intervals
    (3 s by default) is all a native thread needs on a loaded host."""
    interval_ms = max(2, round(interval_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, interval_ms // 2)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, interval_ms * 3 // 2)
