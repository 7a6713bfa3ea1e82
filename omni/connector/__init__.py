"""Data plane: connectors move heavy payloads between processes; refs ride in messages.

``make_connector(kind, ...)`` builds the per-process connector of one backend:

- ``inline``: bytes inside the ref (small payloads);
- ``shm``: one pre-faulted shared-memory arena per producer (see shm.py);
- ``cuda_ipc``: CUDA tensors through one exported device pool per producer (cuda_ipc.py);
- ``zmq``: payload bytes served as zero-copy ZeroMQ frames from the producer's data
  socket (zmq_data.py): any host that reaches it, always available;
- ``mooncake``: a registered arena read through Mooncake's transfer engine (mooncake.py):
  TCP here, RDMA where a deployment has it; needs the optional package;
- ``auto``: inline below ``inline_threshold`` bytes (CUDA tensors too), then cuda_ipc for
  CUDA tensors and shm for the rest; with ``remote`` set (the producer's consumers are on
  other hosts), that remote backend instead of cuda_ipc/shm (``remote="auto"``: the one
  bench/results/distributed.md shows faster for the size). Its get/release read refs of
  every backend, so a consumer can hold one ``auto`` connector for all edges. Small CUDA tensors go inline
  because a consumer holds what it received until its request ends: one hidden-state row
  per generated token, each in its own 256 KiB pool block, filled the 1 GiB pool at 8
  concurrent 900-token answers on an H200 (the producer then blocked on backpressure).
"""

from __future__ import annotations

from typing import Any

import torch

from omni.connector.base import (
    ArenaFullError,
    Connector,
    ConnectorError,
    Payload,
    PayloadRef,
)
from omni.connector.cuda_ipc import CudaIpcConnector
from omni.connector.inline import InlineConnector
from omni.connector.shm import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_PUT_TIMEOUT_S,
    ShmConnector,
    cleanup_stale,
)

__all__ = [
    "DEFAULT_INLINE_THRESHOLD", "ArenaFullError", "AutoConnector", "Connector",
    "ConnectorError", "CudaIpcConnector", "InlineConnector", "PayloadRef", "ShmConnector",
    "cleanup_stale", "make_connector",
]

DEFAULT_INLINE_THRESHOLD = 64 * 1024
KINDS = ("auto", "inline", "shm", "cuda_ipc", "zmq", "mooncake")
REMOTE_KINDS = ("zmq", "mooncake", "auto")
# remote="auto" without CURVE keys (mooncake's TCP transport has no encryption, so
# encrypted payloads always take zmq): payloads at or above this size go through mooncake
# when it is installed, smaller ones through zmq. None: always zmq, as measured on the
# 2-core VM (bench/results/distributed.md: plain zmq beat mooncake at 64 KiB to 64 MiB)
MOONCAKE_FROM_BYTES: int | None = None


def _nbytes(value: Payload) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return memoryview(value).nbytes


