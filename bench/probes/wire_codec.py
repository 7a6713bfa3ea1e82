"""Encode + decode of one control message, three ways: the msgpack positional lists omni
spoke before (a type byte, then a msgpack array, then the receivers' shape checks), the
msgspec tagged union of omni/wire/protocol.py, and the same structs behind a type byte
(one untagged decoder per type, as vLLM's engine core picks its decoder from a type frame).

    OMP_NUM_THREADS=1 python bench/probes/wire_codec.py [ROUNDS]

Messages: an Add (a 32-hex request id, a 400-character prompt, a payload ref, 3 params)
and the Outputs of a step of 8 requests (a token each, the engine's stats, hop times),
the two that every request's every step pays. The sides take turns; prints the median of 7
turns, in microseconds per encode and per decode, and each frame's size.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import msgpack
import msgspec

from omni.wire.protocol import Add, Outputs, Row, decode_command, decode_report, encode

RID = "0123456789abcdef0123456789abcdef#0"
REF = ["\x00ref", "omni-1-a-thinker-0", 4096, 2048, "bfloat16", [1, 1024], 7]
INPUTS = {"prompt": "word " * 80, "audio": REF, "stream": ["client"]}
PARAMS = {"max_tokens": 256, "temperature": 0.7, "session": "s-1"}
ROWS = [(f"{RID[:-2]}{i:02d}#0", {"text": "tok", "index": 40, "token_ids": [1234]}, False,
         None) for i in range(8)]
STATS = {"running": 8, "waiting": 0, "kv_blocks_used": 312, "shm_used_bytes": 1 << 20}
INBOUND = {rid: [0.0001, 0.0002, 1, 0.0001, 0.0002] for rid, *_ in ROWS[:2]}


# -- before: a type byte and a positional msgpack array, checked by each receiver --------
_packer = msgpack.Packer(use_bin_type=True)


def old_encode(kind: int, *fields: Any) -> bytes:
    return bytes([kind]) + _packer.pack(list(fields))


def old_decode(frame: bytes, arity: dict[int, int]) -> tuple[int, list]:
    view = memoryview(frame)
    kind = view[0]
    body = msgpack.unpackb(view[1:], raw=False, strict_map_key=False)
    if not isinstance(body, list) or len(body) != arity[kind]:
        raise ValueError("arity")
    return kind, body


def old_decode_add(frame: bytes) -> list:
    _, body = old_decode(frame, {1: 4})
    if not isinstance(body[0], str):  # protocol.check_inbound
        raise ValueError("ADD")
    return body


def old_decode_outputs(frame: bytes) -> list:
    _, body = old_decode(frame, {11: 3})
    rows, stats = body[1], body[2]  # protocol.check_outputs
    if body[0] != "s/0" or not isinstance(rows, list) or not isinstance(stats, dict) or not all(
            isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
            and (r[3] is None or (isinstance(r[3], list) and len(r[3]) == 2)) for r in rows):
        raise ValueError("OUTPUTS")
    return body


# -- the same structs behind a type byte ---------------------------------------------------
class _Plain(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    pass


class PAdd(_Plain):
    request_id: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    sent_at: float


class POutputs(_Plain):
    replica_id: str
    rows: list[Row]
    sent_at: float
    stats: dict[str, Any] = {}
    inbound: dict[str, tuple[float, float, int, float, float]] = {}
    step_s: list[float] = []
    gc_s: list[float] = []


_enc = msgspec.msgpack.Encoder()
_prefixed = {1: msgspec.msgpack.Decoder(PAdd), 11: msgspec.msgpack.Decoder(POutputs)}
_prefix_byte = {PAdd: b"\x01", POutputs: b"\x0b"}


def prefixed_encode(message: Any) -> bytes:
    return _prefix_byte[type(message)] + _enc.encode(message)


def prefixed_decode(frame: bytes) -> Any:
    view = memoryview(frame)
    return _prefixed[view[0]].decode(view[1:])


# -- timing ---------------------------------------------------------------------------------
def per_call_us(fn: Any, rounds: int) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    now = time.monotonic()
    sides = {  # each encode builds its rows and stats, as the engine loop does per step
        "old (type byte + positional msgpack, checks)": (
            lambda: old_encode(1, RID, INPUTS, PARAMS, now), old_decode_add,
            lambda: old_encode(11, "s/0", [list(r) for r in ROWS],
                               {**STATS, "inbound": INBOUND, "step_s": [0.01], "gc_s": [],
                                "sent_at": now}), old_decode_outputs),
        "new (msgspec tagged union, omni/wire/protocol.py)": (
            lambda: encode(Add(RID, INPUTS, PARAMS, now)), decode_command,
            lambda: encode(Outputs("s/0", [Row(*r) for r in ROWS], now, STATS, INBOUND,
                                   [0.01], [])),
            decode_report),
        "alt (msgspec structs behind a type byte)": (
            lambda: prefixed_encode(PAdd(RID, INPUTS, PARAMS, now)), prefixed_decode,
            lambda: prefixed_encode(POutputs("s/0", [Row(*r) for r in ROWS], now, STATS,
                                             INBOUND, [0.01], [])),
            prefixed_decode),
    }
    cases = {}  # (side, message) -> (encode, decode of its frame, frame size)
    for side, (add_enc, add_dec, out_enc, out_dec) in sides.items():
        for name, enc, dec in (("Add", add_enc, add_dec), ("Outputs", out_enc, out_dec)):
            frame = enc()
            dec(frame)  # decodes, and passes its checks
            cases[side, name] = (enc, lambda f=frame, d=dec: d(f), len(frame))
    times: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in cases}
    for _ in range(7):  # the sides take turns, so a busy moment of the host hits them alike
        for key, (enc, dec, _) in cases.items():
            times[key].append((per_call_us(enc, rounds), per_call_us(dec, rounds)))
    print(f"[wire_codec] median of 7 turns x {rounds} calls, us per call")
    print(f"{'side':52} {'message':8} {'bytes':>6} {'encode':>7} {'decode':>7} {'both':>7}")
    for (side, name), (_, _, size) in cases.items():
        e = statistics.median(t[0] for t in times[side, name])
        d = statistics.median(t[1] for t in times[side, name])
        print(f"{side:52} {name:8} {size:6d} {e:7.2f} {d:7.2f} {e + d:7.2f}")


if __name__ == "__main__":
    main()
