"""The zmq connector over loopback TCP: round trips, backpressure, cleanup, dead producers,
CURVE, strangers' garbage, a producer in another process, and AutoConnector's remote path.

Releases are fire-and-forget; a test that must see one handled fetches a released key on the
same consumer afterwards: one connection delivers in order, so the "unknown payload" answer
means the releases before it were served.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid

import msgpack
import pytest
import torch
import zmq

from omni.connector import ArenaFullError, Connector, ConnectorError, PayloadRef, make_connector
from omni.connector.zmq_data import ZmqConnector
from omni.connector.zmq_server import FETCH
from omni.wire.curve import CurveKeys

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of the run

KiB, MiB = 1024, 1024 * 1024
FAIL_TIMEOUT_S = 0.5  # fetch timeout of consumers that are meant to fail


@pytest.fixture
def producer():
    p = ZmqConnector("test-producer", capacity_bytes=256 * MiB, put_timeout_s=1.0)
    yield p
    p.close()


@pytest.fixture
def consumer():
    c = ZmqConnector("test-consumer", fetch_timeout_s=10.0)
    yield c
    c.close()


def wire(ref: PayloadRef) -> PayloadRef:
    """Through msgpack and back, as a control message would carry it."""
    return PayloadRef.from_wire(msgpack.unpackb(msgpack.packb(ref.to_wire()), raw=False))


def sample(dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    count = nbytes // dtype.itemsize
    if dtype.is_floating_point:
        return torch.randn(count).to(dtype)
    return torch.randint(-(2**40), 2**40, (count,), dtype=dtype)


def served(consumer: Connector, released: PayloadRef) -> None:
    """Barrier: every request this consumer sent before now has been served."""
    with pytest.raises(ConnectorError, match="unknown payload"):
        consumer.get(released)


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("nbytes", [64 * KiB, 1 * MiB, 64 * MiB])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_round_trip_tensors(producer, consumer, dtype, nbytes):
    src = sample(dtype, nbytes).reshape(4, -1)
    ref = wire(producer.put(src, owner="r1"))
    assert ref.backend == "zmq" and ref.nbytes == nbytes
    assert producer.health()["payload_bytes"] == nbytes
    got = consumer.get(ref)
    assert got.dtype == dtype and got.shape == src.shape and torch.equal(got, src)
    consumer.release(ref)
    served(consumer, ref)
    assert producer.health()["payload_bytes"] == 0
    assert torch.equal(got, src)  # still valid after release: the consumer owns it


@pytest.mark.parametrize("nbytes", [64 * KiB, 1 * MiB, 64 * MiB])
def test_round_trip_bytes(producer, consumer, nbytes):
    src = os.urandom(1024) * (nbytes // 1024)
    ref = wire(producer.put(bytearray(src), owner="r1"))
    assert ref.dtype == "bytes" and ref.shape == (nbytes,)
    got = consumer.get(ref)
    assert isinstance(got, bytes) and got == src
    consumer.release(ref)


def test_empty_non_contiguous_small_and_unaligned(producer, consumer):
    base = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6, 8, 3)
    values = [torch.empty(0, 5), b"", base.transpose(0, 1), base[::3, 1:, ::2],
              torch.arange(10.0).flip(0), torch.randn(5, dtype=torch.complex128).conj(),
              torch.tensor(3.5, dtype=torch.float64), torch.randn(512, 1024).t()[::2]]
    refs = [wire(producer.put(src, owner="r1")) for src in values]
    assert [r.nbytes for r in refs[:2]] == [0, 0]
    for src, ref in zip(values, refs, strict=True):
        got = consumer.get(ref)
        if isinstance(src, bytes):
            assert got == src
            continue
        assert got.shape == src.shape and torch.equal(got, src.resolve_conj())
        assert got.data_ptr() % got.element_size() == 0  # small frames may sit unaligned
    assert producer.health()["payloads_in_use"] == 6  # 0-byte payloads hold nothing
    for ref in refs:
        consumer.release(ref)
    served(consumer, refs[-1])
    assert producer.health()["payloads_in_use"] == 0


@pytest.mark.parametrize("count", [16 * KiB, 1 * MiB])  # one frame; parts into the pool
def test_got_tensor_is_writable_and_owned(producer, consumer, count):
    ref = producer.put(torch.ones(count), owner="r1")
    got = consumer.get(ref)
    got.fill_(7.0)
    assert torch.equal(consumer.get(ref), torch.ones(count))  # the producer's copy is intact
    consumer.close()
    assert float(got.sum()) == 7.0 * count  # and ours outlives the consumer


def test_capacity_waits_then_raises(consumer):
    with ZmqConnector("small", capacity_bytes=1 * MiB) as producer:
        refs = [producer.put(bytes(256 * KiB), owner="hog") for _ in range(4)]
        t0 = time.monotonic()
        with pytest.raises(ArenaFullError, match="'late'"):
            producer.put(bytes(1), owner="late", timeout_s=0.2)
        assert 0.2 <= time.monotonic() - t0 < 1.5
        result: list = []
        putter = threading.Thread(target=lambda: result.append(
            producer.put(bytes(256 * KiB), owner="waiter", timeout_s=10.0)))
        putter.start()
        assert wait_until(lambda: producer.health()["full_waits"] == 2)  # it is waiting now
        assert not result
        consumer.release(refs[1])
        putter.join(10.0)
        assert result and result[0].owner == "waiter"
        health = producer.health()
        assert health["full_errors"] == 1 and health["payload_bytes"] == 1 * MiB
        assert consumer.get(result[0]) == bytes(256 * KiB)


def test_oversized_payload_raises_at_once():
    with ZmqConnector("small", capacity_bytes=1 * MiB) as producer:
        t0 = time.monotonic()
        with pytest.raises(ConnectorError, match="larger than") as err:
            producer.put(torch.zeros(MiB + 1, dtype=torch.uint8), owner="big", timeout_s=5)
        assert not isinstance(err.value, ArenaFullError)
        assert time.monotonic() - t0 < 0.5
        assert producer.health()["payload_bytes"] == 0


def test_bad_hosts_are_refused():
    with pytest.raises(ConnectorError, match="wildcard"):
        ZmqConnector("p", host="0.0.0.0")
    keys = CurveKeys.generate().to_dict()
    with ZmqConnector("p", host="192.0.2.1", curve=keys) as producer:  # not this machine's
        with pytest.raises(ConnectorError, match="cannot bind"):
            producer.put(b"x" * 100, owner="r1")
    # close() returned: nothing (router, gatekeeper) was left to block context.term()


def test_cleanup_drops_only_that_owner(producer, consumer):
    a = [producer.put(torch.full((1000,), float(i)), owner="a") for i in range(3)]
    b = producer.put(torch.full((1000,), 9.0), owner="b")
    assert producer.cleanup("a") == 3 and producer.cleanup("a") == 0
    health = producer.health()
    assert health["payloads_in_use"] == 1 and health["payload_bytes"] == 4000
    with pytest.raises(ConnectorError, match=f"{a[1].key}.*unknown payload") as err:
        consumer.get(a[1])
    assert producer.endpoint in str(err.value)
    assert torch.equal(consumer.get(b), torch.full((1000,), 9.0))


def test_closed_producer_fails_within_timeout():
    producer = ZmqConnector("gone")
    ref = producer.put(torch.ones(100), owner="r1")
    producer.close()
    with ZmqConnector("c", fetch_timeout_s=FAIL_TIMEOUT_S) as consumer:
        t0 = time.monotonic()
        with pytest.raises(ConnectorError, match="no answer") as err:
            consumer.get(ref)
        assert FAIL_TIMEOUT_S <= time.monotonic() - t0 < FAIL_TIMEOUT_S + 1.0
        assert ref.location[0] in str(err.value) and ref.key in str(err.value)
        consumer.release(ref)  # to a dead producer: queued and forgotten, no error


def test_ref_of_another_producer_instance_is_refused(producer, consumer):
    ref = producer.put(torch.ones(100), owner="r1")
    stale = PayloadRef.from_wire([*ref.to_wire()[:7], [ref.location[0], ref.location[1] ^ 1]])
    with pytest.raises(ConnectorError, match="another producer instance"):
        consumer.get(stale)
    assert torch.equal(consumer.get(ref), torch.ones(100))


def test_wire_round_trip_and_bad_locations(producer, consumer):
    ref = producer.put(torch.ones(2, 3), owner="r1")
    assert PayloadRef.from_wire(ref.to_wire()) == ref
    endpoint, nonce = ref.location
    assert endpoint.startswith("tcp://127.0.0.1:") and 0 <= nonce < 2**63
    for location in ([endpoint], [endpoint, str(nonce)], [nonce, endpoint], endpoint,
                     [endpoint, nonce, 0], None):
        with pytest.raises(ValueError, match="zmq location"):
            PayloadRef.from_wire([*ref.to_wire()[:7], location])
    for endpoint in ("ipc:///tmp/x", "inproc://x"):
        bad = PayloadRef.from_wire([*ref.to_wire()[:7], [endpoint, nonce]])
        with pytest.raises(ConnectorError, match="not tcp"):
            consumer.get(bad)
    bad = PayloadRef.from_wire([*ref.to_wire()[:7], ["tcp://127.0.0.1:notaport", nonce]])
    with pytest.raises(ConnectorError, match="cannot connect"):
        consumer.get(bad)


def test_garbage_from_a_stranger_does_not_stop_serving(producer, consumer):
    ref = producer.put(torch.arange(1000), owner="r1")
    garbage = [[b"\xc1"], [b"not msgpack at all"], [msgpack.packb({"op": 1})],
               [msgpack.packb([FETCH, 1, ref.location[1]])], [msgpack.packb([FETCH, 1, ref.location[1], ref.key]), b"extra frame"],
               [msgpack.packb([99, 1, ref.location[1], ref.key])],
               [msgpack.packb([FETCH, "1", ref.location[1], ref.key])], [b""]]
    context = zmq.Context()
    stranger = context.socket(zmq.DEALER)
    try:
        stranger.connect(ref.location[0])
        for frames in garbage:
            stranger.send_multipart(frames)
        stranger.send(msgpack.packb([FETCH, 7, ref.location[1], ref.key]))  # then a real one
        assert stranger.poll(5000)
        header, payload = stranger.recv_multipart()
        assert msgpack.unpackb(header) == [0, 7, ""] and len(payload) == 8000
    finally:
        stranger.close(linger=0)
        context.term()
    assert producer.health()["bad_requests"] == len(garbage)
    assert torch.equal(consumer.get(ref), torch.arange(1000))


def test_stale_and_malformed_replies_are_discarded(consumer):
    """A stand-in producer answers with garbage and an old fetch's number before the reply."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        identity, request = router.recv_multipart()
        _, seq, _, _ = msgpack.unpackb(request)
        for frames in ([b"\xc1"], [msgpack.packb([0, seq - 1, ""]), b"old"],
                       [msgpack.packb([0, seq, ""])], [msgpack.packb([0, seq, ""]), b"new!"]):
            router.send_multipart([identity, *frames])

    server = threading.Thread(target=serve)
    server.start()
    try:
        ref = PayloadRef("zmq", "r1/1", "r1", "bytes", (4,), 4, [f"tcp://127.0.0.1:{port}", 5])
        assert consumer.get(ref) == b"new!"
    finally:
        server.join(10)
        router.close(linger=0)
        context.term()


