"""Mooncake's transfer engine as the mooncake connector (mooncake.py) drives it: start,
register, probe a peer, and transfers that wait without holding a CPU.

Engine facts (mooncake-transfer-engine 0.3.13, TCP, measured on a 2-core box):
- ``initialize(host, "P2PHANDSHAKE", "tcp", "")``: no metadata server. The engine takes a
  random handshake/RPC port (``get_rpc_port()``; session = ``host:port``) and a random TCP
  data port, both bound to EVERY interface whatever ``host`` says (``host`` is only what
  peers are told). 2 threads per engine, +1 client I/O thread on its first transfer; no
  CPU when idle. Dropping the engine closes its ports and joins its threads, which takes
  ~1 s (one of them wakes once a second): close() blocks that long.
- A killed producer fails a read at once (connection refused). A hung or black-holed one
  is the slow case: an open session gives up after MC_TCP_PROGRESS_TIMEOUT_SEC (default
  30 s; we default it to ``io_timeout_s``), and a first contact's handshake waits a fixed
  60 s, so each session is probed once (``send_probe``) on a helper thread with a bounded
  wait before it is used.
- The synchronous calls (``transfer_sync_read``/``_write``) poll the transfer's status in a
  tight C++ loop: the calling thread keeps a CPU for the whole transfer, one that the
  engine's I/O thread (which receives the bytes) and, on one host, the producer's (which
  sends them) need. bench/probes/mooncake_wait.py (producer in a child over loopback,
  each read starting idle; one run): p50 / reads slower than 4x it, sync against an
  asynchronous read polled with ``sched_yield`` between polls: 64 KiB 26 us / 11 of 400
  (p99 2.8 ms) against 26 us / 2; 1 MiB 609 us / 19 of 100 against 615 us / 0; 8 MiB 7.9
  against 3.9 ms; 64 MiB 58 against 38 ms. Sleeping 50 us between polls instead was
  about as fast at the p50 with a longer tail at 64 KiB (p99 161 us against 78, a timer
  wake-up per poll) and 15% slower at 8 MiB. So a read polls yielding for as long as it
  should take (``2 * nbytes`` at 1 GB/s, 1 ms at least), then sleeps between polls: a
  slow link or a hung producer (the progress timeout is seconds) does not hold a CPU
  (the same run: 28 us / 0 of 400, 615 us / 1 of 100, 3.8 ms, 37 ms).
- Left: across the namespace link, 0-4 of 100 reads of 1 MiB took ~5 ms instead of
  ~0.85 ms while other processes loaded the VM, whether the poller yielded or slept by
  then; the raw TCP pull beside them did not stall. Likely the engine's own hand-offs
  (three threads per read where the raw pull wakes one) waiting out other processes'
  time slices on 2 vCPUs; not pinned down.
- A one-byte write (a release): ``transfer_sync_write`` took ~70 us on loopback, of which
  ``transfer_submit_write`` returns after 7-45 us (handing it to the I/O thread) and the
  write ends ~40 us later on its own: releases are posted, and checked later.
- A transfer's status turns FAILED only once all of its slices have ended (Mooncake's
  TcpTransport::getTransferStatus: success + failed == slices), so a failed read writes nothing later; one that is
  still running at our deadline might, and its buffer is never reused (RecvPool.retire).
- TCP never checks that the local buffer is registered (RDMA does); receive buffers are
  registered anyway so RDMA works unchanged.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref

import torch

from omni.connector.base import ConnectorError

# engine.so reads its log level once, when it loads: errors only unless the user chose
# (its info/warning lines on TCP are "no RDMA devices found" and the like).
os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
from mooncake.engine import TransferEngine  # noqa: E402 (ImportError: make_connector says)

__all__ = ["DONE", "FAILED", "LOST", "Engine"]

DONE, FAILED, LOST = 0, -1, -2  # a transfer: landed; ended in failure; not ended in time
_NO_BATCH = (0, -1, 2**64 - 1)  # what the async submits return when nothing was submitted
TRANSFER_TIMEOUT_S = 30.0  # + 1 s per GiB: the engine's own bound for a sync transfer
YIELD_MIN_S, YIELD_BYTES_PER_S = 1e-3, 1e9  # how long a read polls yielding (module doc)
POLL_SLEEP_S = 50e-6


class Engine:
    """One transfer engine and the buffers registered with it."""

    def __init__(self, host: str, protocol: str, device: str, io_timeout_s: float) -> None:
        # Read by initialize(), process-wide: the first engine of a process sets them.
        seconds = str(max(1, math.ceil(io_timeout_s)))
        for var in ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC"):
            os.environ.setdefault(var, seconds)
        self.te = TransferEngine()
        rc = self.te.initialize(host, "P2PHANDSHAKE", protocol, device)
        if rc != 0:
            raise ConnectorError(f"Mooncake transfer engine did not start on {host!r} "
                                 f"({protocol}, rc {rc})")
        self.session = f"{host}:{self.te.get_rpc_port()}"
        self.registered: list[int] = []
        # Peers' reads of the arena run on the engine's own threads and may still be
        # copying when close() unregisters it, and a read we gave up on may still land:
        # such buffers are pinned here until the engine dies.
        self._pinned: list[torch.Tensor] = []
        weakref.finalize(self.te, self._pinned.clear)

    def register(self, buf: torch.Tensor, *, pin: bool = False) -> int:
        rc = self.te.register_memory(buf.data_ptr(), buf.numel())
        if rc != 0:
            raise ConnectorError(f"Mooncake could not register {buf.numel()} bytes (rc {rc})")
        self.registered.append(buf.data_ptr())
        if pin:
            self._pinned.append(buf)
        return buf.data_ptr()

    def unregister(self, addr: int) -> None:
        if addr in self.registered:
            self.registered.remove(addr)
            self.te.unregister_memory(addr)

    def pin(self, buf: torch.Tensor) -> None:
        self._pinned.append(buf)

    def probe(self, session: str, timeout_s: float) -> int | None:
        """send_probe on a helper thread: its rc, or None when the peer did not answer in
        time (a hung peer's handshake blocks for 60 s and cannot be cancelled)."""
        te, done, result = self.te, threading.Event(), []

        def run() -> None:
            result.append(te.send_probe(session))
            done.set()

        threading.Thread(target=run, name="omni-mooncake-probe", daemon=True).start()
        return result[0] if done.wait(timeout_s) else None

    def read(self, session: str, local: int, remote: int, nbytes: int) -> int:
        """Read ``nbytes`` at ``remote`` of ``session`` into ``local`` (registered) and wait:
        DONE, FAILED (nothing in flight any more) or LOST (still running at the deadline)."""
        te = self.te
        batch = te.batch_transfer_async_read(session, [local], [remote], [nbytes])
        if batch in _NO_BATCH:
            return FAILED
        return self.wait(te, batch, time.monotonic() + TRANSFER_TIMEOUT_S + nbytes / 2**30,
                         max(YIELD_MIN_S, 2 * nbytes / YIELD_BYTES_PER_S))

    @staticmethod
    def wait(te: TransferEngine, batch: int, deadline: float, yield_s: float = 0.0) -> int:
        """Poll a submitted transfer until it ends: yield between polls for ``yield_s``,
        then sleep between them (the module doc says why)."""
        check, now = te.transfer_check_status, time.monotonic
        sleep_from = now() + yield_s
        while True:
            rc = check(batch)  # 1 done, -1 failed (both free the batch), -2 timed out
            if rc:
                return DONE if rc == 1 else FAILED if rc == -1 else LOST
            t = now()
            if t > deadline:
                return LOST  # the batch stays allocated: freeing a live one is unsafe
            if t < sleep_from:
                os.sched_yield()
            else:
                time.sleep(POLL_SLEEP_S)

    def post_write(self, session: str, local: int, remote: int, nbytes: int) -> int | None:
        """Submit a write without waiting: its batch (for ``check``), None if refused."""
        batch = self.te.transfer_submit_write(session, local, remote, nbytes)
        return None if batch in _NO_BATCH else batch

    def check(self, batch: int) -> int | None:
        """A posted transfer: None while it runs, else DONE, FAILED or LOST."""
        rc = self.te.transfer_check_status(batch)
        return None if rc == 0 else DONE if rc == 1 else FAILED if rc == -1 else LOST

    def shutdown(self) -> None:
        for addr in list(self.registered):
            self.unregister(addr)
        self.te = None  # the engine's destructor joins its threads, then pinned are freed
