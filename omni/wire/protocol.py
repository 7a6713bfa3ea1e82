"""Every wire message between orchestrator and engines, as a typed struct, and the sockets.

The control plane is ZeroMQ: the orchestrator binds one ROUTER per pipeline, each replica
connects one DEALER whose identity is ``<replica id>@<incarnation>`` (a restarted replica
is a new identity, never confused with its predecessor's half-open connection). A message
is one ZeroMQ frame; the ROUTER adds and strips the identity frame. No pickle on any wire;
payload bytes never ride here (omni/connector/).

Each message is a msgspec Struct, one type per purpose; the structs below are the
documentation of the wire. msgspec, as vLLM's engine core speaks over ZeroMQ, because:

- typed: a receiver gets an ``Add`` with named fields, not a positional list, and the
  engine's answers (``AbortAck``, ``SessionReply``) are types of their own, not magic
  keys inside an OUTPUTS' stats;
- validated at decode: a wrong type, a missing field or a truncated frame raises
  ProtocolError for that frame alone, before any handler runs (the receivers drop it and
  log), so no hand-written shape checks;
- compact: ``array_like`` structs in a tagged union encode as ``[tag, field, ...]``, the
  same bytes as the type byte + positional msgpack array this replaced (bytes stay
  msgpack bin, str stays str: request inputs round-trip exactly);
- fast: encode + decode of an ADD or an OUTPUTS costs less than msgpack's positional
  lists did (bench/probes/wire_codec.py).

libzmq's I/O thread receives while an engine is inside a long step, so inbound bursts do
not wait on the engine (the hand-written Unix-socket transport this replaced needed a
drainer thread for that). Its price, one I/O-thread hand-off on each side of each
direction, is measured in bench/results/core.md beside raw Unix-socket and ZeroMQ round
trips.

Every ``sent_at`` is the sender's time.monotonic() (one clock for every process of a
host), so each side can time the hop it received (omni/wire/transit.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any, Literal

import msgspec

Buffer = bytes | bytearray | memoryview
# The control plane's version: +1 on any change to a message that an older peer would read
# wrongly. An engine says it in its Ready; the orchestrator refuses an engine of another
# version (a stage's own environment may hold another omni: omni/runtime/versions.py).
WIRE_VERSION = 2  # 2: Row.error_field
REF_MARKER = "\x00ref"  # first element of a wire PayloadRef (omni/connector/base.py)


class _Message(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """A control message, encoded as ``[tag, field, ...]``. Both ends run the same code, so
    a field more than the struct has is an error, as is a missing one that has no default.
    gc=False: a message holds only plain values, never a cycle, so the collector need not
    track it."""


# -- orchestrator -> engine ("commands") -------------------------------------------------

class Add(_Message, tag=1):
    """Start a request on this replica's engine."""
    request_id: str
    inputs: dict[str, Any]  # values may be payload refs ["\x00ref", ...] or arrays ["\x00nd", ...]
    params: dict[str, Any]  # the stage's params for this request
    sent_at: float


class Abort(_Message, tag=2):
    """Drop these requests; answered by an AbortAck (omni/runtime/aborts.py)."""
    request_ids: list[str]


class Shutdown(_Message, tag=3):
    """Exit now; also the answer to Dead (the engine waits for it before exiting)."""


class Append(_Message, tag=4):
    """One chunk of stream-edge input from a producer stage (or the client)."""
    request_id: str
    producer: str
    seq: int  # per (producer, consumer): a gap or repeat is the engine's error
    data: dict[str, Any] | None  # None: a `last` without data
    last: bool
    sent_at: float


class Limit(_Message, tag=5):
    """Stream flow control (omni/runtime/lead.py): request id -> the most outputs it may
    have made so far, None lifting the limit."""
    limits: dict[str, int | None]


class EndSessions(_Message, tag=6):
    """Drop sessions' engine state; answered by a SessionReply."""
    ends: list[tuple[str, Literal["close", "reset", "evict"]]]  # (session id, why)


class Free(_Message, tag=7):
    """Free the payloads these aborted requests produced: every replica that could read
    them has let go (omni/runtime/aborts.py)."""
    request_ids: list[str]