class AutoConnector(Connector):
    """Inline below the threshold; at or above it, cuda_ipc for CUDA tensors, else shm, or
    the ``remote`` backend when set; reads refs of every backend. The remote backends are
    built on first use (mooncake's package is optional)."""

    backend = "auto"

    def __init__(self, name: str, *, capacity_bytes: int = DEFAULT_CAPACITY,
                 inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, remote: str | None = None,
                 data_host: str = "127.0.0.1", curve: dict | None = None,
                 recv_pool_bytes: int | None = None) -> None:
        if remote is not None and remote not in REMOTE_KINDS:
            raise ConnectorError(f"unknown remote backend {remote!r} "
                                 f"(known: {', '.join(REMOTE_KINDS)})")
        self.name = name
        self.inline_threshold = inline_threshold
        self.remote = remote
        self._remote_options = {"capacity_bytes": capacity_bytes, "block_size": block_size,
                                "put_timeout_s": put_timeout_s, "host": data_host,
                                "curve": curve, "recv_pool_bytes": recv_pool_bytes}
        self.inline = InlineConnector(name)
        self.shm = ShmConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                                put_timeout_s=put_timeout_s)
        self.cuda_ipc = CudaIpcConnector(name, put_timeout_s=put_timeout_s)  # pool on 1st put
        self._zmq: Connector | None = None
        self._mooncake: Connector | None = None

    @property
    def zmq(self) -> Connector:
        if self._zmq is None:
            self._zmq = make_connector("zmq", name=self.name, **self._remote_options)
        return self._zmq

    @property
    def mooncake(self) -> Connector:
        if self._mooncake is None:
            self._mooncake = make_connector("mooncake", name=self.name, **self._remote_options)
        return self._mooncake

    def _for(self, ref: PayloadRef) -> Connector:
        if ref.backend in ("inline", "shm", "cuda_ipc", "zmq", "mooncake"):
            return getattr(self, ref.backend)
        raise ConnectorError(f"no connector for backend {ref.backend!r}")

    def _remote_for(self, nbytes: int) -> Connector:
        if self.remote != "auto":
            return getattr(self, self.remote)
        if MOONCAKE_FROM_BYTES is not None and nbytes >= MOONCAKE_FROM_BYTES \
                and self._remote_options["curve"] is None and mooncake_available():
            return self.mooncake
        return self.zmq

    def put(self, value: Payload, *, owner: str, timeout_s: float | None = None) -> PayloadRef:
        nbytes = _nbytes(value)
        if nbytes < self.inline_threshold:
            target = self.inline
        elif self.remote is not None:
            target = self._remote_for(nbytes)
        elif isinstance(value, torch.Tensor) and value.is_cuda:
            target = self.cuda_ipc
        else:
            target = self.shm
        return target.put(value, owner=owner, timeout_s=timeout_s)

    def get(self, ref: PayloadRef) -> torch.Tensor | bytes:
        return self._for(ref).get(ref)

    def release(self, ref: PayloadRef) -> None:
        self._for(ref).release(ref)

    def forget(self, ref: PayloadRef) -> None:
        self._for(ref).forget(ref)

    def _built(self) -> list[Connector]:
        return [c for c in (self.shm, self.cuda_ipc, self._zmq, self._mooncake)
                if c is not None]

    def cleanup(self, owner: str) -> int:
        return sum(c.cleanup(owner) for c in self._built())

    def detach(self, prefix: str) -> int:
        return self.shm.detach(prefix)

    def health(self) -> dict[str, Any]:
        health = {"backend": "auto", "inline_threshold": self.inline_threshold,
                  "inline": self.inline.health(), "shm": self.shm.health(),
                  "cuda_ipc": self.cuda_ipc.health()}
        for kind, built in (("zmq", self._zmq), ("mooncake", self._mooncake)):
            if built is not None:
                health[kind] = built.health()
        return health

    def close(self) -> None:
        for connector in self._built():
            connector.close()
        self.inline.close()


def mooncake_available() -> bool:
    """Whether Mooncake's transfer engine imports here (the package and libibverbs)."""
    try:
        import mooncake.engine  # noqa: F401
    except ImportError:
        return False
    return True


def make_connector(kind: str, *, name: str, capacity_bytes: int = DEFAULT_CAPACITY,
                   inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
                   block_size: int = DEFAULT_BLOCK_SIZE,
                   put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S, remote: str | None = None,
                   host: str = "127.0.0.1", curve: dict | None = None,
                   recv_pool_bytes: int | None = None) -> Connector:
    """The connector of backend ``kind`` for this process; ``name`` prefixes its shm arena
    (e.g. ``f"omni-{launch_id}-{replica}"``). Creating it allocates nothing: the producer
    arena is created on the first shm put (or ``ShmConnector.open_arena()``). ``host`` is
    where a zmq or mooncake producer listens (an address its consumers reach), ``curve``
    the launch's CurveKeys as a dict (omni/wire/curve.py) for the zmq data socket,
    ``recv_pool_bytes`` the bound of a zmq or mooncake consumer's receive buffers (None:
    the backend's default)."""
    if kind == "inline":
        return InlineConnector(name)
    if kind == "shm":
        return ShmConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                            put_timeout_s=put_timeout_s)
    if kind == "auto":
        return AutoConnector(name, capacity_bytes=capacity_bytes,
                             inline_threshold=inline_threshold, block_size=block_size,
                             put_timeout_s=put_timeout_s, remote=remote, data_host=host,
                             curve=curve, recv_pool_bytes=recv_pool_bytes)
    if kind == "cuda_ipc":
        return CudaIpcConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                                put_timeout_s=put_timeout_s)
    pool = {} if recv_pool_bytes is None else {"recv_pool_bytes": recv_pool_bytes}
    if kind == "zmq":
        from omni.connector.zmq_data import ZmqConnector

        return ZmqConnector(name, capacity_bytes=capacity_bytes, put_timeout_s=put_timeout_s,
                            host=host, curve=curve, **pool)
    if kind == "mooncake":
        try:
            from omni.connector.mooncake import MooncakeConnector
        except ImportError as exc:
            raise ConnectorError(
                f"connector backend 'mooncake' needs Mooncake's transfer engine: {exc} "
                "(pip install 'omni[distributed]'; on Debian also apt-get install "
                "libibverbs1)") from exc
        return MooncakeConnector(name, capacity_bytes=capacity_bytes, block_size=block_size,
                                 put_timeout_s=put_timeout_s, host=host, **pool)
    raise ConnectorError(f"unknown connector kind {kind!r} (known: {', '.join(KINDS)})")
