"""omni/wire/protocol.py without sockets: round trips, sizes, malformed frames, each side's
decoder, identities, addresses."""

from __future__ import annotations

import pickle
import typing

import msgpack
import pytest

from omni.wire.protocol import (
    Abort,
    AbortAck,
    Add,
    Append,
    Command,
    Dead,
    EndSessions,
    Free,
    Heartbeat,
    Limit,
    Message,
    Outputs,
    ProtocolError,
    Ready,
    Report,
    Row,
    SessionReply,
    Shutdown,
    check_address,
    decode,
    decode_command,
    decode_report,
    encode,
    heartbeat_owner,
    identity,
    parse_identity,
)

REF = ["\x00ref", "omni-1-a", 4096, 128, "float32", [32], 7]  # a PayloadRef on the wire
ND = ["\x00nd", "int16", [2, 3], b"\x00\x01" * 6]  # a numpy array (omni/wire/arrays.py)
ROUND_TRIPS = [
    Add("req-1", {"prompt": "héllo ✓", "audio": REF, "ids": ND},
        {"chunks": 3, "temperature": 0.5}, 12.5),
    Abort(["r1", "r2", "r3"]),
    Limit({"r1": 12, "r2": None}),
    EndSessions([("s1", "close"), ("s2", "evict"), ("s3", "reset")]),
    Shutdown(),
    Append("r1", "thinker", 3, {"hidden": REF, "text": "x"}, False, 1.25),
    Append("r1", "client", 4, None, True, 1.5),
    Free(["r1"]),
    Ready("a/0", {"engine": "echo", "pid": 1234, "memory": 2**40}),
    Outputs("a/0", [Row("r1", {"text": "x", "index": 0, "trace": ["a"]}, False),
                    Row("r2", None, True, ("engine", "boom"))], 3.5, {"running": 1},
            {"r1": (0.001, 0.002, 1, 0.001, 0.002)}, [0.01, 0.02], [0.0005]),
    Dead("a/0", "a/0 died: RuntimeError: x\n-- last log lines --\n..."),
    Heartbeat("a/0"),
    AbortAck("a/0", ["r1"], 2.0),
    SessionReply("a/0", {"session_bytes": {"s1": 4096}}, 2.5),
    Outputs("b/1", [Row("r", {"blob": b"\x00\x01\xff" * 100, "f": -1.5, "n": None,
                              "big": -(2**63), "nested": {"1": [1, [2, [3]]]}}, True)], 0.0),
]


