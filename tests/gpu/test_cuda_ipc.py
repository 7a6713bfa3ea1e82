"""CudaIpcConnector on a real GPU: round trips in one process and across processes,
reserve() in place, cleanup(owner), backpressure and block reuse, auto routing."""

from __future__ import annotations

import multiprocessing as mp
import os

import msgpack
import pytest
import torch

from omni.connector import (
    ArenaFullError,
    AutoConnector,
    ConnectorError,
    CudaIpcConnector,
    PayloadRef,
    make_connector,
)
from omni.connector.cuda_ipc import BLOCK, OFFSET, TAG

MODES = ("stream", "event")
KiB = 1024


def _name(tag: str) -> str:
    return f"omni-gputest-{os.getpid()}-{tag}"


def _over_wire(ref: PayloadRef) -> PayloadRef:
    """What a consumer gets: the ref through msgpack and from_wire."""
    data = msgpack.packb(ref.to_wire(), use_bin_type=True)
    return PayloadRef.from_wire(msgpack.unpackb(data, raw=False))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def _checksum(t: torch.Tensor) -> int:
    """Position-weighted byte sum, computed on the tensor's device."""
    b = _bytes(t).to(torch.int64)
    w = torch.arange(b.numel(), device=b.device) % 251 + 1
    return int((b * w).sum().item())


