"""The mooncake consumer's receive pool (omni/connector/mooncake_pool.py): a get's view lives
until its release (or forget), then its buffer serves the next get; the pool keeps to its
bound (idle buffers evicted oldest first, fresh buffers beyond it); failed reads, forgets,
a ref read twice and close leave nothing lent; PayloadPlane's forget and done give the
buffers back. Producer and consumers talk over loopback TCP, each with its own engine.
"""

from __future__ import annotations

import os

import msgpack
import pytest
import torch

from omni.connector import ConnectorError, PayloadRef

try:
    from omni.connector.mooncake import MooncakeConnector
    from omni.connector.mooncake_pool import RecvPool, size_class
except ImportError as exc:  # engine.so, or libibverbs.so.1 which it links even for TCP
    pytest.skip(f"Mooncake transfer engine not importable ({exc})", allow_module_level=True)

pytestmark = pytest.mark.timeout(90)

KiB, MiB = 1024, 1024 * 1024
IO_TIMEOUT_S = 2.0
for _var in ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC"):
    os.environ.setdefault(_var, str(int(IO_TIMEOUT_S)))  # process-wide: as the other file


def connector(name: str, **kw) -> MooncakeConnector:
    return MooncakeConnector(name, io_timeout_s=IO_TIMEOUT_S, **kw)


