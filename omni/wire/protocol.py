"""Every wire message between orchestrator and engines, its one-byte type, and the sockets.

The control plane is ZeroMQ: the orchestrator binds one ROUTER per pipeline, each replica
connects one DEALER whose identity is ``<replica id>@<incarnation>`` (a restarted replica
is a new identity, never confused with its predecessor's half-open connection). A message
is one ZeroMQ frame, ``[type byte][msgpack array]``; the ROUTER adds and strips the
identity frame. Bodies are arrays, not maps: positional fields keep each message a few
dozen bytes. No pickle on any wire; payload bytes never ride here (omni/connector/).

libzmq's I/O thread receives while an engine is inside a long step, so inbound bursts do
not wait on the engine (the hand-written Unix-socket transport this replaced needed a
drainer thread for that). Its price, one I/O-thread hand-off on each side of each
direction, is measured in bench/results/core.md beside raw Unix-socket and ZeroMQ round
trips.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
from collections.abc import Callable
from typing import Any

import msgpack

Buffer = bytes | bytearray | memoryview


class Msg(enum.IntEnum):
    # orchestrator -> engine
    ADD = 1  # [request_id, inputs, params, sent_at]
    ABORT = 2  # [[request_id, ...]]
    SHUTDOWN = 3  # []   also the answer to DEAD: the engine may exit now
    APPEND = 4  # [request_id, producer_stage, seq, data, last, sent_at]   stream-edge input
    LIMIT = 5  # [[[request_id, max_outputs | None], ...]]   stream flow control (lead.py)
    SESSION = 6  # [[[session_id, op], ...]]   drop a session's engine state (op: close,
    #   reset, evict); answered by an OUTPUTS without rows whose stats say what is held
    FREE = 7  # [[request_id, ...]]   free the payloads these aborted requests produced: every
    #   replica that could read them has let go (ABORT is answered by an OUTPUTS without rows
    #   whose stats["aborted"] lists the request ids; runtime/aborts.py)
    # engine -> orchestrator
    READY = 10  # [replica_id, info]   the first message of an incarnation
    OUTPUTS = 11  # [replica_id, [[rid, data, finished, error|[kind, message]], ...], stats]
    # sent_at / stats["sent_at"]: the sender's time.monotonic() (one clock for every
    # process of a host), so each side can time the hop it received (omni/wire/transit.py)
    DEAD = 12  # [replica_id, reason]   the last message of a dying engine
    HEARTBEAT = 13  # [replica_id]   every heartbeat interval, from the engine's own thread


TYPE_BYTES = {m: bytes([m]) for m in Msg}
ARITY = {Msg.ADD: 4, Msg.ABORT: 1, Msg.SHUTDOWN: 0, Msg.APPEND: 6, Msg.LIMIT: 1,
         Msg.SESSION: 1, Msg.FREE: 1, Msg.READY: 2, Msg.OUTPUTS: 3, Msg.DEAD: 2,
         Msg.HEARTBEAT: 1}
_KINDS = {int(m): m for m in Msg}  # a dict lookup; Msg(x) costs an enum call per message

_packer = msgpack.Packer(use_bin_type=True)
REF_MARKER = "\x00ref"  # first element of a wire PayloadRef (omni/connector/base.py)


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid message."""


def encode(kind: Msg, *fields: Any) -> bytes:
    """One message: the type byte, then the packed body."""
    return TYPE_BYTES[kind] + _packer.pack(list(fields))


def decode(frame: Buffer) -> tuple[Msg, list[Any]]:
    """Inverse of encode; raises ProtocolError on anything malformed."""
    view = memoryview(frame)
    if len(view) < 2:
        raise ProtocolError(f"a message needs a type byte and a body, got {len(view)} bytes")
    kind = _KINDS.get(view[0])
    if kind is None:
        raise ProtocolError(f"unknown message type {view[0]}")
    try:
        body = msgpack.unpackb(view[1:], raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"undecodable {kind.name} body: {exc}") from exc
    if not isinstance(body, list) or len(body) != ARITY[kind]:
        raise ProtocolError(f"{kind.name} body must be an array of {ARITY[kind]} fields")
    return kind, body


def check_outputs(body: list, replica_id: str) -> None:
    """An OUTPUTS body from `replica_id` has the shape the orchestrator reads, or
    ProtocolError: [replica_id, [[request_id, data, finished, error|None], ...], {stats}]."""
    if body[0] != replica_id:
        raise ProtocolError(f"OUTPUTS from {replica_id} names {body[0]!r}")
    rows, stats = body[1], body[2]
    if not isinstance(rows, list) or not isinstance(stats, dict) or not all(
            isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
            and (r[3] is None or _is_error(r[3])) for r in rows):
        raise ProtocolError("OUTPUTS rows must be [request_id, data, finished, error] arrays, "
                            "error null or [kind, message]")


