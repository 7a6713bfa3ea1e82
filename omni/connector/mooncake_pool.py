"""Receive buffers of a mooncake consumer: registered once, reused, bounded in bytes.

``MooncakeConnector.get`` reads a payload straight into one of these and returns a view
of it, valid until ``release`` (or ``forget``) hands the buffer back: one copy per get
(the wire into the buffer) where an owned result costs a second one, and the page faults
of fresh memory (64 MiB: ~24 ms on the dev VM, as long as the transfer itself) are paid
once per buffer, not once per get. Buffers are registered with the engine once, when
they are made (on RDMA registering pins memory and is slow).

Size classes: four per power of two (5/8, 6/8, 7/8 and 8/8 of it, 64 KiB at least), so a
buffer is at most ~1/4 larger than what it holds. The pool's bytes (lent + idle) stay
within ``capacity_bytes``: a class without an idle buffer gets a new one when it fits,
after evicting idle buffers of any class, oldest first; when the lent ones leave no room
the read goes into a fresh buffer, registered for that read only and then simply owned
by the caller (released like any other, never pooled).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["MIN_CLASS", "RecvPool", "size_class"]

MIN_CLASS = 64 * 1024
PAGE = 4096


def size_class(nbytes: int) -> int:
    """The buffer size for a payload: ``nbytes`` rounded up to a multiple of 2**k, where
    4 * 2**k < nbytes <= 8 * 2**k (so 5, 6, 7 or 8 times 2**k)."""
    nbytes = max(nbytes, MIN_CLASS)
    step = 1 << max(0, (nbytes - 1).bit_length() - 3)
    return -(-nbytes // step) * step


class RecvPool:
    """Registered receive buffers of one engine (``register``/``unregister``/``pin``),
    lent under a key until given back. Thread-safe."""

    def __init__(self, engine: Any, capacity_bytes: int) -> None:
        self.engine = engine
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, torch.Tensor] = OrderedDict()  # ptr -> buffer, oldest 1st
        self._by_class: dict[int, list[int]] = {}  # size -> ptrs of idle buffers
        self._pooled: dict[int, torch.Tensor] = {}  # ptr -> buffer: every pool buffer
        self._lent: dict[Any, list[torch.Tensor]] = {}  # key -> buffers lent under it
        self._bytes = 0  # sizes of self._pooled, and of buffers being made
        self._closed = False
        self.stats = dict.fromkeys(("made", "reused", "fresh", "evicted", "retired",
                                    "retired_bytes"), 0)

    def take(self, nbytes: int) -> torch.Tensor:
        """A registered buffer of at least ``nbytes``: a pool buffer, or a fresh one."""
        size = size_class(nbytes)
        with self._lock:
            if self._by_class.get(size):
                self.stats["reused"] += 1
                return self._idle.pop(self._by_class[size].pop())
            if not self._room(size):
                self.stats["fresh"] += 1
                size = 0
            self._bytes += size  # reserved while it is made, outside the lock
        return self._make(size or nbytes, pooled=bool(size))

    def _room(self, size: int) -> bool:
        while self._bytes + size > self.capacity_bytes and self._idle:
            ptr, buf = self._idle.popitem(last=False)
            self._by_class[buf.numel()].remove(ptr)
            self._forget(ptr)
            self.stats["evicted"] += 1
        return self._bytes + size <= self.capacity_bytes

    def _make(self, size: int, *, pooled: bool) -> torch.Tensor:
        try:
            buf = torch.empty(size, dtype=torch.uint8)
            if pooled:
                buf[::PAGE].zero_()  # pre-fault: no read pays page faults in this buffer
            self.engine.register(buf)
        except BaseException:
            with self._lock:
                self._bytes -= size if pooled else 0
            raise
        if pooled:
            with self._lock:
                self._pooled[buf.data_ptr()] = buf
                self.stats["made"] += 1
        return buf

    def _forget(self, ptr: int) -> None:
        """Unregister and drop a pool buffer (lock held)."""
        self._bytes -= self._pooled.pop(ptr).numel()
        self.engine.unregister(ptr)

    def keep(self, key: Any, buf: torch.Tensor) -> None:
        """The read into ``buf`` landed and the caller holds a view until ``give(key)``."""
        with self._lock:
            if buf.data_ptr() in self._pooled:
                self._lent.setdefault(key, []).append(buf)
                return
        self.engine.unregister(buf.data_ptr())  # fresh: the caller's own from now on

    def give(self, key: Any) -> bool:
        """The caller is done with the oldest buffer lent under ``key`` (a ref read twice
        holds two): back to the idle ones."""
        with self._lock:
            bufs = self._lent.get(key)
            if not bufs:
                return False
            buf = bufs.pop(0)
            if not bufs:
                del self._lent[key]
            self._idle_locked(buf)
            return True

    def drop(self, buf: torch.Tensor) -> None:
        """A buffer taken but not lent (the read failed, or was copied out): reuse it."""
        with self._lock:
            if buf.data_ptr() in self._pooled:
                self._idle_locked(buf)
                return
        self.engine.unregister(buf.data_ptr())

    def _idle_locked(self, buf: torch.Tensor) -> None:
        ptr = buf.data_ptr()
        if self._closed or ptr not in self._pooled:
            return
        self._idle[ptr] = buf
        self._by_class.setdefault(buf.numel(), []).append(ptr)

    def retire(self, buf: torch.Tensor) -> None:
        """A read into ``buf`` may still land: never reuse or free it while the engine
        runs (pinned there); it leaves the pool's bytes."""
        with self._lock:
            if self._pooled.pop(buf.data_ptr(), None) is not None:
                self._bytes -= buf.numel()
            self.stats["retired"] += 1
            self.stats["retired_bytes"] += buf.numel()
        self.engine.unregister(buf.data_ptr())
        self.engine.pin(buf)

    def usage(self) -> dict[str, int]:
        with self._lock:
            lent = [b for bufs in self._lent.values() for b in bufs]
            return {"recv_pool_bytes": self.capacity_bytes, "recv_pool_used_bytes": self._bytes,
                    "recv_pool_lent_bytes": sum(b.numel() for b in lent),
                    "recv_pool_lent": len(lent),
                    "recv_pool_idle_bytes": sum(b.numel() for b in self._idle.values()),
                    **{f"recv_pool_{k}": v for k, v in self.stats.items()}}

    def close(self) -> None:
        """Drop every idle buffer; lent ones stay their holders' (the engine's shutdown
        unregisters them)."""
        with self._lock:
            self._closed = True
            for ptr in list(self._idle):
                self._forget(ptr)
            self._idle.clear()
            self._by_class.clear()
            self._lent.clear()
