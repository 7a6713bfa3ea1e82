"""The shm connector across real processes (multiprocessing spawn, refs over a Pipe).

The child is a consumer (get, check, release) or a producer that gets killed with SIGKILL;
every test uses its own segment prefix so parallel runs never collide.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import uuid

import msgpack
import pytest
import torch

from omni.connector import PayloadRef, ShmConnector, cleanup_stale
from omni.connector.inline import tensor_bytes

BLOCK = 4096
TIMEOUT_S = 20.0


def digest(value: torch.Tensor | bytes) -> str:
    data = value if isinstance(value, bytes) else tensor_bytes(value)
    return hashlib.sha256(data).hexdigest()


def shm_names(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def send(conn, obj) -> None:
    conn.send_bytes(msgpack.packb(obj, use_bin_type=True))


def recv(conn, timeout_s: float = TIMEOUT_S):
    if not conn.poll(timeout_s):
        raise TimeoutError("no message from the other process")
    return msgpack.unpackb(conn.recv_bytes(), raw=False)


def consumer_main(conn, prefix: str) -> None:
    """Child: for each [wire ref, expected digest]: get, compare, release; answer per batch."""
    os.environ["OMP_NUM_THREADS"] = "1"
    consumer = ShmConnector(prefix + "-consumer")
    try:
        while True:
            batch = recv(conn, 60)
            if batch is None:
                break
            bad = []
            for wire_ref, expected in batch:
                ref = PayloadRef.from_wire(wire_ref)
                value = consumer.get(ref)
                if digest(value) != expected:
                    bad.append(ref.key)
                del value
                consumer.release(ref)
            send(conn, {"checked": len(batch), "bad": bad})
    finally:
        consumer.close()
        conn.close()


def producer_main(conn, prefix: str) -> None:
    """Child: publish one tensor, send its ref, then wait to be killed."""
    producer = ShmConnector(prefix, capacity_bytes=16 * BLOCK, block_size=BLOCK)
    ref = producer.put(torch.arange(100, dtype=torch.int64), owner="r1")
    send(conn, [producer.segment_name, ref.to_wire()])
    recv(conn, 60)  # never answered: the parent kills this process


@pytest.fixture
def prefix():
    p = f"omni-ptest-{uuid.uuid4().hex[:10]}"
    yield p
    left = shm_names(p)
    cleanup_stale(p)
    assert not left, f"segments left in /dev/shm: {left}"


def start(target, prefix: str):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, prefix), name=f"omni-test-{target.__name__}",
                          daemon=True)
    process.start()
    child.close()
    return process, parent


def stop(process, conn) -> None:
    try:
        send(conn, None)
    except (BrokenPipeError, OSError):
        pass
    process.join(TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join(5)
    conn.close()


def test_consumer_process_reads_and_releases(prefix):
    producer = ShmConnector(prefix, capacity_bytes=256 * BLOCK, block_size=BLOCK)
    process, conn = start(consumer_main, prefix)
    try:
        payloads = [torch.randn(37), torch.arange(BLOCK * 3, dtype=torch.int32).reshape(-1, 8).t(),
                    torch.randn(5, 6).to(torch.bfloat16), torch.rand(100) > 0.5,
                    torch.tensor(3.5, dtype=torch.float64), torch.empty(0, 4),
                    torch.randn(8, dtype=torch.complex64), os.urandom(10_000), b""]
        payloads += [torch.full((i * 500,), float(i), dtype=torch.float16) for i in range(1, 20)]
        refs = [producer.put(p, owner=f"req-{i % 3}") for i, p in enumerate(payloads)]
        blocks = producer.health()["blocks_in_use"]
        assert blocks > 20
        send(conn, [[r.to_wire(), digest(p)] for r, p in zip(refs, payloads, strict=True)])
        answer = recv(conn)
        assert answer == {"checked": len(payloads), "bad": []}
        # Releases were flag bytes written by the child; the producer reclaims them lazily.
        health = producer.health()
        assert health["blocks_in_use"] == 0 and health["releases"] == 0  # not this process
        assert health["payloads_in_use"] == 0 and health["owners"] == 0
    finally:
        stop(process, conn)
        producer.close()


def test_backpressure_across_processes(prefix):
    """More traffic than the arena holds: puts wait for the child's releases, never fail."""
    producer = ShmConnector(prefix, capacity_bytes=16 * BLOCK, block_size=BLOCK)
    process, conn = start(consumer_main, prefix)
    try:
        pending, sent, checked = [], 0, 0
        for i in range(120):
            value = torch.full((BLOCK // 4 * (1 + i % 3),), float(i))  # 1-3 blocks
            ref = producer.put(value, owner=f"r{i}", timeout_s=10.0)
            pending.append([ref.to_wire(), digest(value)])
            if len(pending) == 4:
                send(conn, pending)
                sent += len(pending)
                pending = []
                if sent - checked >= 8:  # keep a few batches in flight
                    answer = recv(conn)
                    assert answer["bad"] == []
                    checked += answer["checked"]
        if pending:
            send(conn, pending)
            sent += len(pending)
        while checked < sent:
            answer = recv(conn)
            assert answer["bad"] == []
            checked += answer["checked"]
        health = producer.health()
        assert health["blocks_in_use"] == 0 and health["full_errors"] == 0
        assert health["reclaimed"] == 120, health
    finally:
        stop(process, conn)
        producer.close()


def test_killed_producer_then_cleanup_stale(prefix):
    process, conn = start(producer_main, prefix)
    consumer = ShmConnector(prefix + "-consumer")
    try:
        segment, wire_ref = recv(conn)
        assert shm_names(prefix) == [segment]
        ref = PayloadRef.from_wire(wire_ref)
        assert torch.equal(consumer.get(ref), torch.arange(100))
        os.kill(process.pid, signal.SIGKILL)
        process.join(TIMEOUT_S)
        assert process.exitcode == -signal.SIGKILL
        assert shm_names(prefix) == [segment]  # SIGKILL left the arena behind
        assert cleanup_stale(prefix) == [segment]
        assert shm_names(prefix) == []
        consumer.release(ref)  # the mapping is still valid; releasing is harmless
        assert consumer.detach(prefix) == 1
        consumer.release(ref)  # not attached and gone: a no-op
    finally:
        consumer.close()
        if process.is_alive():
            process.kill()
        process.join(5)
        conn.close()
