"""Property tests of the control-plane wire (omni/wire/protocol.py) and both of its readers:
whatever bytes arrive, decoding, dispatching and the shape checks raise ProtocolError (what
the launcher and the engine loop catch to drop one message) or nothing, never another
exception; identity parsing never raises at all; the engine loop's handler of orchestrator
messages survives every frame. Examples are bounded and derandomized (reproducible in CI).
"""

from __future__ import annotations

import logging

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
    ARITY,
    Msg,
    ProtocolError,
    check_inbound,
    check_outputs,
    decode,
    dispatch,
    encode,
    heartbeat_owner,
    identity,
    parse_identity,
)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
           | st.text(max_size=12) | st.binary(max_size=12))
msgpack_values = st.recursive(
    scalars, lambda inner: (st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(max_size=6) | st.integers(-9, 9), inner,
                                              max_size=4)),
    max_leaves=16)
type_bytes = st.sampled_from([int(m) for m in Msg]) | st.integers(0, 255)


@st.composite
def packed_frames(draw) -> bytes:
    """A type byte and a msgpack body of about the right arity with arbitrary fields."""
    kind = draw(type_bytes)
    arity = ARITY.get(kind, 2) if kind in {int(m) for m in Msg} else 2
    fields = draw(st.lists(msgpack_values, min_size=max(0, arity - 1), max_size=arity + 1))
    body = draw(st.sampled_from([fields, fields[0] if fields else None, {"f": fields}]))
    return bytes([kind]) + msgpack.packb(body, use_bin_type=True)


VALID = [encode(Msg.ADD, "r1", {"prompt": "hi"}, {}, 1.0),
         encode(Msg.APPEND, "r1", "a", 0, {"x": 1}, False, 2.0),
         encode(Msg.LIMIT, [["r1", 3]]), encode(Msg.SESSION, [["s", "close"]]),
         encode(Msg.OUTPUTS, "s/0", [["r1", {"text": "x"}, True, None]], {"sent_at": 1.0}),
         encode(Msg.READY, "s/0", {"device": "cpu"}), encode(Msg.ABORT, ["r1"]),
         encode(Msg.SHUTDOWN)]


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


def test_valid_messages_round_trip():
    for frame in VALID:
        kind, body = decode(frame)
        assert encode(kind, *body) == frame


@FUZZ
@given(frames)
def test_decode_returns_a_message_of_its_arity_or_raises_protocol_error(frame):
    try:
        kind, body = decode(frame)
    except ProtocolError:
        return
    assert isinstance(kind, Msg) and isinstance(body, list) and len(body) == ARITY[kind]


@FUZZ
@given(frames)
def test_dispatch_calls_one_handler_or_raises_protocol_error(frame):
    called: list[Msg] = []
    table = {m: (lambda body, m=m: called.append(m)) for m in Msg if m != Msg.HEARTBEAT}
    try:
        dispatch(table, frame)
    except ProtocolError:
        assert called == []
        return
    assert len(called) == 1


@FUZZ
@given(st.lists(msgpack_values, min_size=3, max_size=3))
def test_check_outputs_accepts_only_the_outputs_shape(body):
    try:
        check_outputs(body, "s/0")
    except ProtocolError:
        return
    assert body[0] == "s/0" and isinstance(body[1], list) and isinstance(body[2], dict)
    assert all(isinstance(row[0], str) and len(row) == 4 for row in body[1])


@FUZZ
@given(st.sampled_from([Msg.ADD, Msg.APPEND, Msg.ABORT, Msg.LIMIT, Msg.SESSION]),
       st.lists(msgpack_values, min_size=6, max_size=6))
def test_check_inbound_passes_only_readable_request_ids(kind, fields):
    body = fields[:ARITY[kind]]
    try:
        check_inbound(kind, body)
    except ProtocolError:
        return
    if kind in (Msg.ADD, Msg.APPEND):
        assert isinstance(body[0], str)
    if kind == Msg.ABORT:
        assert all(isinstance(r, str) for r in body[0])


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
@given(frame=frames | packed_frames().map(lambda f: bytes([Msg.ADD]) + f[1:]))
def test_the_engine_loop_survives_any_frame_from_the_orchestrator(engine_loop, caplog, frame):
    caplog.set_level(logging.ERROR, logger="omni.engine")
    caplog.clear()  # one example's records (the fixture spans them all)
    engine_loop._handle(frame)  # raises nothing: dropped (logged) or handled
    try:
        kind, body = decode(frame)
        check_inbound(kind, body)
        valid = kind in engine_loop.handlers
    except ProtocolError:
        valid = False
    dropped = any("dropping malformed" in r.getMessage() for r in caplog.records)
    assert dropped != valid or kind in (Msg.LIMIT, Msg.SESSION)  # those two log their own
