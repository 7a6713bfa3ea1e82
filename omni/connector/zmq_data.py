"""zmq backend: payloads fetched by consumers on any host from the producer's data socket.

Pull model. ``put`` copies the payload once into memory this connector owns and returns a
ref ``[endpoint, nonce]``: the producer's ROUTER (``tcp://HOST:PORT``, port picked by the
OS on the first put) and a random 63-bit number naming this producer instance. ``get``
sends FETCH(key) there and waits for the payload: one frame, or a stream of 256 KiB parts
for one over 1 MiB (with CURVE over 256 KiB; zmq_server.py, zmq_recv.py say why). Why pull: refs travel through the control plane
and the producer does not know which host will read a payload, or when; the consumer asks
when it needs the bytes, they cross the network once, producer to consumer, and a payload
nobody reads costs no transfer. RELEASE(key) is a message (no memory is shared across
hosts), sent without blocking so a consumer never waits on a producer. The producer side
(store, data socket, wire format, why zero-copy sends are safe) is in zmq_server.py.

Consumer. ``get`` returns a tensor that views memory this consumer alone owns: the received
message itself for a one-frame payload (``torch.frombuffer`` on the frame, which keeps it
alive; libzmq read it from TCP into its own allocation and never touches it again), or a
buffer of the receive pool (``recv_pool_bytes``, zmq_recv.py) the parts were copied into.
Either way the tensor is writable and, unlike shm's views, stays valid after ``release``
and ``close``, for as long as anything references it: a pooled buffer is recycled only
once the last tensor sharing its memory is gone, never on ``release``. A payload small
enough to share libzmq's 8 KiB receive batch may start at an address not aligned for its
dtype; those are copied. Bytes payloads come back as ``bytes``.

Timeouts. Every fetch is bounded by ``fetch_timeout_s``: a producer that is gone,
unreachable or refuses our CURVE keys gives ConnectorError naming endpoint and key, never a
hang. After a timeout the endpoint's socket is closed (it would keep reconnecting to a dead
peer and hold what it queued); a late reply to an earlier fetch is discarded by its number.
A reply longer than the ref's ``nbytes``, an empty part or an error status gives
ConnectorError; a failed fetch returns its pooled buffer at once.

CURVE (``curve``: ``CurveKeys.to_dict()``): the ROUTER is a CURVE server whose context runs a
Gatekeeper admitting only the set's client key; every consumer DEALER is a CURVE client.
The consumer side is for one thread at a time; put/cleanup may run on any thread.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import threading
import time
from typing import Any

import msgpack
import torch
import zmq

from omni.connector.base import (
    BYTES_DTYPE,
    Connector,
    ConnectorError,
    Payload,
    PayloadRef,
    as_bytes_view,
    cpu_tensor,
    dtype_from_name,
    dtype_name,
)
from omni.connector.shm_segment import DEFAULT_CAPACITY, DEFAULT_PUT_TIMEOUT_S
from omni.connector.zmq_recv import DEFAULT_RECV_POOL_BYTES, Landing, RecvPool
from omni.connector.zmq_server import FETCH, OK, RELEASE, DataServer, Store
from omni.wire.curve import CurveKeys, connect_curve

__all__ = ["DEFAULT_FETCH_TIMEOUT_S", "ZmqConnector"]

log = logging.getLogger("omni.connector.zmq")

DEFAULT_FETCH_TIMEOUT_S = 10.0
CLOSE_LINGER_MS = 250  # RELEASEs queued just before close still reach a live producer
WILDCARD_HOSTS = ("", "*", "0.0.0.0", "::", "[::]")


def parse_reply(frames: list[zmq.Frame]) -> tuple[int, int, str] | None:
    """``(status, seq, detail)`` of a well-formed reply, else None."""
    try:
        msg = msgpack.unpackb(frames[0].bytes, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not (isinstance(msg, list) and len(msg) == 3 and type(msg[0]) is int
            and type(msg[1]) is int and isinstance(msg[2], str)):
        return None
    if len(frames) != (2 if msg[0] == OK else 1):
        return None
    return msg[0], msg[1], msg[2]


class ZmqConnector(Connector):
    """Producer: payloads served from one data socket (bound on the first put). Consumer:
    one DEALER per producer endpoint (cached). ``host`` is the address the data socket binds
    and that refs carry: one the consumers reach, not a wildcard."""

    backend = "zmq"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, host: str = "127.0.0.1",
                 curve: dict | None = None,
                 fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
                 recv_pool_bytes: int = DEFAULT_RECV_POOL_BYTES) -> None:
        if capacity_bytes <= 0:
            raise ConnectorError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if host in WILDCARD_HOSTS:
            raise ConnectorError(f"zmq connector host {host!r} is a wildcard; give the "
                                 "address consumers reach this process at")
        self.name, self.host = name, host
        self.put_timeout_s = put_timeout_s
        self.fetch_timeout_s = fetch_timeout_s
        self.nonce = secrets.randbits(63)
        self._keys = CurveKeys.from_dict(curve) if curve is not None else None
        self._lock = threading.Lock()
        self._store = Store(capacity_bytes)
        self._pool = RecvPool(recv_pool_bytes)
        self._context: zmq.Context | None = None
        self._server: DataServer | None = None
        self._dealers: dict[str, zmq.Socket] = {}
        self._counter = itertools.count(1)
        self._seq = 0
        self._closed = False
        self._stats = dict.fromkeys(("gets", "releases", "fetch_timeouts", "fetch_errors",
                                     "releases_dropped"), 0)

    def _ctx(self) -> zmq.Context:
        """The one context of this connector (call with the lock held)."""
        if self._closed:
            raise ConnectorError("zmq connector is closed")
        if self._context is None:
            self._context = zmq.Context()
        return self._context

    # -- producer ------------------------------------------------------------------------

    @property
    def endpoint(self) -> str | None:
        return self._server.endpoint if self._server else None

    def open_socket(self) -> str:
        """Bind the data socket and start its thread now; returns the endpoint."""
        with self._lock:
            if self._server is None:
                self._server = DataServer(self._ctx(), self.host, self._keys, self._store,
                                          self.nonce)
            return self._server.endpoint

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        src, dtype, shape, nbytes = _source(value)
        endpoint = self.open_socket()
        key = f"{owner}/{next(self._counter)}"
        if nbytes:
            self._store.reserve(nbytes, owner,
                                self.put_timeout_s if timeout_s is None else timeout_s)
            try:
                buffer = _owned_copy(src, nbytes)
            except BaseException:
                self._store.unreserve(nbytes)
                raise
            self._store.add(key, owner, nbytes, buffer)
        return PayloadRef("zmq", key, owner, dtype, shape, nbytes, [endpoint, self.nonce])

    def cleanup(self, owner: str) -> int:
        return self._store.drop_owner(owner)

    # -- consumer ------------------------------------------------------------------------

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        """The payload: a tensor viewing the received frame, or a pooled buffer the parts
        of a large one were copied into; writable, owned by this consumer, valid as long
        as it is referenced, after release and close too (see the module doc)."""
        endpoint, nonce = _locate(ref)
        self._stats["gets"] += 1
        if ref.nbytes == 0:
            if ref.dtype == BYTES_DTYPE:
                return b""
            return torch.empty(ref.shape, dtype=dtype_from_name(ref.dtype))
        landing = Landing(ref, self._pool)
        try:
            self._fetch(endpoint, nonce, landing)
            return landing.result()
        finally:
            landing.abandon()  # a no-op once the payload holds the buffer

    def _fetch(self, endpoint: str, nonce: int, landing: Landing) -> None:
        sock, key = self._dealer(endpoint), landing.ref.key
        self._seq += 1
        try:
            sock.send(msgpack.packb([FETCH, self._seq, nonce, key]), zmq.NOBLOCK)
        except zmq.Again:
            raise ConnectorError(f"cannot queue a fetch of payload {key!r} to zmq producer "
                                 f"{endpoint} (its queue is full: it is not reading)") from None
        deadline = time.monotonic() + self.fetch_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(math.ceil(left * 1000)):
                break
            frames = sock.recv_multipart(copy=False)
            reply = parse_reply(frames)
            if reply is None:
                log.warning("zmq producer %s: dropped a malformed reply", endpoint)
            elif reply[1] == self._seq and self._accept(reply, frames, endpoint, landing):
                return
            # else: the reply of an earlier fetch that timed out: discard it
        self._stats["fetch_timeouts"] += 1
        self._drop_dealer(endpoint)
        got = f" (sent {landing.got} of its {landing.ref.nbytes} bytes)" if landing.got else ""
        raise ConnectorError(
            f"no answer from zmq producer {endpoint} for payload {key!r}{got} within "
            f"{self.fetch_timeout_s:g} s: the producer is gone or unreachable"
            + (", or refused this consumer's CURVE keys" if self._keys else ""))

    def _accept(self, reply: tuple[int, int, str], frames: list[zmq.Frame], endpoint: str,
                landing: Landing) -> bool:
        """Take one message of the reply; True once the payload is complete."""
        try:
            if reply[0] != OK:
                raise ConnectorError(reply[2])
            return landing.add(frames[1])
        except ConnectorError as exc:
            self._stats["fetch_errors"] += 1
            raise ConnectorError(f"zmq producer {endpoint}, payload {landing.ref.key!r}: "
                                 f"{exc}") from None

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self._dealers.get(endpoint)
        if sock is None:
            with self._lock:
                sock = self._ctx().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if self._keys is not None:
                connect_curve(sock, self._keys)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
                sock.close(linger=0)
                raise ConnectorError(f"cannot connect to zmq producer {endpoint}: {exc}") \
                    from None
            self._dealers[endpoint] = sock
        return sock

    def _drop_dealer(self, endpoint: str) -> None:
        """Close a socket whose producer did not answer: it would keep reconnecting to a
        dead peer and hold what it queued. The next get or release makes a new one."""
        sock = self._dealers.pop(endpoint, None)
        if sock is not None:
            sock.close(linger=0)

    def release(self, ref: PayloadRef) -> None:
        """Send RELEASE without blocking; dropped (logged) if it cannot be queued."""
        endpoint, nonce = _locate(ref)
        if ref.nbytes == 0:
            return
        try:
            self._dealer(endpoint).send(msgpack.packb([RELEASE, 0, nonce, ref.key]),
                                        zmq.NOBLOCK)
        except zmq.Again:
            self._stats["releases_dropped"] += 1
            log.debug("zmq producer %s: release of %r dropped (queue full)", endpoint,
                      ref.key)
            return
        self._stats["releases"] += 1

    # -- both ----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": "zmq", "endpoint": None,
                               **self._store.usage(), **self._stats, **self._pool.usage(),
                               "producer_sockets": len(self._dealers)}
        server = self._server
        if server is not None:
            out.update(server.health())
        return out

    def close(self) -> None:
        """Stop serving, free every payload, close sockets, terminate the context. Tensors
        already returned by get stay valid. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            server, self._server = self._server, None
            dealers, self._dealers = list(self._dealers.values()), {}
            context, self._context = self._context, None
        try:
            if server is not None:
                server.stop()
        finally:
            for sock in dealers:
                sock.close(linger=CLOSE_LINGER_MS)
            self._store.clear()
            self._pool.close()
        if context is not None:
            context.term()