def curve_pair(keys: CurveKeys, client_of: CurveKeys) -> dict:
    """``keys``' server key with ``client_of``'s client pair."""
    return CurveKeys(keys.server_public, keys.server_secret, client_of.client_public,
                     client_of.client_secret).to_dict()


def test_curve_admits_only_the_sets_client_key():
    keys, other = CurveKeys.generate(), CurveKeys.generate()
    with ZmqConnector("curve", curve=keys.to_dict()) as producer:
        ref = producer.put(torch.arange(100_000), owner="r1")
        with ZmqConnector("ok", curve=keys.to_dict()) as consumer:
            assert torch.equal(consumer.get(ref), torch.arange(100_000))
        assert producer.health()["refused_handshakes"] == 0
        for curve in (other.to_dict(), curve_pair(keys, client_of=other)):
            with ZmqConnector("bad", curve=curve, fetch_timeout_s=FAIL_TIMEOUT_S) as stranger:
                with pytest.raises(ConnectorError, match="CURVE keys"):
                    stranger.get(ref)
        # one stranger fails to decrypt (wrong server key), the other is refused by key
        assert wait_until(lambda: producer.health()["refused_handshakes"] >= 2)
        health = producer.health()
        assert health["refused_client_keys"] >= 1 and health["fetches_served"] == 1


