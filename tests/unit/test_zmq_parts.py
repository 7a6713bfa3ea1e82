"""The zmq connector's large payloads: parts on the wire, the consumer's receive pool.

A payload over zmq_server.WHOLE_UP_TO (with CURVE over PART_BYTES) travels as a stream of
part messages and lands in a pooled buffer (omni/connector/zmq_recv.py). Contract: the frames on the wire, every byte
right for any dtype and a size that is no multiple of the part, a buffer reused only once
no tensor views it (never on release), the pool's bound, and nothing leaked by a malformed,
short or failed reply, by a timeout or by close.
"""

from __future__ import annotations

import threading

import msgpack
import pytest
import torch
import zmq

from omni.connector import ConnectorError, PayloadRef
from omni.connector.zmq_data import ZmqConnector
from omni.connector.zmq_recv import RecvPool, size_class
from omni.connector.zmq_server import FETCH, OK, PART_BYTES, WHOLE_UP_TO
from omni.wire.curve import CurveKeys

pytestmark = pytest.mark.timeout(60)

KiB, MiB = 1024, 1024 * 1024
PART = PART_BYTES
WHOLE = WHOLE_UP_TO  # the largest plain payload sent as one frame


@pytest.fixture
def producer():
    p = ZmqConnector("parts-producer", capacity_bytes=256 * MiB, put_timeout_s=1.0)
    yield p
    p.close()


@pytest.fixture
def consumer():
    c = ZmqConnector("parts-consumer", fetch_timeout_s=10.0, recv_pool_bytes=64 * MiB)
    yield c
    c.close()


def pool(connector: ZmqConnector) -> dict[str, int]:
    return {k.removeprefix("recv_"): v for k, v in connector.health().items()
            if k.startswith("recv_")}


