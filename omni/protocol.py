"""Every wire message between orchestrator and engines, its one-byte type, and framing.

Each engine replica holds one Unix stream connection to its orchestrator, used in both
directions. A message is ``[4-byte little-endian length][type byte][msgpack body]``.
Plain stream sockets, not ZeroMQ: measured on the 2-core dev VM, a uvloop <-> process
round trip took 137 us p50 / 216 us p99 over a Unix socket against 252-277 us / 465-575
us over ZeroMQ ipc, because libzmq adds an I/O-thread wake-up on each side of each
direction (bench/results/core.md). One connection per replica also gives peer identity
for free, and a DEAD notice written before exit is never lost: the kernel keeps it
readable after the writer is gone. Bodies are msgpack arrays, not maps: positional
fields keep each message a few dozen bytes. No pickle on any wire.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

import msgpack

Buffer = bytes | bytearray | memoryview


class Msg(enum.IntEnum):
    # orchestrator -> engine
    ADD = 1  # [request_id, inputs, params, sent_at]
    ABORT = 2  # [[request_id, ...]]
    SHUTDOWN = 3  # []
    APPEND = 4  # [request_id, producer_stage, seq, data, last, sent_at]   stream-edge input
    LIMIT = 5  # [[[request_id, max_outputs | None], ...]]   stream flow control (lead.py)
    # engine -> orchestrator
    READY = 10  # [replica_id, info]   the first message on a connection names the replica
    OUTPUTS = 11  # [replica_id, [[rid, data, finished, error|[kind, message]], ...], stats]
    # sent_at / stats["sent_at"]: the sender's time.monotonic() (one clock for every
    # process of a host), so each side can time the hop it received (omni/transit.py)
    DEAD = 12  # [replica_id, reason]   the last message of a dying engine


TYPE_BYTES = {m: bytes([m]) for m in Msg}
ARITY = {Msg.ADD: 4, Msg.ABORT: 1, Msg.SHUTDOWN: 0, Msg.APPEND: 6, Msg.LIMIT: 1, Msg.READY: 2,
         Msg.OUTPUTS: 3, Msg.DEAD: 2}
_KINDS = {int(m): m for m in Msg}  # a dict lookup; Msg(x) costs an enum call per message

_packer = msgpack.Packer(use_bin_type=True)


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid message."""


def encode(kind: Msg, *fields: Any) -> bytes:
    """One message: the type byte, then the packed body (see `frame` for the wire)."""
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


REF_MARKER = "\x00ref"  # first element of a wire PayloadRef (omni/connector/base.py)
HEADER = struct.Struct("<I")
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a corrupt length must not make a reader allocate GBs


def frame(message: bytes) -> bytes:
    """A message with its length prefix, ready for a stream socket."""
    return HEADER.pack(len(message)) + message


class FrameReader:
    """Splits a byte stream back into messages; keeps a partial message for later."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: Buffer) -> list[bytes]:
        if not self._buffer and len(data) >= HEADER.size:
            length = HEADER.unpack_from(data)[0]
            if len(data) == HEADER.size + length:  # the usual case: exactly one message
                return [bytes(data[HEADER.size:])]
        buffer = self._buffer
        buffer += data
        messages, pos, size = [], 0, len(buffer)
        while size - pos >= HEADER.size:
            length = HEADER.unpack_from(buffer, pos)[0]
            if length > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"message length {length} exceeds {MAX_MESSAGE_BYTES}")
            end = pos + HEADER.size + length
            if end > size:
                break
            messages.append(bytes(buffer[pos + HEADER.size:end]))
            pos = end
        del buffer[:pos]
        return messages


Handler = Callable[[list[Any]], None]


def dispatch(table: dict[Msg, Handler], frame: Buffer) -> None:
    """Route one message to its handler by type; unknown types are a protocol error."""
    kind, body = decode(frame)
    handler = table.get(kind)
    if handler is None:
        raise ProtocolError(f"no handler for {kind.name}")
    handler(body)
