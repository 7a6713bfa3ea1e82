"""The zmq backend's producer side: the payload store and the data socket that serves it.

Wire (ROUTER here, one DEALER per consumer connector; one msgpack frame each way):
  request  ``[op, seq, nonce, key]``: op FETCH or RELEASE, seq numbers the consumer's fetches
  reply    ``[status, seq, detail]``, followed by the payload frame when status is OK; a
           payload over WHOLE_UP_TO (CURVE: over PART_BYTES) is sent as one such OK
           message per part of PART_BYTES, in order: a stream of messages, not one
           multipart message, which libzmq delivers only once all of it arrived (the
           consumer could not copy part k while part k+1 is on the wire, nor free it
           before the rest is allocated)
Every request is validated (``parse_request``); a malformed one is logged and dropped, never
answered, and no request, however odd, stops the server thread. Requests over 4 KiB make
libzmq drop the peer before Python sees them (MAXMSGSIZE). A FETCH whose nonce is not this
producer instance's is refused: the ref's producer died and another one got its port.

Why every payload is its own buffer (no arena): the payload frame is sent with
``copy=False``, so libzmq's I/O thread reads the memory *after* ``send`` returned. pyzmq
keeps a reference to the buffer object until libzmq's free callback says the send is done
(the Frame and pyzmq's garbage-collector thread hold it), so a RELEASE or ``cleanup`` that
arrives while a send is in flight only drops our reference, and the memory lives until the
send ends (a part's memoryview slice holds the buffer too); nothing is ever reused under
libzmq's feet. An arena would need a send tracker per payload before reusing blocks.
``capacity`` bounds the bytes held; a put that does not fit waits on the store's
Condition, which every release and cleanup notifies (no polling).
Bytes of a released payload whose send is still in flight are not counted.

Threads: put/cleanup run on callers' threads, FETCH/RELEASE on the server thread; the
store's Condition guards what they share. The server thread owns the ROUTER.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from omni.connector.base import ArenaFullError, ConnectorError
from omni.wire.curve import CurveKeys, Gatekeeper, serve_curve

__all__ = ["FETCH", "OK", "RELEASE", "DataServer", "Store", "parse_request"]

log = logging.getLogger("omni.connector.zmq")

FETCH, RELEASE = 1, 2  # request ops
OK, UNKNOWN, OTHER_PRODUCER = 0, 1, 2  # reply status
MAX_REQUEST_BYTES = 4096  # a request is ~100 bytes; a stranger's 1 GiB frame is not read
STOP_JOIN_S = 5.0
# Payloads over WHOLE_UP_TO bytes (CURVE: over PART_BYTES) go as a stream of PART_BYTES
# parts (zmq_recv.py says why). Measured with bench/probes/zmq_recv.py across the netns
# link on the 2-core dev VM, parts against one frame, the rows taking turns, 5 runs. Plain:
# 64 MiB 79-104% of a raw TCP copy against 59-69%, 32 MiB 115% against 56% (a frame over
# 32 MiB faults in), 2-24 MiB 5-47% faster on a quiet machine (8 and 16 MiB once ~20%
# slower while another process held a core: parts cost a copy, where a frame up to 32 MiB
# lands zero-copy in reused heap memory), 1 MiB the same, 512 KiB 21% slower. CURVE: 12%
# (1 MiB) to 3.8x (64 MiB) faster with 256 KiB parts: the two ends encrypt and decrypt part
# by part, at once; 512 KiB and 1 MiB parts overlap less, 128 KiB ones cost per message
# (64 MiB: 46% of raw against 56%). Parts of 128 KiB to 1 MiB are alike for plain.
PART_BYTES = 256 << 10
WHOLE_UP_TO = 1 << 20
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class Store:
    """The producer's payloads by key, bounded by ``capacity`` bytes. ``cond`` guards all of
    it (and ``stats``): put/cleanup run on callers' threads, fetch/release on the server's."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cond = threading.Condition()
        self.data: dict[str, tuple[str, int, Any]] = {}  # key -> (owner, nbytes, buffer)
        self.owners: dict[str, set[str]] = {}  # owner -> keys
        self.bytes = 0  # held, plus reserved by puts still copying
        self.stats = dict.fromkeys(("puts", "full_waits", "full_errors", "cleaned_up"), 0)

    def reserve(self, nbytes: int, owner: str, timeout_s: float) -> None:
        """Count ``nbytes`` as held, first waiting (bounded) for releases to make room."""
        if nbytes > self.capacity:
            raise ConnectorError(
                f"payload of {nbytes} bytes for {owner!r} is larger than the zmq connector's "
                f"whole capacity ({self.capacity} bytes); raise the connector capacity")
        with self.cond:
            if self.bytes + nbytes > self.capacity:
                self.stats["full_waits"] += 1
                if not self.cond.wait_for(lambda: self.bytes + nbytes <= self.capacity,
                                          max(0.0, timeout_s)):
                    self.stats["full_errors"] += 1
                    raise ArenaFullError(
                        f"zmq connector full for {timeout_s:g} s: payload of {nbytes} bytes "
                        f"for request {owner!r}; capacity {self.capacity} bytes, in use "
                        f"{self.bytes} bytes in {len(self.data)} payloads of "
                        f"{len(self.owners)} requests. Consumers are not releasing, or the "
                        f"capacity is too small for the traffic.")
            self.bytes += nbytes

    def unreserve(self, nbytes: int) -> None:
        with self.cond:
            self.bytes -= nbytes
            self.cond.notify_all()

    def add(self, key: str, owner: str, nbytes: int, buffer: Any) -> None:
        with self.cond:
            self.data[key] = (owner, nbytes, buffer)
            self.owners.setdefault(owner, set()).add(key)
            self.stats["puts"] += 1

    def lookup(self, key: str) -> Any:
        with self.cond:
            entry = self.data.get(key)
        return None if entry is None else entry[2]

    def drop(self, key: str) -> bool:
        with self.cond:
            entry = self.data.pop(key, None)
            if entry is None:
                return False
            owner, nbytes, _ = entry
            keys = self.owners[owner]
            keys.discard(key)
            if not keys:
                del self.owners[owner]
            self.bytes -= nbytes
            self.cond.notify_all()
            return True

    def drop_owner(self, owner: str) -> int:
        with self.cond:
            keys = list(self.owners.get(owner, ()))
            for key in keys:
                self.drop(key)  # the Condition's lock is re-entrant (an RLock)
            self.stats["cleaned_up"] += len(keys)
            return len(keys)

    def usage(self) -> dict[str, int]:
        with self.cond:
            return {"capacity_bytes": self.capacity, "payload_bytes": self.bytes,
                    "payloads_in_use": len(self.data), "owners": len(self.owners),
                    **self.stats}

    def clear(self) -> None:
        with self.cond:
            self.data.clear()
            self.owners.clear()
            self.bytes = 0
            self.cond.notify_all()


