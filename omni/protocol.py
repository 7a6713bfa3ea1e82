"""Every wire message between orchestrator and engines, and its one-byte type.

A message is a ZeroMQ multipart of ``[type byte, msgpack body]`` (the ROUTER adds the
peer identity in front). Bodies are msgpack arrays, not maps: positional fields keep
each message a few dozen bytes and decoding one ``unpackb`` call. No pickle on any wire.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack


class Msg(enum.IntEnum):
    # orchestrator -> engine (ROUTER -> DEALER)
    ADD = 1  # [request_id, inputs, params]
    ABORT = 2  # [[request_id, ...]]
    SHUTDOWN = 3  # []
    # engine -> orchestrator
    READY = 10  # [replica_id, info]          (over the DEALER, so the ROUTER learns the peer)
    OUTPUTS = 11  # [replica_id, [[rid, data, finished, error], ...], stats]   (over the PUSH)
    DEAD = 12  # [replica_id, reason]         (over the PUSH, with linger)


TYPE_FRAMES = {m: bytes([m]) for m in Msg}
ARITY = {Msg.ADD: 3, Msg.ABORT: 1, Msg.SHUTDOWN: 0, Msg.READY: 2, Msg.OUTPUTS: 3, Msg.DEAD: 2}

_packer = msgpack.Packer(use_bin_type=True)


def encode(kind: Msg, *fields: Any) -> list[bytes]:
    """Frames for one message: the type byte, then the packed body."""
    return [TYPE_FRAMES[kind], _packer.pack(list(fields))]


def decode(frames: list[bytes]) -> tuple[Msg, list[Any]]:
    """Inverse of encode; raises ProtocolError on anything malformed."""
    if len(frames) != 2 or len(frames[0]) != 1:
        raise ProtocolError(f"expected [type, body] frames, got {len(frames)} frames")
    try:
        kind = Msg(frames[0][0])
        body = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"undecodable message: {exc}") from exc
    if not isinstance(body, list) or len(body) != ARITY[kind]:
        raise ProtocolError(f"{kind.name} body must be an array of {ARITY[kind]} fields")
    return kind, body


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid message."""


@dataclass(frozen=True)
class Endpoints:
    """The two addresses the orchestrator binds for one pipeline."""

    requests: str  # ROUTER (orchestrator) <- DEALER (engine)
    results: str  # PULL (orchestrator) <- PUSH (engine)


Handler = Callable[[list[Any]], None]


def dispatch(table: dict[Msg, Handler], frames: list[bytes]) -> None:
    """Route one message to its handler by type; unknown types are a protocol error."""
    kind, body = decode(frames)
    handler = table.get(kind)
    if handler is None:
        raise ProtocolError(f"no handler for {kind.name}")
    handler(body)