@pytest.mark.parametrize("message", ROUND_TRIPS, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    frame = encode(message)
    assert isinstance(frame, bytes)
    assert decode(frame) == message
    assert type(decode(frame)) is type(message)


def test_bytes_stay_bytes_str_stays_str_and_refs_stay_lists():
    add = decode(encode(Add("rid", {"b": b"raw", "s": "text", "ref": REF}, {}, 0.0)))
    assert add.inputs == {"b": b"raw", "s": "text", "ref": REF}
    assert type(add.inputs["b"]) is bytes and type(add.inputs["s"]) is str
    assert type(add.inputs["ref"]) is list


def test_integer_map_keys_inside_values_decode():
    add = decode(encode(Add("r", {"by_index": {0: "zero", 1: "one"}}, {}, 0.0)))
    assert add.inputs["by_index"] == {0: "zero", 1: "one"}


def test_every_message_has_its_own_tag_and_each_side_reads_its_own():
    tags = [m.__struct_config__.tag for m in typing.get_args(Message)]
    assert len(set(tags)) == len(tags) == 13
    for message in ROUND_TRIPS:
        command = type(message) in typing.get_args(Command)
        assert command != (type(message) in typing.get_args(Report))
        reader, other = (decode_command, decode_report) if command else (decode_report,
                                                                          decode_command)
        assert reader(encode(message)) == message
        with pytest.raises(ProtocolError):
            other(encode(message))


def test_small_messages_stay_small():
    # array_like structs: a tag and the fields, no names
    assert len(encode(Abort(["0123456789abcdef0123456789abcdef"]))) < 40
    assert encode(Shutdown()) == b"\x91\x03"


@pytest.mark.parametrize("message", [m for m in ROUND_TRIPS if isinstance(m, (Add, Append))],
                         ids=lambda m: type(m).__name__)
def test_a_message_is_no_larger_than_the_type_byte_and_positional_array_it_replaced(message):
    fields = [getattr(message, f) for f in message.__struct_fields__]
    positional = bytes([1]) + msgpack.packb(fields, use_bin_type=True)
    assert len(encode(message)) == len(positional)


def test_encode_refuses_what_msgpack_cannot_carry():
    with pytest.raises(TypeError):
        encode(Add("rid", {"obj": object()}, {}, 0.0))
    with pytest.raises(OverflowError):
        encode(Add("rid", {"n": 2**64}, {}, 0.0))


ADD = 1
MALFORMED = {
    "empty": b"",
    "unknown tag": msgpack.packb([99]),
    "tag zero": msgpack.packb([0]),
    "reserved msgpack byte": b"\xc1",
    "truncated array": b"\x95\x01",
    "trailing bytes": encode(Shutdown()) + b"\x90",
    "invalid utf-8 str": b"\x95\x01\xa2\xff\xfe",
    "map": msgpack.packb({"request_id": "r"}),
    "int": msgpack.packb(7),
    "str": msgpack.packb("ADD"),
    "nil": msgpack.packb(None),
    "too few fields": msgpack.packb([ADD, "r", {}]),
    "too many fields": msgpack.packb([ADD, "r", {}, {}, 0.0, "extra"]),
    "request id not a str": msgpack.packb([ADD, 7, {}, {}, 0.0]),
    "inputs not a map": msgpack.packb([ADD, "r", [], {}, 0.0]),
    "stamp not a number": msgpack.packb([ADD, "r", {}, {}, "soon"]),
    "limit a bool": encode(Limit({"r": True})),
    "unknown session op": encode(EndSessions([("s", "explode")])),
    "row error not a pair": encode(Outputs("a/0", [Row("r", None, True, ("x",))], 0.0)),
    # an Add whose inputs {"k": [[[...]]]} nest deeper than any stack
    "deep nesting": b"\x95\x01\xa1r\x81\xa1k" + b"\x91" * 100_000 + b"\x90",
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_raise_protocol_error(frame):
    with pytest.raises(ProtocolError):
        decode(frame)


def test_protocol_error_says_what_was_wrong():
    with pytest.raises(ProtocolError, match=r"Expected `str`, got `int` - at `\$\[1\]`"):
        decode(msgpack.packb([ADD, 1, {}, {}, 0.0]))
    with pytest.raises(ProtocolError, match="not an engine's report"):
        decode_report(encode(Shutdown()))


def test_decode_accepts_frame_like_buffers():
    frame = encode(Abort(["r"]))
    assert decode(bytearray(frame)) == Abort(["r"])
    assert decode(memoryview(frame)) == Abort(["r"])


def test_identities_carry_the_replica_and_its_incarnation():
    assert identity("talker/0", 3) == b"talker/0@3"
    assert parse_identity(b"talker/0@3") == ("talker/0", 3)
    assert parse_identity(identity("a@b/1", 12)) == ("a@b/1", 12)
    for raw in (b"talker/0", b"talker/0@", b"@1", b"x@-1", b"x@one", b"\xff\xfe"):
        assert parse_identity(raw) is None, raw
    assert heartbeat_owner(b"talker/0@3#hb") == b"talker/0@3"
    for raw in (b"talker/0@3", b"talker/0#hb", b"talker/0@3#hbx", b"#hb"):
        assert heartbeat_owner(raw) is None, raw


@pytest.mark.parametrize("address", ["ipc:///tmp/x/control.sock", "tcp://127.0.0.1:5555",
                                     "tcp://127.0.0.1:*", "tcp://localhost:1", "tcp://[::1]:9",
                                     "tcp://127.8.0.1:80"])
def test_loopback_and_ipc_addresses_are_accepted(address):
    assert check_address(address) == address


LOOPBACK_ONLY = "loopback tcp:// addresses only"


@pytest.mark.parametrize(("address", "why"), [
    ("tcp://0.0.0.0:5555", LOOPBACK_ONLY), ("tcp://10.1.2.3:5555", LOOPBACK_ONLY),
    ("tcp://example.com:5555", LOOPBACK_ONLY), ("tcp://[2001:db8::1]:5", LOOPBACK_ONLY),
    ("ipc://", "must be"), ("udp://127.0.0.1:5", "must be"), ("tcp://127.0.0.1", "must be"),
    ("127.0.0.1:5555", "must be")])
def test_other_addresses_are_refused_saying_why(address, why):
    with pytest.raises(ValueError, match=why):
        check_address(address)


def test_message_objects_are_not_pickled():
    with pytest.raises(TypeError):
        encode(Add("r", {"p": pickle}, {}, 0.0))