# -- engine -> orchestrator ("reports") --------------------------------------------------

class Ready(_Message, tag=10):
    """The first message of an incarnation: loaded, with its capabilities and memory.
    Its first three fields keep their places in every version, so that any version's
    Ready can be read for the version check (ready_version); 0: an engine from before
    versions were sent."""
    replica_id: str
    info: dict[str, Any]
    wire_version: int = 0


class Row(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """One request's output of an engine step."""
    request_id: str
    data: dict[str, Any] | None  # payload refs inside, as in Add.inputs
    finished: bool
    error: tuple[str, str] | None = None  # (ENGINE_FAULT | INPUT_FAULT, message)
    error_field: str | None = None  # the input field at fault (StepOutput.error_field)


class Outputs(_Message, tag=11):
    """An engine step's outputs (or one request's rejection) with the engine's numbers."""
    replica_id: str
    rows: list[Row]
    sent_at: float
    stats: dict[str, Any] = {}  # the engine's and its payload plane's gauges (/metrics)
    # per request: [hop sum, wait sum, messages, last hop, last wait] of what it received
    inbound: dict[str, tuple[float, float, int, float, float]] = {}
    step_s: list[float] = []  # durations of the steps since the last Outputs
    gc_s: list[float] = []  # garbage-collector pauses since the last Outputs


class Dead(_Message, tag=12):
    """The last message of a dying engine (its error and last log lines)."""
    replica_id: str
    reason: str


class Heartbeat(_Message, tag=13):
    """Every heartbeat interval, from the engine's own thread and socket."""
    replica_id: str


class AbortAck(_Message, tag=14):
    """The engine dropped these requests and reads none of their inputs any more."""
    replica_id: str
    request_ids: list[str]
    sent_at: float


class SessionReply(_Message, tag=15):
    """The answer to EndSessions: the engine's stats now (``session_bytes``: what it
    still holds per session)."""
    replica_id: str
    stats: dict[str, Any]
    sent_at: float


Command = Add | Abort | Shutdown | Append | Limit | EndSessions | Free
Report = Ready | Outputs | Dead | Heartbeat | AbortAck | SessionReply
Message = Command | Report

_encoder = msgspec.msgpack.Encoder()
_any, _commands, _reports = (msgspec.msgpack.Decoder(t) for t in (Message, Command, Report))


class ProtocolError(Exception):
    """A peer sent bytes that are not a valid message."""


def encode(message: Message) -> bytes:
    """One frame. Raises TypeError (or OverflowError, ValueError) for a value msgpack
    cannot carry."""
    return _encoder.encode(message)


def decode(frame: Buffer) -> Message:
    """Any message; raises ProtocolError on anything malformed."""
    return _decode(_any, frame, "a message")


def decode_command(frame: Buffer) -> Command:
    """What an engine reads: an orchestrator's command, or ProtocolError."""
    return _decode(_commands, frame, "an orchestrator's command")


def decode_report(frame: Buffer) -> Report:
    """What the orchestrator reads: an engine's report, or ProtocolError."""
    return _decode(_reports, frame, "an engine's report")


def ready_version(frame: Buffer) -> int | None:
    """The wire version a Ready declares, read without the Ready struct of this version
    (another version's Ready may have other fields after it); None if the frame is no
    Ready."""
    try:
        fields = msgspec.msgpack.decode(frame)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(fields, list) or len(fields) < 3 or fields[0] != Ready.__struct_config__.tag:
        return None
    version = fields[3] if len(fields) > 3 else 0
    return version if isinstance(version, int) and not isinstance(version, bool) else -1


def opens_incarnation(frame: Buffer) -> bool:
    """A Ready (of any version) or a Dead: what a new incarnation says first."""
    if ready_version(frame) is not None:
        return True
    try:
        return isinstance(decode_report(frame), Dead)
    except ProtocolError:
        return False


def _decode(decoder: msgspec.msgpack.Decoder, frame: Buffer, expected: str) -> Any:
    try:
        return decoder.decode(frame)
    # ValidationError is a DecodeError; msgspec before 0.23 raises UnicodeDecodeError for
    # a str that is not UTF-8
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"not {expected}: {exc}") from exc


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
