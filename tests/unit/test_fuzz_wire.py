"""Property tests of the control-plane wire (omni/wire/protocol.py) and both of its readers:
whatever bytes arrive, decoding raises ProtocolError (what the launcher and the engine loop
catch to drop one message) or returns a message whose fields have their declared types,
never another exception; identity parsing never raises at all; the engine loop's handler
of orchestrator messages survives every frame. Examples are bounded and derandomized
(reproducible in CI).
"""

from __future__ import annotations

import logging
import typing

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni.engines.echo.engine import EchoEngine
from omni.engines.proc import EngineLoop
from omni.engines.proc.channel import Channel
from omni.wire.payloads import PayloadPlane
from omni.wire.protocol import (
    Abort,
    Add,
    Append,
    EndSessions,
    Free,
    Limit,
    Message,
    Outputs,
    ProtocolError,
    Ready,
    Row,
    Shutdown,
    decode,
    decode_command,
    encode,
    heartbeat_owner,
    identity,
    parse_identity,
)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

MESSAGES = typing.get_args(Message)
ARITY = {m.__struct_config__.tag: len(m.__struct_fields__) for m in MESSAGES}
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
           | st.text(max_size=12) | st.binary(max_size=12))
msgpack_values = st.recursive(
    scalars, lambda inner: (st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(max_size=6) | st.integers(-9, 9), inner,
                                              max_size=4)),
    max_leaves=16)
tags = st.sampled_from(sorted(ARITY)) | st.integers(-1, 255)


@st.composite
def packed_frames(draw) -> bytes:
    """A tag and about the right number of arbitrary fields, or that array inside another
    shape."""
    tag = draw(tags)
    arity = ARITY.get(tag, 2)
    fields = draw(st.lists(msgpack_values, min_size=max(0, arity - 1), max_size=arity + 1))
    body = draw(st.sampled_from([[tag, *fields], fields, {"f": fields}, tag]))
    return msgpack.packb(body, use_bin_type=True)


VALID = [encode(Add("r1", {"prompt": "hi"}, {}, 1.0)),
         encode(Append("r1", "a", 0, {"x": 1}, False, 2.0)),
         encode(Limit({"r1": 3})), encode(EndSessions([("s", "close")])),
         encode(Outputs("s/0", [Row("r1", {"text": "x"}, True)], 1.0)),
         encode(Ready("s/0", {"device": "cpu"})), encode(Abort(["r1"])), encode(Free(["r1"])),
         encode(Shutdown())]


@st.composite
def mutated_frames(draw) -> bytes:
    """A real message with bytes flipped, cut or appended."""
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(frame) - 1))
        frame[at] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(frame)))
    return bytes(frame[:cut]) + draw(st.binary(max_size=8))


frames = st.binary(max_size=64) | packed_frames() | mutated_frames()
# Adds with a request id and arbitrary inputs, params and stamp: many decode, and reach
# the engine
ADD_TAG = Add.__struct_config__.tag
add_frames = st.tuples(st.text(max_size=6), st.dictionaries(st.text(max_size=6), msgpack_values),
                       st.dictionaries(st.text(max_size=6), msgpack_values),
                       st.floats() | msgpack_values).map(
    lambda f: msgpack.packb([ADD_TAG, *f], use_bin_type=True))


def test_valid_messages_round_trip():
    for frame in VALID:
        assert encode(decode(frame)) == frame


def _is_id(value: object) -> bool:
    return type(value) is str


def _has_declared_types(message: Message) -> bool:
    """What the engine loop and the orchestrator read without checking it again."""
    if isinstance(message, (Add, Append)):
        return _is_id(message.request_id) and type(message.sent_at) is float
    if isinstance(message, (Abort, Free)):
        return all(map(_is_id, message.request_ids))
    if isinstance(message, Limit):
        return all(_is_id(r) and (n is None or type(n) is int)
                   for r, n in message.limits.items())
    if isinstance(message, Outputs):
        return all(_is_id(r.request_id) and type(r.finished) is bool
                   and (r.error is None or all(map(_is_id, r.error))) for r in message.rows)
    return True


@FUZZ
@given(frames)
def test_decode_returns_a_typed_message_or_raises_protocol_error(frame):
    try:
        message = decode(frame)
    except ProtocolError:
        return
    assert isinstance(message, MESSAGES) and _has_declared_types(message)


@FUZZ
@given(packed_frames())
def test_decode_command_takes_only_commands(frame):
    try:
        command = decode_command(frame)
    except ProtocolError:
        return
    assert isinstance(command, (Add, Abort, Shutdown, Append, Limit, EndSessions, Free))


@FUZZ
@given(st.binary(max_size=40) | st.text(max_size=30).map(str.encode)
       | st.builds(lambda r, i: r.encode() + b"@" + i.encode(), st.text(max_size=8),
                   st.text(max_size=25)))
def test_identity_parsing_never_raises(raw):
    parsed = parse_identity(raw)
    if parsed is not None:
        replica_id, incarnation = parsed
        assert identity(replica_id, incarnation) == raw.decode("utf-8", "replace").encode()
    owner = heartbeat_owner(raw + b"#hb")
    assert owner == (raw if parsed is not None else None)


def test_identity_parsing_refuses_non_ascii_digits_and_huge_numbers():
    assert parse_identity("s/0@²".encode()) is None  # isdigit() is True, int() refuses it
    assert parse_identity(b"s/0@" + b"9" * 5000) is None  # int() refuses > 4300 digits
    assert parse_identity(b"s/0@12") == ("s/0", 12)


@pytest.fixture(scope="module")
def engine_loop(tmp_path_factory):
    """A real engine loop over an echo engine, its channel connected to a real ROUTER."""
    address = f"ipc://{tmp_path_factory.mktemp('wire')}/control.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    channel = Channel(address, identity("s/0", 0), "s/0")
    loop = EngineLoop("s/0", EchoEngine("s"), channel, PayloadPlane("test-fuzz-wire"))
    yield loop
    channel.close()
    router.close(linger=0)
    context.term()


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
@given(frame=frames | add_frames)
def test_the_engine_loop_survives_any_frame_from_the_orchestrator(engine_loop, caplog, frame):
    caplog.set_level(logging.ERROR, logger="omni.engine")
    caplog.clear()  # one example's records (the fixture spans them all)
    engine_loop._handle(frame)  # raises nothing: dropped (logged) or handled
    try:
        decode_command(frame)
        valid = True
    except ProtocolError:
        valid = False
    dropped = any("dropping malformed" in r.getMessage() for r in caplog.records)
    assert dropped != valid