class DataServer:
    """The producer's ROUTER and the daemon thread that answers FETCH and RELEASE."""

    def __init__(self, context: zmq.Context, host: str, keys: CurveKeys | None,
                 store: Store, nonce: int) -> None:
        self.store, self.nonce = store, nonce
        self.encrypted = keys is not None
        self.fetches_served = self.releases_served = self.unknown = self.bad_requests = 0
        self.gatekeeper = Gatekeeper(context, keys) if keys is not None else None
        try:
            self.router = _bind(context, host, keys)
        except BaseException:
            if self.gatekeeper is not None:
                self.gatekeeper.stop()  # else context.term() would wait for it forever
            raise
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        # Failed handshakes, counted from the socket's events: the Gatekeeper sees only
        # peers with the right server key (others fail to decrypt before it is asked).
        self.refused = 0
        self._monitor = self.router.get_monitor_socket(HANDSHAKE_FAILED)
        stop_name = f"inproc://omni-zmq-stop-{secrets.token_hex(6)}"
        self._stop_rx = context.socket(zmq.PAIR)
        self._stop_rx.bind(stop_name)
        self._stop_tx = context.socket(zmq.PAIR)
        self._stop_tx.connect(stop_name)
        self._handlers = {FETCH: self._fetch, RELEASE: self._release}
        self.thread = threading.Thread(target=self._loop, name="omni-zmq-data", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._stop_rx, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while self._stop_rx not in (ready := dict(poller.poll())):
                try:
                    if self._monitor in ready:
                        self._count_refused()
                    if self.router in ready:
                        self._serve(self.router.recv_multipart())
                except Exception:  # a bug must not take the data plane down with it
                    log.exception("zmq data socket %s: request failed", self.endpoint)
        finally:
            self.router.disable_monitor()
            for sock in (self._monitor, self.router, self._stop_rx):
                sock.close()

    def _count_refused(self) -> None:
        recv_monitor_message(self._monitor)  # the mask lets only failed handshakes through
        self.refused += 1

    def _serve(self, frames: list[bytes]) -> None:
        request = parse_request(frames)
        if request is None:
            self.bad_requests += 1
            level = logging.WARNING if self.bad_requests <= 10 else logging.DEBUG
            log.log(level, "zmq data socket %s: dropped a malformed request (%d frames)",
                    self.endpoint, len(frames))
            return
        identity, op, seq, nonce, key = request
        if nonce != self.nonce:
            if op == FETCH:
                self._reply(identity, [OTHER_PRODUCER, seq, "ref of another producer "
                                       "instance (the one that published it is gone)"])
            return
        self._handlers[op](identity, seq, key)

    def _fetch(self, identity: bytes, seq: int, key: str) -> None:
        data = self.store.lookup(key)
        if data is None:
            self.unknown += 1
            self._reply(identity, [UNKNOWN, seq, "unknown payload (released, cleaned up or "
                                   "never published)"])
            return
        # copy=False: libzmq sends straight from the stored buffer, which pyzmq keeps
        # referenced (each part's memoryview holds it) until the send is done (module doc).
        header = msgpack.packb([OK, seq, ""])
        for part in parts(data, PART_BYTES if self.encrypted else WHOLE_UP_TO):
            if not self._send([identity, header, part]):
                return
        self.fetches_served += 1

    def _release(self, identity: bytes, seq: int, key: str) -> None:
        if self.store.drop(key):  # unknown: a late release after cleanup; nothing to do
            self.releases_served += 1

    def _reply(self, identity: bytes, header: list) -> bool:
        return self._send([identity, msgpack.packb(header)])

    def _send(self, frames: list) -> bool:
        try:
            self.router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:  # the consumer disconnected (it timed out, or died)
            log.debug("zmq data socket %s: reply dropped: %s", self.endpoint, exc)
            return False
        return True

    def stop(self) -> None:
        """Stop the thread (it closes the ROUTER), then the gatekeeper; before ctx.term()."""
        self._stop_tx.send(b"")
        self.thread.join(STOP_JOIN_S)
        self._stop_tx.close()
        if self.thread.is_alive():
            raise ConnectorError(f"zmq data socket {self.endpoint}: server thread did not "
                                 f"stop within {STOP_JOIN_S:g} s")
        if self.gatekeeper is not None:
            self.gatekeeper.stop()

    def health(self) -> dict[str, Any]:
        out = {"endpoint": self.endpoint, "fetches_served": self.fetches_served,
               "releases_served": self.releases_served, "unknown_fetches": self.unknown,
               "bad_requests": self.bad_requests, "refused_handshakes": self.refused}
        if self.gatekeeper is not None:
            out["refused_client_keys"] = self.gatekeeper.refused
        return out


def _bind(context: zmq.Context, host: str, keys: CurveKeys | None) -> zmq.Socket:
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone consumer: an error, not silence
    router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
    # no limit on queued parts: they reference stored payloads (no copies; with CURVE the
    # I/O thread encrypts one message at a time as it writes), and a large payload must not
    # fail halfway at the default 1000 messages
    router.setsockopt(zmq.SNDHWM, 0)
    if keys is not None:
        serve_curve(router, keys)
    try:
        router.bind(f"tcp://{host}:*")
    except zmq.ZMQError as exc:
        router.close()
        raise ConnectorError(f"cannot bind the zmq data socket on tcp://{host}:*: {exc} "
                             "(host must be an address of this machine that consumers "
                             "reach)") from None
    return router


def parts(data: Any, whole_up_to: int) -> list[Any]:
    """The stored buffer as the frames of its reply: itself up to ``whole_up_to`` bytes,
    else memoryview slices of PART_BYTES (the last one shorter)."""
    view = memoryview(data)
    if view.nbytes <= whole_up_to:
        return [data]
    return [view[i:i + PART_BYTES] for i in range(0, view.nbytes, PART_BYTES)]


def parse_request(frames: list[bytes]) -> tuple[bytes, int, int, int, str] | None:
    """``(identity, op, seq, nonce, key)`` of a well-formed request, else None."""
    if len(frames) != 2:
        return None
    try:
        msg = msgpack.unpackb(frames[1], raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not (isinstance(msg, list) and len(msg) == 4):
        return None
    op, seq, nonce, key = msg
    if op not in (FETCH, RELEASE) or type(seq) is not int or type(nonce) is not int \
            or not isinstance(key, str):
        return None
    return frames[0], op, seq, nonce, key