def _is_error(error: Any) -> bool:
    return isinstance(error, list) and len(error) == 2 and all(isinstance(x, str) for x in error)


# orchestrator -> engine: the fields an engine loop reads before its own checks of a
# request (an unhashable request id would otherwise raise in the loop, outside them)
_INBOUND_CHECKS: dict[Msg, Callable[[list], bool]] = {
    Msg.ADD: lambda b: isinstance(b[0], str),
    Msg.APPEND: lambda b: isinstance(b[0], str) and isinstance(b[1], str),
    Msg.ABORT: lambda b: isinstance(b[0], list) and all(isinstance(r, str) for r in b[0]),
    Msg.FREE: lambda b: isinstance(b[0], list) and all(isinstance(r, str) for r in b[0]),
}


def check_inbound(kind: Msg, body: list) -> None:
    """An engine-bound body has the field types the engine loop reads, or ProtocolError
    (LIMIT and SESSION bodies are checked where they are read)."""
    check = _INBOUND_CHECKS.get(kind)
    if check is not None and not check(body):
        raise ProtocolError(f"{kind.name} body has fields of the wrong type")


Handler = Callable[[list[Any]], None]


def dispatch(table: dict[Msg, Handler], frame: Buffer) -> None:
    """Route one message to its handler by type; unknown types are a protocol error."""
    kind, body = decode(frame)
    handler = table.get(kind)
    if handler is None:
        raise ProtocolError(f"no handler for {kind.name}")
    handler(body)


# -- identities and addresses ----------------------------------------------------------

def identity(replica_id: str, incarnation: int) -> bytes:
    """The DEALER identity of one incarnation of a replica."""
    return f"{replica_id}@{incarnation}".encode()


HEARTBEAT_SUFFIX = b"#hb"
_INCARNATION = re.compile(r"[0-9]{1,18}")  # a replica's heartbeat socket is named <identity>#hb


def heartbeat_owner(raw: bytes) -> bytes | None:
    """The replica identity whose heartbeat socket this is, or None."""
    if raw.endswith(HEARTBEAT_SUFFIX) and parse_identity(raw[:-len(HEARTBEAT_SUFFIX)]):
        return raw[:-len(HEARTBEAT_SUFFIX)]
    return None


def parse_identity(raw: bytes) -> tuple[str, int] | None:
    """(replica id, incarnation) of an identity, or None for anything else."""
    replica_id, sep, incarnation = raw.decode("utf-8", "replace").rpartition("@")
    # ASCII digits only, and few: str.isdigit() also takes "²", which int() refuses
    if not sep or not _INCARNATION.fullmatch(incarnation) or not replica_id:
        return None
    return replica_id, int(incarnation)


# per peer and direction. Bounded, so a peer that stops reading cannot grow the
# orchestrator without limit; large, so a stalled engine (SIGSTOP, a long step on a busy
# host) queues its inputs instead of losing them. A send that would pass it is an error
# (ROUTER_MANDATORY), never a silent drop.
CONTROL_HWM = 100_000
LINGER_MS = 2000  # how long a closing socket may flush what it has queued (a DEAD notice)


def check_address(address: str, authenticated: bool = False) -> str:
    """An endpoint the control plane may bind or connect: ``ipc://PATH`` or
    ``tcp://HOST:PORT``, with a loopback HOST unless the socket is ``authenticated``
    (CURVE, omni/wire/curve.py): an open plain TCP port would let anyone on the network drive
    engines. Raises ValueError saying what is wrong."""
    if address.startswith("ipc://") and len(address) > len("ipc://"):
        return address
    match = re.fullmatch(r"tcp://(\[[0-9a-fA-F:]+\]|[^:/\[\]]+):(\d+|\*)", address)
    if not match:
        raise ValueError(f"control address {address!r} must be ipc://PATH or tcp://HOST:PORT")
    host = match.group(1).strip("[]")
    if host != "localhost" and not authenticated:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"control address {address!r}: a plain control socket takes "
                             "loopback tcp:// addresses only (other hosts connect to the "
                             "CURVE socket of a pipeline with a `cluster:`)")
    return address


def ipc_address(directory: str, name: str = "control") -> str:
    return "ipc://" + os.path.join(directory, f"{name}.sock")