@pytest.fixture(scope="module")
def producer():
    p = connector("pool-producer", capacity_bytes=64 * MiB, put_timeout_s=1.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def consumer():
    c = connector("pool-consumer")
    yield c
    c.close()


def wire(ref: PayloadRef) -> PayloadRef:
    return PayloadRef.from_wire(msgpack.unpackb(msgpack.packb(ref.to_wire()), raw=False))


def sample(dtype: torch.dtype, nbytes: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    count = nbytes // dtype.itemsize
    if dtype.is_floating_point:
        return torch.randn(count, generator=gen).to(dtype)
    return torch.randint(-2**40, 2**40, (count,), dtype=dtype, generator=gen)


def pool_stats(consumer: MooncakeConnector) -> dict[str, int]:
    return {k.removeprefix("recv_pool_"): v for k, v in consumer.health().items()
            if k.startswith("recv_pool_")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_views_live_until_release_then_their_buffer_serves_again(producer, dtype):
    sizes = [64 * KiB, 100 * KiB + 64, 1 * MiB, 3 * MiB]
    with connector("c-pool") as reader:
        for n in sizes:
            values = [sample(dtype, n, seed=n + i) for i in range(3)]
            refs = [wire(producer.put(v, owner="pool")) for v in values]
            first = reader.get(refs[0])
            second = reader.get(refs[1])  # the first is still held: another buffer
            assert second.data_ptr() != first.data_ptr()
            assert torch.equal(first, values[0]) and torch.equal(second, values[1])
            ptr = first.data_ptr()
            reader.release(refs[0])
            third = reader.get(refs[2])
            assert third.data_ptr() == ptr and torch.equal(third, values[2])  # reused
            assert torch.equal(second, values[1])  # held views are untouched by it
            assert third.dtype == dtype and third.shape == values[2].shape
            reader.release(refs[1])
            reader.release(refs[2])
        stats = pool_stats(reader)
        assert stats["lent"] == 0 and stats["fresh"] == 0 and stats["retired"] == 0
        assert stats["made"] == 2 * len(sizes) and stats["reused"] == len(sizes)
        assert stats["used_bytes"] == stats["idle_bytes"] <= stats["bytes"]
    assert producer.health()["blocks_in_use"] == 0  # close() drained the releases


def test_pool_stays_within_its_bound(producer):
    with connector("c-bound", recv_pool_bytes=1 * MiB) as reader:
        values = [sample(torch.float32, 512 * KiB, seed=i) for i in range(3)]
        refs = [wire(producer.put(v, owner="bound")) for v in values]
        got = [reader.get(ref) for ref in refs]  # two fill the bound, the third is fresh
        assert all(torch.equal(g, v) for g, v in zip(got, values, strict=True))
        stats = pool_stats(reader)
        assert (stats["made"], stats["fresh"], stats["lent"]) == (2, 1, 2)
        assert stats["used_bytes"] == 1 * MiB
        for ref in refs:
            reader.release(ref)
        assert torch.equal(got[2], values[2])  # a fresh buffer is the caller's own
        assert pool_stats(reader)["idle_bytes"] == 1 * MiB
        big = sample(torch.float32, 1 * MiB, seed=9)
        ref = wire(producer.put(big, owner="bound"))
        assert torch.equal(reader.get(ref), big)  # both idle buffers evicted for it
        stats = pool_stats(reader)
        assert (stats["evicted"], stats["lent"], stats["used_bytes"]) == (2, 1, 1 * MiB)
        reader.release(ref)
        huge = sample(torch.float32, 3 * MiB, seed=10)  # larger than the bound: fresh
        ref = wire(producer.put(huge, owner="bound"))
        assert torch.equal(reader.get(ref), huge)
        reader.release(ref)
        stats = pool_stats(reader)
        assert stats["fresh"] == 2 and stats["used_bytes"] <= 1 * MiB and stats["lent"] == 0
    assert producer.health()["blocks_in_use"] == 0


def test_forget_gives_the_buffer_back_without_releasing(producer):
    with connector("c-forget") as reader:
        value = sample(torch.float32, 256 * KiB, seed=4)
        ref = wire(producer.put(value, owner="fg"))
        ptr = reader.get(ref).data_ptr()
        reader.forget(ref)
        reader.forget(ref)  # nothing lent any more: a no-op
        assert pool_stats(reader)["lent"] == 0 and reader.health()["forgotten"] == 1
        reader.drain()
        producer.health()  # reclaims whatever was released: not this one
        assert producer.cleanup("fg") == 1
        ref = wire(producer.put(value + 1, owner="fg2"))
        assert reader.get(ref).data_ptr() == ptr  # the forgotten buffer, reused
        reader.release(ref)


def test_same_ref_twice_and_close_with_views_held(producer):
    reader = connector("c-twice")
    value = sample(torch.int64, 128 * KiB, seed=5)
    ref = wire(producer.put(value, owner="tw"))
    a, b = reader.get(ref), reader.get(ref)
    assert a.data_ptr() != b.data_ptr() and pool_stats(reader)["lent"] == 2
    reader.release(ref)  # the first get's buffer goes back
    assert pool_stats(reader)["lent"] == 1
    assert reader.get(ref).data_ptr() == a.data_ptr()
    reader.release(ref)
    reader.close()  # b still held: its memory stays b's
    assert torch.equal(b, value)
    assert producer.health()["blocks_in_use"] == 0  # the one release landed


def test_payload_plane_forget_and_done_give_buffers_back(producer):
    from omni.wire.payloads import PayloadPlane

    plane = PayloadPlane("test-mooncake-plane")
    try:
        values = [sample(torch.float32, 128 * KiB, seed=i) for i in range(2)]
        wires = [producer.put(v, owner=f"pp{i}").to_wire() for i, v in enumerate(values)]
        for i, w in enumerate(wires):
            assert torch.equal(plane.get(f"r{i}", w), values[i])
        reader = plane.connector.mooncake
        assert pool_stats(reader)["lent"] == 2
        plane.forget("r0")  # aborted: buffer back, payload not released
        plane.done("r1")  # finished: buffer back, payload released
        reader.drain()
        assert pool_stats(reader)["lent"] == 0
        producer.health()
        assert producer.cleanup("pp0") == 1 and producer.cleanup("pp1") == 0
    finally:
        plane.close()


class FakeEngine:
    def __init__(self) -> None:
        self.registered: set[int] = set()
        self.pinned: list[torch.Tensor] = []

    def register(self, buf: torch.Tensor) -> None:
        self.registered.add(buf.data_ptr())

    def unregister(self, ptr: int) -> None:
        self.registered.discard(ptr)

    def pin(self, buf: torch.Tensor) -> None:
        self.pinned.append(buf)


def test_recv_pool_classes_eviction_and_retire():
    assert [size_class(n) for n in (1, 64 * KiB, 64 * KiB + 1, 1 * MiB, 1 * MiB + 1,
                                    20_000_000)] == [
        64 * KiB, 64 * KiB, 80 * KiB, 1 * MiB, 1280 * KiB, 20 * MiB]
    engine = FakeEngine()
    pool = RecvPool(engine, 2 * MiB)
    a, b = pool.take(1 * MiB), pool.take(512 * KiB)
    assert {a.data_ptr(), b.data_ptr()} <= engine.registered  # registered once, when made
    pool.keep("a", a)
    pool.keep("b", b)
    assert pool.give("b") and pool.give("a") and not pool.give("a")
    c = pool.take(700 * KiB)  # 768 KiB class: evicts the oldest idle buffer (b) only
    assert c.numel() == 768 * KiB and pool.stats["evicted"] == 1
    assert b.data_ptr() not in engine.registered and a.data_ptr() in engine.registered
    assert pool.take(1 * MiB).data_ptr() == a.data_ptr()  # idle, same class: reused
    pool.retire(c)  # a read that may still land: unregistered, pinned, out of the bytes
    assert c.data_ptr() not in engine.registered and engine.pinned == [c]
    assert pool.usage()["recv_pool_used_bytes"] == 1 * MiB
    fresh = pool.take(2 * MiB)  # no room: a fresh buffer, registered for its read only
    assert fresh.numel() == 2 * MiB and fresh.data_ptr() in engine.registered
    pool.keep("f", fresh)
    assert fresh.data_ptr() not in engine.registered and not pool.give("f")
    assert pool.stats["fresh"] == 1 and pool.usage()["recv_pool_used_bytes"] == 1 * MiB


def test_failed_read_gives_its_buffer_back(producer, consumer):
    ref = producer.put(torch.arange(1000), owner="f")
    assert torch.equal(consumer.get(ref), torch.arange(1000))
    consumer.release(ref)
    before = pool_stats(consumer)
    out_of_arena = [*ref.location[:2], ref.location[2] + 200 * MiB, *ref.location[3:]]
    for _ in range(3):
        with pytest.raises(ConnectorError, match="failed"):
            consumer.get(PayloadRef.from_wire([*ref.to_wire()[:7], out_of_arena]))
    after = pool_stats(consumer)  # the read ended (refused): its buffer is reused, not lost
    assert after["lent"] == before["lent"] and after["retired"] == before["retired"]
    assert after["used_bytes"] == before["used_bytes"] and after["made"] == before["made"]
