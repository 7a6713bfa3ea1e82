"""The mooncake connector over loopback TCP: round trips, backpressure, cleanup, refs on the
wire, a producer in another process (released blocks come back; killed or hung it fails
in bounded time) and 1,000 payloads with a third of their requests cleaned up instead.
The consumer's receive pool: test_mooncake_pool.py.

Releases are posted without waiting: a test that looks at the producer's blocks right
after a release first drains the consumer's posted releases (``in_use``, ``drain``).

Every connector here starts its own transfer engine (producer and consumer in one process
talk through the engines' TCP ports like two hosts would).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import msgpack
import pytest
import torch

from omni.connector import (
    ArenaFullError,
    AutoConnector,
    ConnectorError,
    PayloadRef,
    make_connector,
)

try:
    from omni.connector.mooncake import MooncakeConnector
except ImportError as exc:  # engine.so, or libibverbs.so.1 which it links even for TCP
    pytest.skip(f"Mooncake transfer engine not importable ({exc}): needs the Python package "
                f"mooncake-transfer-engine (non-cuda) and libibverbs.so.1 (Debian: "
                f"libibverbs1)", allow_module_level=True)

pytestmark = pytest.mark.timeout(90)  # a hang fails the test instead of the run

KiB, MiB = 1024, 1024 * 1024
IO_TIMEOUT_S = 2.0  # probe and no-progress timeout of every engine here
# The no-progress timeout is process-wide (the first engine's wins): pin it for every test
# order, and for the spawned producers, which inherit it.
for _var in ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC"):
    os.environ.setdefault(_var, str(int(IO_TIMEOUT_S)))


def connector(name: str, **kw) -> MooncakeConnector:
    return MooncakeConnector(name, io_timeout_s=IO_TIMEOUT_S, **kw)


@pytest.fixture(scope="module")
def producer():
    p = connector("test-producer", capacity_bytes=80 * MiB, put_timeout_s=1.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def consumer():
    c = connector("test-consumer")
    yield c
    c.close()


def wire(ref: PayloadRef) -> PayloadRef:
    """Through msgpack and back, as a control message would carry it."""
    return PayloadRef.from_wire(msgpack.unpackb(msgpack.packb(ref.to_wire()), raw=False))


def sample(dtype: torch.dtype, nbytes: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    count = nbytes // dtype.itemsize
    if dtype.is_floating_point:
        return torch.randn(count, generator=gen).to(dtype)
    high = 2**40 if dtype.itemsize == 8 else 2**30
    return torch.randint(-high, high, (count,), dtype=dtype, generator=gen)


def in_use(producer: MooncakeConnector, consumer: MooncakeConnector) -> tuple[int, int]:
    consumer.drain()
    health = producer.health()
    return health["blocks_in_use"], health["payload_bytes"]


@pytest.mark.parametrize("nbytes", [64 * KiB, 1 * MiB, 16 * MiB])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_round_trip_tensors(producer, consumer, dtype, nbytes):
    value = sample(dtype, nbytes, seed=nbytes).view(-1, 64)
    assert value.unique().numel() > 16  # variety, so a wrong offset cannot pass
    ref = wire(producer.put(value, owner="req"))
    got = consumer.get(ref)
    assert got.dtype == dtype and got.shape == value.shape and torch.equal(got, value)
    consumer.release(ref)
    assert in_use(producer, consumer) == (0, 0)


@pytest.mark.parametrize("nbytes", [0, 5, 64 * KiB, 1 * MiB + 3, 16 * MiB])
def test_round_trip_bytes(producer, consumer, nbytes):
    value = os.urandom(nbytes)
    ref = wire(producer.put(bytearray(value), owner="req"))
    got = consumer.get(ref)
    assert isinstance(got, bytes) and got == value
    consumer.release(ref)
    assert in_use(producer, consumer) == (0, 0)


def test_non_contiguous_and_empty(producer, consumer):
    base = sample(torch.float32, 1 * MiB, seed=7).view(512, 512)
    cases = [base.t(), base[::3, 1::2], base[5], torch.empty(0, 3), torch.tensor(2.5)]
    refs = [wire(producer.put(value, owner="nc")) for value in cases]
    got = [consumer.get(ref) for ref in refs]
    for view, value in zip(got, cases, strict=True):  # all held at once: all intact
        assert view.shape == value.shape and torch.equal(view, value)
    for ref in refs:
        consumer.release(ref)
    assert in_use(producer, consumer) == (0, 0)


def test_capacity_waits_then_raises(consumer):
    with connector("small", capacity_bytes=256 * KiB, put_timeout_s=0.3) as small:
        refs = [small.put(sample(torch.float32, 64 * KiB, i), owner="fill") for i in range(4)]
        t0 = time.monotonic()
        with pytest.raises(ArenaFullError, match="full for 0.3 s"):
            small.put(b"x", owner="late")
        assert 0.25 < time.monotonic() - t0 < 2.0
        # A release during the wait lets the put through.
        releaser = threading.Timer(0.2, consumer.release, args=(refs[2],))
        releaser.start()
        t0 = time.monotonic()
        ref = small.put(sample(torch.float32, 64 * KiB, 9), owner="late", timeout_s=5.0)
        assert 0.15 < time.monotonic() - t0 < 4.0
        assert ref.location[3] == refs[2].location[3]  # the released block, reused
        assert torch.equal(consumer.get(ref), sample(torch.float32, 64 * KiB, 9))
        # Larger than the whole arena: refused at once, no wait.
        t0 = time.monotonic()
        with pytest.raises(ConnectorError, match="larger than the whole") as info:
            small.put(bytes(256 * KiB + 1), owner="huge", timeout_s=5.0)
        assert not isinstance(info.value, ArenaFullError) and time.monotonic() - t0 < 0.5
        assert small.health()["full_errors"] == 1


def test_cleanup_frees_only_that_owner(producer, consumer):
    a = [producer.put(sample(torch.float32, 100 * KiB, i), owner="a") for i in range(3)]
    b = [producer.put(sample(torch.int64, 64 * KiB, i), owner="b") for i in range(2)]
    assert producer.cleanup("a") == 3
    assert in_use(producer, consumer) == (2, 2 * 64 * KiB)
    for i, ref in enumerate(b):
        assert torch.equal(consumer.get(ref), sample(torch.int64, 64 * KiB, i))
        consumer.release(ref)
    consumer.release(a[0])  # late release of a cleaned-up run: ignored
    assert in_use(producer, consumer) == (0, 0) and producer.cleanup("a") == 0


def test_wire_round_trip_and_bad_locations(producer, consumer):
    ref = producer.put(torch.arange(10), owner="w")
    back = wire(ref)
    assert back == ref and back.location[0] == producer.session
    session, base, offset, block, tag = ref.location
    assert session.startswith("127.0.0.1:") and base > 0 and 1 <= tag <= 255
    for bad in ([session, base, offset, block], [session, str(base), offset, block, tag],
                [session, base, offset, block, tag, 0], "127.0.0.1:1", None):
        with pytest.raises(ValueError, match="bad mooncake location"):
            PayloadRef.from_wire([*ref.to_wire()[:7], bad])
    for bad in ([session, base, offset, block, 0], [session, base, block, block, tag],
                [session, 0, offset, block, tag]):
        with pytest.raises(ConnectorError, match="points outside"):
            consumer.get(PayloadRef.from_wire([*ref.to_wire()[:7], bad]))
    out_of_arena = [session, base, offset + 200 * MiB, block, tag]  # the producer refuses
    with pytest.raises(ConnectorError, match=f"from {session} failed"):
        consumer.get(PayloadRef.from_wire([*ref.to_wire()[:7], out_of_arena]))
    consumer.release(ref)


def test_unreachable_producer_fails_at_once(consumer):
    ref = PayloadRef("mooncake", "k/1", "k", "uint8", (4,), 4, ["127.0.0.1:1", 4096, 4096, 0, 1])
    t0 = time.monotonic()
    with pytest.raises(ConnectorError, match="127.0.0.1:1 refused the probe"):
        consumer.get(ref)
    consumer.release(ref)  # the producer is gone: counted, not raised
    assert time.monotonic() - t0 < 1.0
    assert consumer.health()["release_failures"] >= 1


def test_thousand_payloads_with_cleanup(consumer):
    template = sample(torch.int32, 256 * KiB, seed=3)
    with connector("many", capacity_bytes=4 * MiB, put_timeout_s=2.0) as prod:
        window: list[tuple[PayloadRef, int]] = []
        for i in range(1000):
            count = (64 * KiB if i % 3 else 256 * KiB) // 4
            ref = wire(prod.put(template[:count] + i, owner=f"req{i}"))
            window.append((ref, i))
            if len(window) == 8:  # a few in flight, so runs interleave and fragment
                old, j = window.pop(0)
                if j % 3 == 0:
                    assert prod.cleanup(f"req{j}") == 1
                    consumer.release(old)  # late: after cleanup, must be ignored
                    continue
                assert torch.equal(consumer.get(old), template[:old.shape[0]] + j)
                consumer.release(old)
        for ref, _ in window:
            consumer.release(ref)
        consumer.drain()
        health = prod.health()
        assert health["blocks_in_use"] == 0 and health["used_bytes"] == 0
        assert health["payload_bytes"] == 0 and health["owners"] == 0
        assert health["puts"] == 1000 and health["cleaned_up"] == 331


def test_make_connector_builds_it():
    with make_connector("mooncake", name="mk", capacity_bytes=1 * MiB) as made:
        assert isinstance(made, MooncakeConnector) and made.session is None  # lazy
        ref = made.put(b"abc", owner="o")
        assert made.session and made.get(ref) == b"abc"
        made.release(ref)
        made.drain()
        assert made.health()["blocks_in_use"] == 0
    with pytest.raises(ConnectorError, match="closed"):
        made.put(b"abc", owner="o")


def test_auto_connector_puts_large_payloads_to_mooncake(consumer):
    value = sample(torch.bfloat16, 1 * MiB, seed=5)
    with AutoConnector("auto-w", remote="mooncake", data_host="127.0.0.1") as writer:
        ref = wire(writer.put(value, owner="r"))
        assert ref.backend == "mooncake" and torch.equal(consumer.get(ref), value)
        assert writer.put(b"tiny", owner="r").backend == "inline"
        consumer.release(ref)
        consumer.drain()
        assert writer.health()["mooncake"]["blocks_in_use"] == 0


def producer_main(conn, capacity: int) -> None:
    """Child: publish seeded payloads, send their refs, answer health requests until 'stop'."""
    producer = connector("child", capacity_bytes=capacity)
    refs = [producer.put(sample(torch.float32, n, seed=n), owner=f"r{n}")
            for n in (64 * KiB, 3 * MiB)] + [producer.put(b"child bytes", owner="rb")]
    conn.send([ref.to_wire() for ref in refs])
    while conn.recv() != "stop":
        conn.send(producer.health())
    producer.close()


def start_producer():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=producer_main, args=(child, 16 * MiB), daemon=True)
    proc.start()
    assert parent.poll(60), "the producer process sent no refs"
    return proc, parent, [PayloadRef.from_wire(w) for w in parent.recv()]


def ask_health(parent) -> dict:
    parent.send("health")
    assert parent.poll(10)
    return parent.recv()


def test_producer_in_another_process(consumer):
    proc, parent, refs = start_producer()
    try:
        assert torch.equal(consumer.get(refs[0]), sample(torch.float32, 64 * KiB, 64 * KiB))
        assert torch.equal(consumer.get(refs[1]), sample(torch.float32, 3 * MiB, 3 * MiB))
        assert consumer.get(refs[2]) == b"child bytes"
        assert ask_health(parent)["blocks_in_use"] == 1 + 48 + 1
        for ref in refs:
            consumer.release(ref)
        consumer.drain()
        health = ask_health(parent)
        assert health["blocks_in_use"] == 0 and health["payload_bytes"] == 0
        assert health["reclaimed"] == 3
        parent.send("stop")
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        proc.kill()
        proc.join(10)


def test_hung_then_killed_producer_fails_in_bounded_time():
    proc, parent, refs = start_producer()
    try:
        with connector("c-open") as open_, connector("c-fresh") as fresh:
            assert open_.get(refs[2]) == b"child bytes"  # session open before the hang
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(0.2)
            for reader in (open_, fresh):  # no-progress timeout; first-contact probe
                t0 = time.monotonic()
                with pytest.raises(ConnectorError, match=refs[0].location[0]):
                    reader.get(refs[0])
                assert time.monotonic() - t0 < IO_TIMEOUT_S + 2.0
            proc.kill()
            proc.join(10)
            t0 = time.monotonic()
            with pytest.raises(ConnectorError, match=refs[1].location[0]):
                open_.get(refs[1])
            assert time.monotonic() - t0 < 1.0  # a dead peer refuses at once
            for reader in (open_, fresh):  # every failed read ended: its buffer reusable
                health = reader.health()
                assert health.get("recv_pool_lent", 0) == 0
                assert health.get("recv_pool_retired", 0) == 0
    finally:
        proc.kill()
        proc.join(10)
