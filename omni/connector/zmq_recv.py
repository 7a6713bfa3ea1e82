"""The zmq backend's consumer receive path: where a fetch's reply lands.

A payload up to zmq_server.WHOLE_UP_TO (1 MiB; with CURVE up to PART_BYTES, 256 KiB) comes
back as one frame, and the tensor views that frame: libzmq's own allocation, which glibc
serves from reused heap memory once its dynamic mmap threshold has grown to the size. A
larger one comes back as a stream of 256 KiB part messages, copied in order into a receive
buffer from :class:`RecvPool`. Why: libzmq receives every message into a fresh allocation
of its size, and glibc serves one over 32 MiB (its largest mmap threshold) by mmap, so
each page of it faults in as the bytes arrive: first-touching 64 MiB costs ~24 ms on the
dev VM, as much as the transfer itself (bench/results/distributed.md). Parts are small
enough for glibc to reuse (each is freed once copied, while the next ones arrive), the
pooled buffer was faulted in by an earlier payload, so a warm pool receives with (next to)
no page faults, and copying part k overlaps the arrival of part k+1 (with CURVE, the
producer encrypting the next part while this end decrypts one). Numbers: zmq_server.py.

Lifetime: a pooled buffer goes back to the pool when the last tensor viewing it is gone
(a weakref finalizer on the array the tensor's storage holds), not on ``release``. So a
tensor from ``get`` stays valid as long as anything references it, after ``release`` and
``close`` too, as the frame path's tensors do; and a payload whose ref is forgotten without
a release (PayloadPlane.forget, on abort) still returns its buffer. The finalizer may run
on any thread, even inside the pool's lock (a garbage collection pass): it only queues the
buffer, and the pool counts it back on its next call.

Size classes are powers of two (a buffer serves every payload of its class; only the pages
a payload touched are resident). ``limit`` bounds the bytes of all pooled buffers, free
and in use; a payload whose class does not fit, even after dropping free buffers of other
classes, lands in a fresh buffer of its own (its pages fault in, as before this pool).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import torch
import zmq

from omni.connector.base import BYTES_DTYPE, ConnectorError, PayloadRef, dtype_from_name

__all__ = ["DEFAULT_RECV_POOL_BYTES", "Landing", "RecvPool"]

DEFAULT_RECV_POOL_BYTES = 256 << 20


def size_class(nbytes: int) -> int:
    return 1 << max(nbytes - 1, 0).bit_length()


class RecvPool:
    """Receive buffers (uint8 tensors) recycled by size class, ``limit`` bytes at most."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ConnectorError(f"recv_pool_bytes must be >= 0, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}  # class -> buffers, oldest first
        # given back, not yet counted: a finalizer only appends here (atomic, no lock), as it
        # may run on any thread, even inside this lock (a garbage collection pass)
        self._returned: collections.deque[tuple[torch.Tensor | None, int]] = \
            collections.deque()
        self._held = 0  # bytes of pooled buffers, free and in use
        self._in_use = 0
        self._closed = False
        self.stats = dict.fromkeys(("reused", "grown", "evicted", "unpooled"), 0)

    def acquire(self, nbytes: int) -> tuple[torch.Tensor, int]:
        """``(buffer, class)``: a buffer of at least ``nbytes``; class 0 = not pooled."""
        size = size_class(nbytes)
        with self._lock:
            self._drain()
            if self._free.get(size):
                self.stats["reused"] += 1
                self._in_use += 1
                return self._free[size].pop(), size
            if self._closed or not self._make_room(size):
                self.stats["unpooled"] += 1
                size = 0
            else:
                self.stats["grown"] += 1
                self._held += size
                self._in_use += 1
        try:
            return torch.empty(size or nbytes, dtype=torch.uint8), size
        except BaseException:
            self.give_back(None, size)
            raise

    def _make_room(self, size: int) -> bool:
        """Drop free buffers of other classes, oldest first, until ``size`` more fits."""
        if size > self.limit:
            return False
        for cls, buffers in list(self._free.items()):
            while buffers and self._held + size > self.limit:
                buffers.pop(0)
                self._held -= cls
                self.stats["evicted"] += 1
            if not buffers:
                del self._free[cls]
        return self._held + size <= self.limit

    def view(self, buffer: torch.Tensor, size: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of the first ``nbytes`` of ``buffer``; its buffer returns to the
        pool when the last tensor sharing its memory is gone."""
        array = buffer.numpy()[:nbytes]  # a new object, held by the tensor's storage
        if size:
            weakref.finalize(array, self.give_back, buffer, size).atexit = False
        return torch.frombuffer(array, dtype=torch.uint8)

    def give_back(self, buffer: torch.Tensor | None, size: int) -> None:
        """``buffer`` (of class ``size``; 0: not pooled) is free again; None: it is gone.
        Any thread, any time: counted by the next call that takes the lock."""
        if size:
            self._returned.append((None if self._closed else buffer, size))

    def _drain(self) -> None:
        """Count what was given back (call with the lock held)."""
        while self._returned:
            buffer, size = self._returned.popleft()
            self._in_use -= 1
            if buffer is None or self._closed:
                self._held -= size
            else:
                self._free.setdefault(size, []).append(buffer)

    def usage(self) -> dict[str, int]:
        with self._lock:
            self._drain()
            free = sum(len(b) for b in self._free.values())
            return {"recv_pool_bytes": self.limit, "recv_pool_held_bytes": self._held,
                    "recv_buffers_free": free, "recv_buffers_in_use": self._in_use,
                    **{f"recv_pool_{k}": v for k, v in self.stats.items()}}

    def close(self) -> None:
        """Drop the free buffers; those in use are dropped when their tensors go."""
        with self._lock:
            self._closed = True
            self._drain()
            for size, buffers in self._free.items():
                self._held -= size * len(buffers)
            self._free.clear()


class Landing:
    """One fetch's reply, frame by frame: the first frame when it is the whole payload,
    else the parts copied in order into a pooled buffer (bytes payloads: joined)."""

    def __init__(self, ref: PayloadRef, pool: RecvPool) -> None:
        self.ref, self.pool = ref, pool
        self.got = 0
        self.whole: zmq.Frame | None = None
        self.chunks: list[zmq.Frame] = []
        self.buffer: torch.Tensor | None = None
        self.into: memoryview | None = None
        self.size = 0

    def add(self, frame: zmq.Frame) -> bool:
        """Take the next frame; True once the payload is complete."""
        n, want = len(frame), self.ref.nbytes
        if not n or self.got + n > want:
            raise ConnectorError(f"sent {'an empty part' if not n else 'more bytes'} for a "
                                 f"payload of {want} bytes")
        if n == want:
            self.whole = frame
        elif self.ref.dtype == BYTES_DTYPE:
            self.chunks.append(frame)  # joined at the end: one copy
        else:
            if self.buffer is None:
                self.buffer, self.size = self.pool.acquire(want)
                self.into = memoryview(self.buffer.numpy())
            # a memcpy, the GIL held ~20 us a part; cheaper than torch's copy_ call (64 MiB
            # in 256 KiB parts from memory in cache: 2.4 ms against 3.2-4.6 ms)
            self.into[self.got:self.got + n] = frame.buffer
        self.got += n
        return self.got == want

    def result(self) -> torch.Tensor | bytes:
        """The payload (once ``add`` said complete); the buffer now belongs to it."""
        ref = self.ref
        if self.whole is not None:
            return rebuild(ref, self.whole)
        if ref.dtype == BYTES_DTYPE:
            return b"".join(frame.buffer for frame in self.chunks)
        raw = self.pool.view(self.buffer, self.size, ref.nbytes)
        self.buffer = None
        return raw.view(dtype_from_name(ref.dtype)).view(ref.shape)

    def abandon(self) -> None:
        """The fetch failed: the buffer goes back to the pool."""
        buffer, self.buffer = self.buffer, None
        if buffer is not None:
            self.pool.give_back(buffer, self.size)


def rebuild(ref: PayloadRef, frame: Any) -> torch.Tensor | bytes:
    """The payload of one whole frame: a tensor viewing it (keeps it alive), or bytes."""
    if ref.dtype == BYTES_DTYPE:
        return frame.bytes
    dtype = dtype_from_name(ref.dtype)
    raw = torch.frombuffer(frame, dtype=torch.uint8)  # shares the frame, keeps it alive
    if raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # a small payload inside libzmq's shared receive batch: unaligned
    return raw.view(dtype).view(ref.shape)
