"""Connector backends in one process: inline and shm round trips, refs, arena bookkeeping.

For shm, one ShmConnector acts as producer (put/cleanup on its arena) and a second one as
consumer (get/release through its own mapping), as two processes would.
"""

from __future__ import annotations

import os
import time
import uuid

import msgpack
import pytest
import torch

from omni.connector import (
    ArenaFullError,
    AutoConnector,
    ConnectorError,
    InlineConnector,
    PayloadRef,
    ShmConnector,
    cleanup_stale,
    make_connector,
)
from omni.connector.base import REF_MARKER

BLOCK = 4096


def shm_names(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


@pytest.fixture
def prefix():
    p = f"omni-test-{uuid.uuid4().hex[:10]}"
    yield p
    left = shm_names(p)
    cleanup_stale(p)
    assert not left, f"segments left in /dev/shm: {left}"


@pytest.fixture
def pair(prefix):
    producer = ShmConnector(prefix, capacity_bytes=64 * BLOCK, block_size=BLOCK)
    consumer = ShmConnector(prefix + "-consumer")
    yield producer, consumer
    consumer.close()
    producer.close()


def wire(ref: PayloadRef) -> PayloadRef:
    """Through msgpack and back, as a control message would carry it."""
    data = msgpack.unpackb(msgpack.packb(ref.to_wire(), use_bin_type=True), raw=False)
    assert PayloadRef.is_ref(data)
    return PayloadRef.from_wire(data)


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (BLOCK + 3,), (0,), (4, 0, 2)]


def non_contiguous() -> list[torch.Tensor]:
    base = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6, 8, 3)
    return [base.transpose(0, 1), base[:, ::2], base[::3, 1:, ::2], base.permute(2, 0, 1),
            torch.arange(10.).flip(0),
            torch.randn(4, dtype=torch.complex64).conj(), base.expand(2, 6, 8, 3)]


@pytest.mark.parametrize("backend", ["inline", "shm"])
def test_round_trip_dtypes_and_shapes(backend, pair):
    producer, consumer = pair if backend == "shm" else (InlineConnector(), InlineConnector())
    for dtype in DTYPES:
        for shape in SHAPES:
            src = sample(dtype, shape)
            ref = wire(producer.put(src, owner="r1"))
            assert ref.backend == backend and ref.dtype == str(dtype)[6:]
            assert ref.shape == shape and ref.nbytes == src.numel() * src.element_size()
            out = consumer.get(ref)
            assert out.dtype == dtype and tuple(out.shape) == shape
            assert torch.equal(out, src), (dtype, shape)
            consumer.release(ref)
    if backend == "shm":
        assert producer.health()["blocks_in_use"] == 0


@pytest.mark.parametrize("backend", ["inline", "shm"])
def test_non_contiguous_inputs(backend, pair):
    producer, consumer = pair if backend == "shm" else (InlineConnector(), InlineConnector())
    for src in non_contiguous():
        ref = wire(producer.put(src, owner="r1"))
        out = consumer.get(ref)
        assert out.is_contiguous()
        assert torch.equal(out, src.resolve_conj())
        consumer.release(ref)


@pytest.mark.parametrize("backend", ["inline", "shm"])
def test_bytes_payloads(backend, pair):
    producer, consumer = pair if backend == "shm" else (InlineConnector(), InlineConnector())
    for value in (b"", b"x", os.urandom(BLOCK * 2 + 1), bytearray(b"abc"),
                  memoryview(b"0123456789")[2:8]):
        ref = wire(producer.put(value, owner="r1"))
        assert ref.dtype == "bytes" and ref.shape == (len(value),)
        out = consumer.get(ref)
        assert isinstance(out, bytes) and out == bytes(value)
        consumer.release(ref)


def test_inline_tensor_is_owned_and_writable():
    conn = InlineConnector()
    src = torch.arange(4, dtype=torch.int32)
    out = conn.get(wire(conn.put(src, owner="r")))
    out += 1  # writable, and not aliasing the source
    assert src.tolist() == [0, 1, 2, 3] and out.tolist() == [1, 2, 3, 4]
    assert conn.cleanup("r") == 0