def _source(value: Payload) -> tuple[Any, str, tuple[int, ...], int]:
    """``(source, dtype name, shape, nbytes)``; nothing copied yet."""
    if isinstance(value, torch.Tensor):
        src = cpu_tensor(value)
        return src, dtype_name(src.dtype), tuple(src.shape), src.numel() * src.element_size()
    if isinstance(value, bytes | bytearray | memoryview):
        view = as_bytes_view(value)
        return view, BYTES_DTYPE, (view.nbytes,), view.nbytes
    raise ConnectorError(f"cannot publish a {type(value).__name__}")


def _owned_copy(src: torch.Tensor | memoryview, nbytes: int) -> Any:
    """One copy into a buffer nobody else holds: ``bytes`` for bytes, a uint8 ndarray for
    tensors (copy_ gathers a non-contiguous, conj or neg source in one pass)."""
    if isinstance(src, memoryview):
        return bytes(src)
    raw = torch.empty(nbytes, dtype=torch.uint8)
    raw.view(src.dtype).view(src.shape).copy_(src)
    return raw.numpy()  # keeps the tensor's memory alive; pyzmq reads the buffer protocol


def _locate(ref: PayloadRef) -> tuple[str, int]:
    if ref.backend != "zmq":
        raise ConnectorError(f"zmq connector cannot read a {ref.backend!r} ref")
    endpoint, nonce = ref.location
    # tcp only: a ref must not make us connect to an inproc/ipc endpoint of this host
    if not (isinstance(endpoint, str) and endpoint.startswith("tcp://")):
        raise ConnectorError(f"payload ref {ref.key!r}: zmq endpoint {endpoint!r} is not "
                             "tcp://HOST:PORT")
    return endpoint, nonce