def sample(dtype: torch.dtype, count: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(count, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        return torch.randn(count, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), (count,),
                         dtype=dtype, generator=gen)


def test_parts_on_the_wire(producer):
    """FETCH by hand: a payload of WHOLE + P/2 bytes comes back as OK messages of P bytes
    but the last, P/2; one of WHOLE bytes as one."""
    src = torch.arange(WHOLE + PART // 2, dtype=torch.uint8)
    ref = producer.put(src, owner="r1")
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.connect(ref.location[0])
        dealer.send(msgpack.packb([FETCH, 9, ref.location[1], ref.key]))
        got = []
        while sum(len(data) for data in got) < ref.nbytes:
            assert dealer.poll(5000)
            header, data = dealer.recv_multipart()
            assert msgpack.unpackb(header) == [OK, 9, ""]
            got.append(data)
        assert [len(data) for data in got] == [PART] * (WHOLE // PART) + [PART // 2]
        assert b"".join(got) == src.numpy().tobytes()
        assert not dealer.poll(100)  # nothing more
        whole = producer.put(src[:WHOLE], owner="r1")
        dealer.send(msgpack.packb([FETCH, 10, whole.location[1], whole.key]))
        assert dealer.poll(5000) and len(dealer.recv_multipart()[1]) == WHOLE
        assert not dealer.poll(100)
    finally:
        dealer.close(linger=0)
        context.term()


@pytest.mark.parametrize("nbytes", [WHOLE + 8, WHOLE + 3 * PART + 40, 5 * MiB + 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8,
                                   torch.bool, torch.complex64])
def test_parts_round_trip(producer, consumer, dtype, nbytes):
    src = sample(dtype, nbytes // dtype.itemsize).reshape(1, -1, 1)
    ref = producer.put(src, owner="r1")
    assert ref.nbytes == nbytes
    got = consumer.get(ref)
    assert got.dtype == dtype and got.shape == src.shape and torch.equal(got, src)
    consumer.release(ref)
    assert pool(consumer)["buffers_in_use"] == 1  # the tensor still views the buffer
    del got
    assert pool(consumer)["buffers_in_use"] == 0


@pytest.mark.parametrize("curve", [False, True])
def test_parts_of_bytes_and_with_curve(curve):
    keys = CurveKeys.generate().to_dict() if curve else None
    blob = bytes(range(256)) * (WHOLE // 256) + b"tail"
    tensor = torch.randn(WHOLE // 8 + 7, dtype=torch.float64)
    with ZmqConnector("p", curve=keys) as producer, ZmqConnector("c", curve=keys) as consumer:
        refs = [producer.put(blob, owner="r1"), producer.put(tensor, owner="r1")]
        assert consumer.get(refs[0]) == blob
        assert torch.equal(consumer.get(refs[1]), tensor)
        assert pool(consumer)["pool_grown"] == 1  # bytes payloads are joined, not pooled


def test_pool_reuses_a_buffer_once_no_tensor_views_it(producer, consumer):
    n = WHOLE // 2  # floats: 2 x WHOLE bytes
    refs = [producer.put(torch.full((n,), float(i)), owner="r1") for i in range(4)]
    a = consumer.get(refs[0])
    ptr = a.data_ptr()
    consumer.release(refs[0])  # a release does not free the buffer: `a` still views it
    b = consumer.get(refs[1])
    assert b.data_ptr() != ptr and torch.equal(a, torch.full((n,), 0.0))
    tail = a[n // 2:]  # a view of a view keeps the buffer too
    del a
    c = consumer.get(refs[2])
    assert c.data_ptr() not in (ptr, b.data_ptr())
    assert float(tail[0]) == 0.0
    del tail  # reference counting returns it at once: no garbage collection pass needed
    d = consumer.get(refs[3])  # the next payload of its class gets a's buffer
    assert d.data_ptr() == ptr and torch.equal(d, torch.full((n,), 3.0))
    stats = pool(consumer)
    assert stats["pool_grown"] == 3 and stats["pool_reused"] == 1
    assert stats["buffers_in_use"] == 3 and stats["pool_held_bytes"] == 3 * size_class(4 * n)


def test_pool_stays_within_its_bound(producer):
    n, cls = WHOLE + 8, size_class(WHOLE + 8)
    with ZmqConnector("c", recv_pool_bytes=2 * cls) as consumer:
        refs = [producer.put(torch.zeros(n, dtype=torch.uint8), owner="r1") for _ in range(3)]
        held = [consumer.get(ref) for ref in refs]  # the third does not fit
        stats = pool(consumer)
        assert stats["pool_grown"] == 2 and stats["pool_unpooled"] == 1
        assert stats["pool_held_bytes"] == 2 * cls and stats["buffers_in_use"] == 2
        del held
        assert pool(consumer)["buffers_free"] == 2
        big = producer.put(torch.zeros(cls + 8, dtype=torch.uint8), owner="r1")
        got = consumer.get(big)  # a class twice the size: both free buffers make room
        stats = pool(consumer)
        assert stats["pool_evicted"] == 2 and stats["pool_held_bytes"] == 2 * cls
        assert stats["buffers_free"] == 0 and stats["buffers_in_use"] == 1
        assert torch.equal(got, torch.zeros(cls + 8, dtype=torch.uint8))
    with ZmqConnector("off", recv_pool_bytes=0) as consumer:  # no pool: a fresh buffer each
        assert torch.equal(consumer.get(refs[0]), torch.zeros(n, dtype=torch.uint8))
        assert pool(consumer)["pool_unpooled"] == 1
    with pytest.raises(ConnectorError, match="recv_pool_bytes"):
        ZmqConnector("bad", recv_pool_bytes=-1)


def stand_in(replies) -> tuple[zmq.Context, zmq.Socket, threading.Thread, str]:
    """A fake producer answering the first FETCH with ``replies(seq)``: lists of frames."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        identity, request = router.recv_multipart()
        for frames in replies(msgpack.unpackb(request)[1]):
            router.send_multipart([identity, *frames])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return context, router, thread, f"tcp://127.0.0.1:{port}"


def part(seq: int, data: bytes) -> list[bytes]:
    return [msgpack.packb([OK, seq, ""]), data]


CHUNK = b"\x01" * PART
BAD_REPLIES = {
    "more bytes": lambda seq: [part(seq, CHUNK), part(seq, CHUNK), part(seq, CHUNK)],
    "an empty part": lambda seq: [part(seq, CHUNK), part(seq, b"")],
    "boom": lambda seq: [part(seq, CHUNK), [msgpack.packb([1, seq, "boom"])]],
    rf"sent {PART} of its {2 * PART + 8} bytes": lambda seq: [part(seq, CHUNK)],
}


@pytest.mark.parametrize("error", list(BAD_REPLIES))
def test_bad_or_short_reply_returns_the_buffer(error):
    context, router, thread, endpoint = stand_in(BAD_REPLIES[error])
    ref = PayloadRef("zmq", "r1/1", "r1", "uint8", (2 * PART + 8,), 2 * PART + 8,
                     [endpoint, 5])
    try:
        with ZmqConnector("c", fetch_timeout_s=1.0) as consumer:
            with pytest.raises(ConnectorError, match=error):
                consumer.get(ref)
            stats = pool(consumer)
            assert stats["buffers_in_use"] == 0 and stats["buffers_free"] == 1
    finally:
        thread.join(10)
        router.close(linger=0)
        context.term()


def test_producer_dies_mid_stream_then_close(producer):
    """A producer gone after its first part: the fetch times out, the buffer goes back; a
    tensor held across close stays valid, and its buffer is dropped when it goes."""
    context, router, thread, endpoint = stand_in(lambda seq: [part(seq, CHUNK)])
    dead = PayloadRef("zmq", "r1/1", "r1", "uint8", (3 * PART,), 3 * PART, [endpoint, 5])
    consumer = ZmqConnector("c", fetch_timeout_s=0.5)
    try:
        with pytest.raises(ConnectorError, match="no answer"):
            consumer.get(dead)
        assert pool(consumer)["buffers_in_use"] == 0
        ref = producer.put(torch.arange(WHOLE, dtype=torch.int32), owner="r1")
        kept = consumer.get(ref)
        consumer.close()
        stats = pool(consumer)
        assert stats["buffers_in_use"] == 1 and stats["pool_held_bytes"] == size_class(4 * WHOLE)
        assert torch.equal(kept, torch.arange(WHOLE, dtype=torch.int32))
        del kept
        stats = pool(consumer)
        assert stats["buffers_in_use"] == stats["buffers_free"] == stats["pool_held_bytes"] == 0
    finally:
        consumer.close()
        thread.join(10)
        router.close(linger=0)
        context.term()


def test_recv_pool_classes():
    recv = RecvPool(8 * MiB)
    assert [size_class(n) for n in (1, 2, 3, MiB, MiB + 1)] == [1, 2, 4, MiB, 2 * MiB]
    buffer, size = recv.acquire(3 * MiB)
    assert size == 4 * MiB and buffer.numel() == 4 * MiB
    view = recv.view(buffer, size, 3 * MiB)
    assert view.numel() == 3 * MiB and view.data_ptr() == buffer.data_ptr()
    del view
    assert recv.usage()["recv_buffers_free"] == 1
    again, size = recv.acquire(4 * MiB)
    assert again.data_ptr() == buffer.data_ptr()
    with recv._lock:  # a finalizer run by a garbage collection pass inside the lock
        recv.give_back(again, size)  # only queues it: no deadlock
    usage = recv.usage()
    assert usage["recv_buffers_free"] == 1 and usage["recv_buffers_in_use"] == 0
