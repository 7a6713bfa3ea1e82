"""omni/wire/protocol.py without sockets: round trips, malformed frames, dispatch, identities,
addresses."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from omni.wire.protocol import (
    TYPE_BYTES,
    Msg,
    ProtocolError,
    check_address,
    decode,
    dispatch,
    encode,
    heartbeat_owner,
    identity,
    parse_identity,
)

ROUND_TRIPS = [
    (Msg.ADD, ["req-1", {"prompt": "héllo ✓"}, {"chunks": 3, "temperature": 0.5}, 12.5]),
    (Msg.ABORT, [["r1", "r2", "r3"]]),
    (Msg.LIMIT, [[["r1", 12], ["r2", None]]]),
    (Msg.SESSION, [[["s1", "close"], ["s2", "evict"]]]),
    (Msg.SHUTDOWN, []),
    (Msg.READY, ["a/0", {"engine": "echo", "pid": 1234, "memory": 2**40}]),
    (Msg.OUTPUTS, ["a/0", [["r1", {"text": "x", "index": 0, "trace": ["a"]}, False, None],
                           ["r2", None, True, ["engine", "boom"]]], {"running": 1}]),
    (Msg.DEAD, ["a/0", "a/0 died: RuntimeError: x\n-- last log lines --\n..."]),
    (Msg.OUTPUTS, ["b/1", [["r", {"blob": b"\x00\x01\xff" * 100, "f": -1.5, "n": None,
                                  "big": -(2**63), "nested": {"1": [1, [2, [3]]]}},
                            True, None]], {}]),
]


@pytest.mark.parametrize(("kind", "fields"), ROUND_TRIPS, ids=lambda v: str(v)[:20])
def test_round_trip(kind, fields):
    frame = encode(kind, *fields)
    assert isinstance(frame, bytes)
    assert frame[0] == kind  # the type byte leads the single frame
    assert decode(frame) == (kind, fields)
    got_kind, _ = decode(frame)
    assert type(got_kind) is Msg


def test_bytes_stay_bytes_and_str_stays_str():
    _, body = decode(encode(Msg.ADD, "rid", {"b": b"raw", "s": "text"}, {}, 0.0))
    assert body[1] == {"b": b"raw", "s": "text"}
    assert type(body[1]["b"]) is bytes and type(body[1]["s"]) is str


def test_integer_map_keys_decode():
    _, body = decode(encode(Msg.OUTPUTS, "a/0", [], {0: "zero", 1: "one"}))
    assert body[2] == {0: "zero", 1: "one"}


def test_type_bytes_cover_every_message_with_distinct_bytes():
    assert set(TYPE_BYTES) == set(Msg)
    assert len(set(TYPE_BYTES.values())) == len(Msg)
    assert all(len(b) == 1 and b[0] == m for m, b in TYPE_BYTES.items())


def test_small_messages_stay_small():
    # positional arrays keep control messages a few dozen bytes
    assert len(encode(Msg.ABORT, ["0123456789abcdef0123456789abcdef"])) < 40
    assert encode(Msg.SHUTDOWN) == bytes([Msg.SHUTDOWN]) + b"\x90"


def test_encode_refuses_what_msgpack_cannot_carry():
    with pytest.raises(TypeError):
        encode(Msg.ADD, "rid", {"obj": object()}, {})


MALFORMED = {
    "empty": b"",
    "type byte only": bytes([Msg.SHUTDOWN]),
    "unknown type": b"\x63\x90",
    "type zero": b"\x00\x90",
    "reserved msgpack byte": bytes([Msg.ADD]) + b"\xc1",
    "truncated array": bytes([Msg.ADD]) + b"\x93\x01",
    "trailing bytes": bytes([Msg.ADD]) + b"\x90\x90",
    "invalid utf-8 str": bytes([Msg.ADD]) + b"\x91\xa2\xff\xfe",
    "map body": bytes([Msg.ADD]) + msgpack.packb({"request_id": "r"}),
    "int body": bytes([Msg.ADD]) + msgpack.packb(7),
    "str body": bytes([Msg.ADD]) + msgpack.packb("ADD"),
    "nil body": bytes([Msg.SHUTDOWN]) + msgpack.packb(None),
    "wrong arity": bytes([Msg.ADD]) + msgpack.packb(["r", {}]),
    "deep nesting": bytes([Msg.ADD]) + b"\x91" * 100_000 + b"\x90",
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_raise_protocol_error(frame):
    with pytest.raises(ProtocolError):
        decode(frame)


def test_protocol_error_says_what_was_wrong():
    with pytest.raises(ProtocolError, match="ADD body must be an array of 4 fields"):
        decode(bytes([Msg.ADD]) + msgpack.packb([1]))


def test_decode_accepts_frame_like_buffers():
    frame = encode(Msg.ABORT, ["r"])
    assert decode(bytearray(frame)) == (Msg.ABORT, [["r"]])
    assert decode(memoryview(frame)) == (Msg.ABORT, [["r"]])


def test_dispatch_routes_by_type():
    seen = []
    table = {Msg.ADD: lambda body: seen.append(("add", body)),
             Msg.ABORT: lambda body: seen.append(("abort", body))}
    dispatch(table, encode(Msg.ABORT, ["x"]))
    dispatch(table, encode(Msg.ADD, "r", {}, {}, 0.0))
    assert seen == [("abort", [["x"]]), ("add", ["r", {}, {}, 0.0])]


def test_dispatch_refuses_unhandled_types_and_malformed_frames():
    table = {Msg.ADD: lambda body: pytest.fail("must not be called")}
    with pytest.raises(ProtocolError, match="SHUTDOWN"):
        dispatch(table, encode(Msg.SHUTDOWN))
    with pytest.raises(ProtocolError):
        dispatch(table, bytes([Msg.ADD]) + b"\xc1")


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
        encode(Msg.ADD, "r", {"p": pickle}, {})
