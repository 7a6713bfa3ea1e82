"""omni/protocol.py without sockets: framing, round trips, malformed frames, dispatch."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from omni.protocol import (
    TYPE_FRAMES,
    Endpoints,
    Msg,
    ProtocolError,
    decode,
    dispatch,
    encode,
)

ROUND_TRIPS = [
    (Msg.ADD, ["req-1", {"prompt": "héllo ✓"}, {"chunks": 3, "temperature": 0.5}]),
    (Msg.ABORT, [["r1", "r2", "r3"]]),
    (Msg.SHUTDOWN, []),
    (Msg.READY, ["a/0", {"engine": "echo", "pid": 1234, "memory": 2**40}]),
    (Msg.OUTPUTS, ["a/0", [["r1", {"text": "x", "index": 0, "trace": ["a"]}, False, None],
                           ["r2", None, True, "boom"]], {"running": 1}]),
    (Msg.DEAD, ["a/0", "a/0 died: RuntimeError: x\n-- last log lines --\n..."]),
    (Msg.OUTPUTS, ["b/1", [["r", {"blob": b"\x00\x01\xff" * 100, "f": -1.5, "n": None,
                                  "big": -(2**63), "nested": {"1": [1, [2, [3]]]}},
                            True, None]], {}]),
]


@pytest.mark.parametrize(("kind", "fields"), ROUND_TRIPS, ids=lambda v: str(v)[:20])
def test_round_trip(kind, fields):
    frames = encode(kind, *fields)
    assert len(frames) == 2
    assert frames[0] == bytes([kind]) and len(frames[0]) == 1
    assert all(isinstance(f, bytes) for f in frames)
    assert decode(frames) == (kind, fields)
    got_kind, _ = decode(frames)
    assert type(got_kind) is Msg


def test_bytes_stay_bytes_and_str_stays_str():
    _, body = decode(encode(Msg.ADD, "rid", {"b": b"raw", "s": "text"}, {}))
    assert body[1] == {"b": b"raw", "s": "text"}
    assert type(body[1]["b"]) is bytes and type(body[1]["s"]) is str


def test_integer_map_keys_decode():
    _, body = decode(encode(Msg.OUTPUTS, "a/0", [], {0: "zero", 1: "one"}))
    assert body[2] == {0: "zero", 1: "one"}


def test_type_frames_cover_every_message_with_distinct_bytes():
    assert set(TYPE_FRAMES) == set(Msg)
    assert len(set(TYPE_FRAMES.values())) == len(Msg)
    assert all(len(frame) == 1 and frame[0] == m for m, frame in TYPE_FRAMES.items())


def test_small_messages_stay_small():
    # positional arrays keep control messages a few dozen bytes
    assert len(encode(Msg.ABORT, ["0123456789abcdef0123456789abcdef"])[1]) < 40
    assert encode(Msg.SHUTDOWN) == [bytes([Msg.SHUTDOWN]), b"\x90"]


def test_encode_refuses_what_msgpack_cannot_carry():
    with pytest.raises(TypeError):
        encode(Msg.ADD, "rid", {"obj": object()}, {})


MALFORMED = {
    "no frames": [],
    "one frame": [bytes([Msg.SHUTDOWN])],
    "three frames": [bytes([Msg.SHUTDOWN]), b"\x90", b"\x90"],
    "empty type frame": [b"", b"\x90"],
    "two-byte type frame": [bytes([Msg.SHUTDOWN, 0]), b"\x90"],
    "unknown type": [b"\x63", b"\x90"],
    "type zero": [b"\x00", b"\x90"],
    "empty body": [bytes([Msg.ADD]), b""],
    "reserved msgpack byte": [bytes([Msg.ADD]), b"\xc1"],
    "truncated array": [bytes([Msg.ADD]), b"\x93\x01"],
    "trailing bytes": [bytes([Msg.ADD]), b"\x90\x90"],
    "invalid utf-8 str": [bytes([Msg.ADD]), b"\x91\xa2\xff\xfe"],
    "map body": [bytes([Msg.ADD]), msgpack.packb({"request_id": "r"})],
    "int body": [bytes([Msg.ADD]), msgpack.packb(7)],
    "str body": [bytes([Msg.ADD]), msgpack.packb("ADD")],
    "nil body": [bytes([Msg.SHUTDOWN]), msgpack.packb(None)],
    "deep nesting": [bytes([Msg.ADD]), b"\x91" * 100_000 + b"\x90"],
}


@pytest.mark.parametrize("frames", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_raise_protocol_error(frames):
    with pytest.raises(ProtocolError):
        decode(frames)


def test_protocol_error_says_how_many_frames():
    with pytest.raises(ProtocolError, match="3 frames"):
        decode([b"\x01", b"\x90", b"\x90"])


def test_decode_accepts_frame_like_buffers():
    frames = encode(Msg.ABORT, ["r"])
    assert decode([bytearray(frames[0]), memoryview(frames[1])]) == (Msg.ABORT, [["r"]])


def test_dispatch_routes_by_type():
    seen = []
    table = {Msg.ADD: lambda body: seen.append(("add", body)),
             Msg.ABORT: lambda body: seen.append(("abort", body))}
    dispatch(table, encode(Msg.ABORT, ["x"]))
    dispatch(table, encode(Msg.ADD, "r", {}, {}))
    assert seen == [("abort", [["x"]]), ("add", ["r", {}, {}])]


def test_dispatch_refuses_unhandled_types_and_malformed_frames():
    table = {Msg.ADD: lambda body: pytest.fail("must not be called")}
    with pytest.raises(ProtocolError, match="SHUTDOWN"):
        dispatch(table, encode(Msg.SHUTDOWN))
    with pytest.raises(ProtocolError):
        dispatch(table, [bytes([Msg.ADD]), b"\xc1"])


def test_endpoints_are_plain_picklable_values():
    ends = Endpoints("ipc:///tmp/x/requests", "ipc:///tmp/x/results")
    assert pickle.loads(pickle.dumps(ends)) == ends
    with pytest.raises(AttributeError):
        ends.requests = "tcp://nowhere"  # type: ignore[misc]
