"""The CUDA IPC connector's building blocks: the producer's pooled device buffer, a
consumer's opened view of one, the shared flag layout and the ref location fields."""

from __future__ import annotations

import math
import struct
from multiprocessing import shared_memory
from typing import Any

import torch

from omni.connector.base import (
    CUDA_IPC_LOCATION,
    ConnectorError,
)
from omni.connector.shm_segment import _OWNED, _attach, _close_mapping

_MAGIC = b"OMNICUD1"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, block_size, nblocks, capacity
_FLAGS = 64

# Ref location, field by field (types checked by PayloadRef.from_wire: CUDA_IPC_LOCATION):
# the pool (what _new_shared_cuda needs, + our ready event and flag segment), then the run.
(DEVICE, HANDLE, POOL_BYTES, POOL_OFFSET, SHARE_EVENT, SHARE_SYNC, READY_EVENT, FLAGS_NAME,
 OFFSET, BLOCK, TAG) = range(11)
assert len(CUDA_IPC_LOCATION) == 11

# Pools created by THIS process, by (handle, storage offset): a consumer connector in the
# producer's own process uses the tensor directly (CUDA cannot open a handle it exported).
_LOCAL_POOLS: dict[tuple[bytes, int], tuple[torch.Tensor, Any]] = {}


class _Pool:
    """The producer side: device buffer, exported handle, flag segment, ready event."""

    def __init__(self, name: str, device: torch.device, capacity: int, block_size: int,
                 sync: str) -> None:
        self.device = device
        self.block_size = block_size
        self.nblocks = max(1, math.ceil(capacity / block_size))
        self.capacity = self.nblocks * block_size
        self.flags = shared_memory.SharedMemory(name=name, create=True,
                                                size=_FLAGS + self.nblocks)
        self.name = name
        self.key: tuple[bytes, int] | None = None
        _OWNED.add(name)
        try:
            _HEADER.pack_into(self.flags.buf, 0, _MAGIC, _VERSION, block_size, self.nblocks,
                              self.capacity)
            with torch.cuda.device(device):
                self.tensor = torch.empty(self.capacity, dtype=torch.uint8, device=device)
                (dev, handle, size, offset, rc_handle, rc_offset, share_event,
                 share_sync) = self.tensor.untyped_storage()._share_cuda_()
                self.stream = torch.cuda.Stream(device) if sync == "event" else None
                self.ready = torch.cuda.Event(interprocess=True) if sync == "event" else None
                ready_handle = bytes(self.ready.ipc_handle()) if self.ready else b""
            self.rc = (bytes(rc_handle), int(rc_offset))
            self.key = (bytes(handle), int(offset))
            self.wire = [int(dev), bytes(handle), int(size), int(offset), bytes(share_event),
                         int(bool(share_sync)), ready_handle, name.encode()]
            _LOCAL_POOLS[self.key] = (self.tensor, self.ready)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.key is not None:
            _LOCAL_POOLS.pop(self.key, None)
            # _share_cuda_ put the storage behind torch's IPC ref counter (starts at 1, one
            # count per share). Consumers here never decrement it (they open the pool with
            # no counter: any number of them may), so the producer drops the count itself;
            # at 0 the pool goes straight back to the caching allocator instead of torch's
            # "limbo" of blocks still held by consumers. Consumers must have released
            # their views by now (the same contract as release()).
            torch.cuda.synchronize(self.device)  # copies on any stream are done
            torch.UntypedStorage._release_ipc_counter_cuda(*self.rc)
        self.tensor = None  # back to the caching allocator
        if self.name in _OWNED:
            _OWNED.discard(self.name)
            try:
                self.flags.unlink()
            except FileNotFoundError:
                pass
        _close_mapping(self.flags)


class _Remote:
    """A consumer's view of one producer's pool: device tensor, flag mapping, event."""

    def __init__(self, loc: list) -> None:
        self.flags = _attach(loc[FLAGS_NAME].decode())
        try:
            magic, version, self.block_size, self.nblocks, self.capacity = (
                _HEADER.unpack_from(self.flags.buf, 0))
            if magic != _MAGIC or version != _VERSION or loc[POOL_BYTES] != self.capacity:
                raise ConnectorError(f"segment {loc[FLAGS_NAME]!r} is not the flag region of "
                                     f"this CUDA pool")
            self.device = torch.device("cuda", loc[DEVICE])
            local = _LOCAL_POOLS.get((loc[HANDLE], loc[POOL_OFFSET]))
            if local is not None:
                self.pool, self.ready = local
                return
            torch.cuda._lazy_init()
            with torch.cuda.device(self.device):
                try:
                    # No ref counter (b"", 0): the producer owns the pool's lifetime (see
                    # _Pool.close); torch's deleter skips the missing counter.
                    storage = torch.UntypedStorage._new_shared_cuda(
                        loc[DEVICE], loc[HANDLE], loc[POOL_BYTES], loc[POOL_OFFSET], b"", 0,
                        loc[SHARE_EVENT], bool(loc[SHARE_SYNC]))
                except RuntimeError as exc:
                    raise ConnectorError(f"cannot open the producer's CUDA pool "
                                         f"({exc})") from exc
                self.pool = torch.empty(0, dtype=torch.uint8, device=self.device).set_(
                    storage, 0, (self.capacity,), (1,))
                self.ready = (torch.cuda.Event.from_ipc_handle(self.device, loc[READY_EVENT])
                              if loc[READY_EVENT] else None)
        except BaseException:
            _close_mapping(self.flags)
            raise

    def close(self) -> None:
        self.pool = self.ready = None  # views handed out keep the storage alive
        _close_mapping(self.flags)


def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    if device is None:
        if not torch.cuda.is_available():
            raise ConnectorError("the cuda_ipc connector needs CUDA, which is not available")
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ConnectorError(f"the cuda_ipc connector needs a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