def test_thousand_payloads_with_cleanup(producer, consumer):
    owners, last_released = 100, None
    for o in range(owners):
        refs = []
        for i in range(10):
            nbytes = 64 * KiB if (o + i) % 2 else 256 * KiB
            refs.append(producer.put(torch.full((nbytes // 4,), o * 10 + i, dtype=torch.int32),
                                     owner=f"req-{o}"))
        if o % 3 == 0:
            assert producer.cleanup(f"req-{o}") == 10
            continue
        for i, ref in enumerate(refs):
            got = consumer.get(ref)
            assert int(got[0]) == int(got[-1]) == o * 10 + i
            consumer.release(ref)
        last_released = refs[-1]
    served(consumer, last_released)
    health = producer.health()
    assert health["payload_bytes"] == 0 and health["payloads_in_use"] == 0
    assert health["puts"] == 1000 and health["cleaned_up"] == 340
    assert health["releases_served"] == 660 and health["fetches_served"] == 660


def test_auto_connector_puts_large_payloads_to_zmq():
    name = f"omni-test-{uuid.uuid4().hex[:10]}"
    writer = make_connector("auto", name=name, remote="zmq", inline_threshold=1024)
    reader = make_connector("auto", name=name + "-reader")
    try:
        small = writer.put(torch.arange(10), owner="r1")
        large = writer.put(torch.arange(100_000), owner="r1")
        blob = writer.put(b"x" * 5000, owner="r1")
        assert [r.backend for r in (small, large, blob)] == ["inline", "zmq", "zmq"]
        assert torch.equal(reader.get(wire(small)), torch.arange(10))
        assert torch.equal(reader.get(wire(large)), torch.arange(100_000))
        assert reader.get(wire(blob)) == b"x" * 5000
        for ref in (small, large):
            reader.release(ref)
        served(reader, large)
        assert writer.cleanup("r1") == 1  # the blob, never released
        assert writer.health()["zmq"]["payloads_in_use"] == 0
    finally:
        reader.close()
        writer.close()


def producer_main(conn, capacity: int) -> None:
    """Child: publish seeded tensors, send their refs, answer health requests until 'stop'."""
    producer = ZmqConnector("child", capacity_bytes=capacity)
    gen = torch.Generator().manual_seed(1234)
    refs = [producer.put(torch.randn(n, generator=gen), owner=f"r{n}") for n in (10, 300_000)]
    conn.send([ref.to_wire() for ref in refs])
    while conn.recv() != "stop":
        conn.send(producer.health())
    producer.close()


def test_producer_in_another_process_then_killed():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=producer_main, args=(child, 64 * MiB), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "the producer process sent no refs"
        refs = [PayloadRef.from_wire(w) for w in parent.recv()]
        gen = torch.Generator().manual_seed(1234)
        expected = [torch.randn(n, generator=gen) for n in (10, 300_000)]
        with ZmqConnector("c", fetch_timeout_s=FAIL_TIMEOUT_S * 4) as consumer:
            for ref, want in zip(refs, expected, strict=True):
                assert torch.equal(consumer.get(ref), want)
            parent.send("health")
            assert parent.poll(10) and parent.recv()["payload_bytes"] == 1_200_040
            for ref in refs:
                consumer.release(ref)
            served(consumer, refs[1])
            parent.send("health")
            assert parent.poll(10)
            health = parent.recv()
            assert health["payload_bytes"] == 0 and health["payloads_in_use"] == 0
            assert health["fetches_served"] == 2 and health["releases_served"] == 2
            proc.kill()
            proc.join(10)
            t0 = time.monotonic()
            with pytest.raises(ConnectorError, match=f"no answer.*{refs[1].key}"):
                consumer.get(refs[1])
            assert time.monotonic() - t0 < FAIL_TIMEOUT_S * 4 + 1.0
    finally:
        proc.kill()
        proc.join(10)