def _cases(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    cases = [
        torch.randn(4, 5, device="cuda", generator=g),
        torch.randn(3, 7, 2, device="cuda", generator=g).to(torch.bfloat16),
        torch.randn(6, 9, device="cuda", generator=g).half().t(),  # non-contiguous
        torch.randint(-1000, 1000, (10, 8), device="cuda", generator=g)[::3, 1::2],  # strided
        torch.randn(33, device="cuda", generator=g) > 0,  # bool
        torch.tensor(7 + seed, dtype=torch.uint8, device="cuda"),  # 0-d
        torch.empty(0, 3, device="cuda"),  # empty: no blocks
        torch.randn(300_000, device="cuda", generator=g),  # many blocks
    ]
    if hasattr(torch, "float8_e4m3fn"):
        cases.append(torch.randn(5, 5, device="cuda", generator=g).to(torch.float8_e4m3fn))
    return cases


@pytest.fixture
def pair(request):
    mode = getattr(request, "param", "stream")
    prod = CudaIpcConnector(_name("p"), capacity_bytes=4 << 20, block_size=64 * KiB,
                            sync=mode)
    cons = CudaIpcConnector(_name("c"))
    yield prod, cons
    cons.close()
    prod.close()


@pytest.mark.parametrize("pair", MODES, indirect=True)
def test_round_trip_same_process(pair):
    prod, cons = pair
    cases = _cases()
    expect = [t.clone() for t in cases]
    refs = [prod.put(t, owner="r1") for t in cases]
    for t in cases:
        t.zero_()  # the pool holds its own copy
    for want, ref in zip(expect, refs, strict=True):
        assert ref.backend == "cuda_ipc"
        got = cons.get(_over_wire(ref))
        assert got.is_cuda and got.device == want.device
        assert _same(got, want), ref
    held = sum(1 for r in refs if r.nbytes)
    assert prod.health()["payloads_in_use"] == held
    for ref in refs:
        cons.release(_over_wire(ref))
    health = prod.health()
    assert health["payloads_in_use"] == 0 and health["blocks_in_use"] == 0
    assert health["reclaimed"] == held


def test_host_values_rejected(pair):
    prod, _ = pair
    with pytest.raises(ConnectorError, match="CUDA tensors only"):
        prod.put(torch.zeros(4), owner="r")
    with pytest.raises(ConnectorError, match="CUDA tensors only"):
        prod.put(b"abc", owner="r")
    assert prod.health()["payloads_in_use"] == 0


@pytest.mark.parametrize("pair", MODES, indirect=True)
def test_reserve_writes_in_place(pair):
    prod, cons = pair
    ref, view = prod.reserve((256, 64), torch.bfloat16, owner="r")
    pool = prod._pool.tensor
    assert pool.data_ptr() <= view.data_ptr() < pool.data_ptr() + pool.numel()
    assert view.is_contiguous() and view.dtype == torch.bfloat16
    view.copy_(torch.arange(256 * 64, device="cuda").view(256, 64).to(torch.bfloat16))
    prod.ready()
    got = cons.get(_over_wire(ref))
    assert got.data_ptr() == view.data_ptr()  # same memory, no copy
    assert torch.equal(got, view)
    cons.release(ref)
    assert prod.health()["payloads_in_use"] == 0


def test_cleanup_owner_and_late_release(pair):
    prod, cons = pair
    a = [prod.put(torch.ones(20_000, device="cuda"), owner="a") for _ in range(3)]
    b = prod.put(torch.ones(10, device="cuda"), owner="b")
    assert prod.cleanup("a") == 3
    assert prod.cleanup("a") == 0
    health = prod.health()
    assert health["payloads_in_use"] == 1 and health["owners"] == 1
    new = prod.put(torch.full((20_000,), 2.0, device="cuda"), owner="c")
    assert new.location[BLOCK] == a[0].location[BLOCK]  # first fit reuses a's blocks
    assert new.location[TAG] != a[0].location[TAG]
    cons.release(a[0])  # late release of a cleaned-up run: its old tag is ignored
    assert prod.health()["payloads_in_use"] == 2
    assert torch.equal(cons.get(new), torch.full((20_000,), 2.0, device="cuda"))
    cons.release(new)
    cons.release(b)
    assert prod.health()["payloads_in_use"] == 0


def test_full_pool_backpressure_and_reuse():
    prod = CudaIpcConnector(_name("full"), capacity_bytes=4 * 64 * KiB, block_size=64 * KiB)
    cons = CudaIpcConnector(_name("fullc"))
    try:
        one_block = 64 * KiB // 4  # float32 elements
        refs = [prod.put(torch.full((one_block,), float(i), device="cuda"), owner=f"r{i}")
                for i in range(4)]
        with pytest.raises(ArenaFullError):
            prod.put(torch.zeros(one_block, device="cuda"), owner="x", timeout_s=0.01)
        assert prod.health()["full_errors"] == 1
        with pytest.raises(ConnectorError, match="larger than the whole"):
            prod.put(torch.zeros(5 * one_block, device="cuda"), owner="x")
        cons.release(refs[1])
        again = prod.put(torch.full((one_block,), 9.0, device="cuda"), owner="y", timeout_s=1)
        assert again.location[OFFSET] == refs[1].location[OFFSET]
        assert torch.equal(cons.get(again), torch.full((one_block,), 9.0, device="cuda"))
        assert torch.equal(cons.get(refs[2]), torch.full((one_block,), 2.0, device="cuda"))
    finally:
        cons.close()
        prod.close()


def test_auto_routes_cuda_tensors():
    prod = make_connector("auto", name=_name("ap"))
    cons = make_connector("auto", name=_name("ac"))
    try:
        assert isinstance(prod, AutoConnector)
        t = torch.randn(32768, device="cuda")  # 128 KiB: at or above the inline threshold
        ref = prod.put(t, owner="r")
        assert ref.backend == "cuda_ipc"
        small = prod.put(torch.randn(8, device="cuda"), owner="r")  # one row: inline
        assert small.backend == "inline" and cons.get(_over_wire(small)).device.type == "cpu"
        assert torch.equal(cons.get(_over_wire(ref)), t)
        cons.release(_over_wire(ref))
        assert prod.health()["cuda_ipc"]["payloads_in_use"] == 0
        assert prod.put(torch.randn(8), owner="r").backend == "inline"
        ref2 = prod.put(t, owner="r2")
        assert prod.cleanup("r2") == 1
        assert ref2.backend == "cuda_ipc"
    finally:
        cons.close()
        prod.close()
    direct = make_connector("cuda_ipc", name=_name("mk"), capacity_bytes=1 << 20)
    assert isinstance(direct, CudaIpcConnector)
    direct.close()


def test_payload_plane_copies_cuda_payloads_and_frees_them_at_once():
    """An engine process owns a copy of what it receives over CUDA IPC, and the
    producer's block is free before the request ends (its pool never fills up with
    payloads held by long requests)."""
    from omni.wire.payloads import PayloadPlane

    prod = make_connector("auto", name=_name("pp"))
    plane = PayloadPlane(_name("pc"))
    try:
        t = torch.randn(64, 1024, device="cuda")  # 256 KiB: over the inline threshold
        ref = prod.put(t, owner="r")
        assert ref.backend == "cuda_ipc"
        got = plane.get("r", _over_wire(ref).to_wire())
        assert torch.equal(got, t)
        assert prod.health()["cuda_ipc"]["payloads_in_use"] == 0
        reuse = prod.put(torch.ones(64, 1024, device="cuda"), owner="r2")  # first fit:
        assert reuse.location[BLOCK] == ref.location[BLOCK]  # the block it came in
        torch.cuda.synchronize()
        assert torch.equal(got, t)  # the copy is not that block
        plane.done("r")  # nothing held: a no-op
        from omni.runtime.client_payloads import ClientPayloads

        client = ClientPayloads(_name("cl"))  # the front end: one copy, block freed
        final = prod.put(t, owner="f")
        taken = client.take({"audio": _over_wire(final).to_wire()})
        assert torch.equal(taken["audio"], t)
        assert prod.health()["cuda_ipc"]["payloads_in_use"] == 1  # only r2's
        client.close()
    finally:
        plane.close()
        prod.close()


# -- across processes ----------------------------------------------------------------------

def _consumer(conn) -> None:
    """Spawned consumer: get each ref, checksum it on the GPU, release, reply."""
    cons = CudaIpcConnector(f"omni-gputest-child-{os.getpid()}")
    try:
        while (msg := conn.recv_bytes()) != b"stop":
            refs = [PayloadRef.from_wire(w) for w in msgpack.unpackb(msg, raw=False)]
            out = []
            for ref in refs:
                t = cons.get(ref)
                out.append([ref.dtype, list(t.shape), t.device.index, _checksum(t)])
            for ref in refs:
                cons.release(ref)
            conn.send_bytes(msgpack.packb(out, use_bin_type=True))
    finally:
        cons.close()
        conn.close()


@pytest.mark.parametrize("mode", MODES)
def test_cross_process(mode):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_consumer, args=(child,), daemon=True)
    proc.start()
    child.close()
    # 2 MiB pool, ~1.3 MB per round: every round after the first reuses reclaimed blocks.
    prod = CudaIpcConnector(_name(f"x{mode}"), capacity_bytes=2 << 20, block_size=64 * KiB,
                            sync=mode)
    try:
        held = 0
        for rnd in range(4):
            cases = _cases(seed=rnd)
            refs = [prod.put(t, owner=f"req{rnd}") for t in cases]
            assert refs[0].location[OFFSET] == 0
            want = [[r.dtype, list(r.shape), 0, _checksum(t)] for r, t in zip(
                refs, cases, strict=True)]
            for w, t in zip(want, cases, strict=True):
                w[2] = t.device.index
            parent.send_bytes(msgpack.packb([r.to_wire() for r in refs], use_bin_type=True))
            assert parent.poll(120), "consumer did not answer"
            assert msgpack.unpackb(parent.recv_bytes(), raw=False) == want
            held += sum(1 for r in refs if r.nbytes)
            health = prod.health()
            assert health["payloads_in_use"] == 0, health
            assert health["reclaimed"] == held
        parent.send_bytes(b"stop")
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        prod.close()
        parent.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)")
def test_payload_plane_copies_a_payload_of_another_gpu_straight_onto_its_own():
    """A consumer engine on cuda:1 reading a producer's pool on cuda:0 gets its tensor on
    cuda:1 in one peer copy, and the producer's block is free at once."""
    from omni.wire.payloads import PayloadPlane

    prod = make_connector("auto", name=_name("xp"))
    plane = PayloadPlane(_name("xc"), {"device": "cuda:1"})
    try:
        t = torch.randn(64, 1024, device="cuda:0")
        ref = prod.put(t, owner="r")
        got = plane.get("r", _over_wire(ref).to_wire())
        assert got.device == torch.device("cuda:1")
        assert torch.equal(got.cpu(), t.cpu())
        assert prod.health()["cuda_ipc"]["payloads_in_use"] == 0
    finally:
        plane.close()
        prod.close()