def test_shm_get_is_zero_copy_view(pair):
    producer, consumer = pair
    ref = producer.put(torch.zeros(16), owner="r")
    a, b = consumer.get(ref), consumer.get(ref)
    a[3] = 7.0  # same memory: both views see it (consumers must treat views as read-only)
    assert b[3] == 7.0
    consumer.release(ref)


def test_reserve_writes_in_place(pair):
    producer, consumer = pair
    ref, view = producer.reserve((3, 4), torch.float32, owner="r")
    view.copy_(torch.arange(12.).reshape(3, 4))
    assert torch.equal(consumer.get(wire(ref)), torch.arange(12.).reshape(3, 4))
    consumer.release(ref)
    assert producer.health()["blocks_in_use"] == 0


def test_wire_round_trip_and_marker():
    ref = PayloadRef("shm", "r/1", "r", "bfloat16", (2, 3), 12, ["omni-x-1", 4096, 0, 1])
    data = ref.to_wire()
    assert data[0] == REF_MARKER
    assert wire(ref) == ref
    inline = PayloadRef("inline", "r/2", "r", "bytes", (3,), 3, b"abc")
    assert wire(inline) == inline
    assert len(msgpack.packb(ref.to_wire(), use_bin_type=True)) < 64
    assert not PayloadRef.is_ref(["ref", 1, 2]) and not PayloadRef.is_ref("x")


GOOD = [REF_MARKER, "shm", "r/1", "r", "float32", [2, 2], 16, ["seg", 4096, 0, 1]]


@pytest.mark.parametrize("index,value", [
    (1, "cuda_magic"), (2, 5), (3, None), (4, "float128"), (4, 3), (5, [2, -2]),
    (5, [2.0, 2]), (5, "22"), (6, 15), (6, "16"), (7, ["seg", 4096, 0]),
    (7, [1, 4096, 0, 1]), (7, ["seg", "4096", 0, 1]), (7, b"x" * 16),
])
def test_malformed_wire(index, value):
    data = list(GOOD)
    data[index] = value
    with pytest.raises(ValueError):
        PayloadRef.from_wire(data)


@pytest.mark.parametrize("data", [None, [], GOOD[:-1], GOOD + [1], ["x"] + GOOD[1:],
                                  [REF_MARKER, "inline", "k", "o", "bytes", [3], 3, b"ab"],
                                  [REF_MARKER, "inline", "k", "o", "bytes", [1, 3], 3, b"abc"]])
def test_malformed_wire_structure(data):
    with pytest.raises(ValueError):
        PayloadRef.from_wire(data)
    PayloadRef.from_wire(GOOD)  # the template itself is fine


def test_ref_outside_arena_is_refused(pair):
    producer, consumer = pair
    ref = producer.put(torch.ones(4), owner="r")
    seg, offset, block, tag = ref.location
    for loc in ([seg, offset + 8, block, tag], [seg, offset, 10_000, tag], [seg, offset, block, 0]):
        bad = PayloadRef.from_wire(ref.to_wire()[:-1] + [loc])
        with pytest.raises(ConnectorError):
            consumer.get(bad)
    with pytest.raises(ConnectorError, match="gone"):
        consumer.get(PayloadRef.from_wire(ref.to_wire()[:-1] + [[seg + "-nope", offset, 0, 1]]))


def test_arena_reuse_after_release(pair):
    producer, consumer = pair
    first = [producer.put(torch.full((BLOCK // 4,), float(i)), owner=f"r{i}") for i in range(64)]
    assert producer.health()["blocks_in_use"] == 64  # full
    for ref in first:
        assert consumer.get(ref)[0] == float(int(ref.owner[1:]))
        consumer.release(ref)
    t0 = time.monotonic()
    second = [producer.put(torch.full((BLOCK // 4,), -1.0), owner="again") for _ in range(64)]
    assert time.monotonic() - t0 < 1.0  # no backpressure wait: all reclaimed
    assert sorted(r.location[2] for r in second) == list(range(64))
    assert all(s.location[3] != f.location[3] for s, f in zip(second, first, strict=True))
    health = producer.health()
    assert health["blocks_in_use"] == 64 and health["reclaimed"] == 64


def test_first_fit_multi_block_runs(pair):
    producer, consumer = pair
    a = producer.put(torch.zeros(3 * BLOCK, dtype=torch.uint8), owner="a")
    b = producer.put(torch.zeros(BLOCK + 1, dtype=torch.uint8), owner="b")
    assert (a.location[2], b.location[2]) == (0, 3)
    consumer.release(a)
    c = producer.put(torch.zeros(2 * BLOCK, dtype=torch.uint8), owner="c")
    assert c.location[2] == 0  # the freed run is reused first
    assert producer.health()["blocks_in_use"] == 4


def test_cleanup_frees_owner(pair):
    producer, consumer = pair
    for _ in range(5):
        producer.put(torch.zeros(BLOCK), owner="doomed")  # 4 blocks each
    keep = producer.put(torch.zeros(10), owner="keep")
    released = producer.put(torch.zeros(10), owner="doomed")
    consumer.release(released)
    assert producer.cleanup("doomed") in (5, 6)  # the released one may be reclaimed first
    assert producer.cleanup("doomed") == 0
    health = producer.health()
    assert health["blocks_in_use"] == 1 and health["owners"] == 1
    assert torch.equal(consumer.get(keep), torch.zeros(10))


def test_late_release_after_cleanup_does_not_free_new_payload(pair):
    producer, consumer = pair
    old = producer.put(torch.zeros(10), owner="aborted")
    producer.cleanup("aborted")
    new = producer.put(torch.ones(10), owner="next")
    assert new.location[2] == old.location[2] and new.location[3] != old.location[3]
    consumer.release(old)  # late release of the aborted request's ref
    assert producer.health()["blocks_in_use"] == 1
    assert torch.equal(consumer.get(new), torch.ones(10))


def test_full_arena_backpressure_then_error(pair):
    producer, _ = pair
    for _ in range(16):
        producer.put(torch.zeros(BLOCK), owner="hog")  # 16 x 4 blocks = whole arena
    t0 = time.monotonic()
    with pytest.raises(ArenaFullError, match="'late'") as err:
        producer.put(torch.zeros(1), owner="late", timeout_s=0.2)
    waited = time.monotonic() - t0
    assert 0.2 <= waited < 1.0
    assert "capacity 262144" in str(err.value)
    health = producer.health()
    assert health["full_errors"] == 1 and health["blocks_in_use"] == 64


def test_backpressure_wait_ends_when_released(pair):
    producer, consumer = pair
    refs = [producer.put(torch.zeros(BLOCK), owner="hog") for _ in range(16)]
    import threading
    timer = threading.Timer(0.1, consumer.release, args=(refs[5],))
    timer.start()
    t0 = time.monotonic()
    ref = producer.put(torch.zeros(BLOCK), owner="waiter", timeout_s=5.0)
    assert 0.05 < time.monotonic() - t0 < 2.0
    assert ref.location[2] == refs[5].location[2]
    timer.join()


def test_payload_larger_than_arena(pair):
    producer, _ = pair
    t0 = time.monotonic()
    with pytest.raises(ConnectorError, match="larger than the whole") as err:
        producer.put(torch.zeros(64 * BLOCK + 1, dtype=torch.uint8), owner="big", timeout_s=5)
    assert not isinstance(err.value, ArenaFullError)
    assert time.monotonic() - t0 < 0.5


def test_health_numbers(pair):
    producer, consumer = pair
    assert producer.health()["capacity_bytes"] == 0  # arena not created yet
    r1 = producer.put(torch.zeros(100, dtype=torch.uint8), owner="a")
    producer.put(torch.zeros(BLOCK + 1, dtype=torch.uint8), owner="b")
    h = producer.health()
    assert h["capacity_bytes"] == 64 * BLOCK and h["blocks_total"] == 64
    assert h["blocks_in_use"] == 3 and h["used_bytes"] == 3 * BLOCK
    assert h["payload_bytes"] == 100 + BLOCK + 1 and h["payloads_in_use"] == 2
    assert h["owners"] == 2 and h["puts"] == 2 and h["longest_free_blocks"] == 61
    consumer.get(r1)
    consumer.release(r1)
    assert consumer.health()["gets"] == 1 and consumer.health()["releases"] == 1
    assert consumer.health()["attached_segments"] == 1
    assert producer.health()["blocks_in_use"] == 2


def test_close_leaves_nothing(prefix):
    producer = ShmConnector(prefix, capacity_bytes=16 * BLOCK, block_size=BLOCK)
    consumer = ShmConnector(prefix + "-c")
    ref = producer.put(torch.ones(8), owner="r")
    view = consumer.get(ref)
    assert shm_names(prefix) == [producer.segment_name]
    producer.close()
    assert shm_names(prefix) == []
    assert torch.equal(view, torch.ones(8))  # the consumer's mapping outlives the unlink
    del view
    consumer.close()
    producer.close()  # idempotent
    with pytest.raises(ConnectorError):
        producer.put(torch.ones(1), owner="r")


def test_cleanup_stale_removes_prefix(prefix):
    producers = [ShmConnector(f"{prefix}-{i}", capacity_bytes=BLOCK, block_size=BLOCK)
                 for i in range(2)]
    for p in producers:
        p.open_arena()
    assert len(shm_names(prefix)) == 2
    assert cleanup_stale(f"{prefix}-0") == [producers[0].segment_name]
    assert cleanup_stale(prefix) == [producers[1].segment_name]
    assert shm_names(prefix) == []
    for p in producers:
        p.close()  # already unlinked: no error
    with pytest.raises(ValueError):
        cleanup_stale("")


def test_make_connector_and_auto(prefix):
    assert isinstance(make_connector("inline", name=prefix), InlineConnector)
    with pytest.raises(ConnectorError):
        make_connector("tcp", name=prefix)  # no such backend
    with pytest.raises(ConnectorError):
        make_connector("nope", name=prefix)
    auto = make_connector("auto", name=prefix, capacity_bytes=1 << 20, inline_threshold=1024)
    reader = make_connector("auto", name=prefix + "-r")
    assert isinstance(auto, AutoConnector)
    small, big = torch.arange(255, dtype=torch.int32), torch.arange(256, dtype=torch.int32)
    r_small, r_big = auto.put(small, owner="r"), auto.put(big, owner="r")
    assert (r_small.backend, r_big.backend) == ("inline", "shm")
    assert torch.equal(reader.get(wire(r_small)), small)
    assert torch.equal(reader.get(wire(r_big)), big)
    reader.release(r_small)
    reader.release(r_big)
    assert auto.health()["shm"]["blocks_in_use"] == 0
    assert auto.cleanup("r") == 0
    reader.close()
    auto.close()


def test_consumer_lets_go_of_a_dead_producers_arena(prefix):
    """A producer dies and the launcher unlinks its arena; its restart makes a new one.
    The first payload from the new arena makes the consumer close its mapping of the old
    one (each restart used to leave the old arena's pages mapped in every consumer)."""
    consumer = ShmConnector(prefix + "-consumer")
    old = ShmConnector(prefix + "-a", capacity_bytes=8 * BLOCK, block_size=BLOCK)
    ref = wire(old.put(torch.arange(64.0), owner="r1"))
    assert torch.equal(consumer.get(ref).clone(), torch.arange(64.0))
    consumer.release(ref)
    assert list(consumer._mappings) == [old.segment_name]
    old.close()  # the launcher's unlink of a dead replica's arena
    new = ShmConnector(prefix + "-a", capacity_bytes=8 * BLOCK, block_size=BLOCK)
    try:
        ref = wire(new.put(torch.ones(64), owner="r2"))
        assert torch.equal(consumer.get(ref).clone(), torch.ones(64))
        consumer.release(ref)
        assert list(consumer._mappings) == [new.segment_name]  # the old mapping is closed
    finally:
        consumer.close()
        new.close()
