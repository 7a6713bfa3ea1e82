"""The data plane as processes see it, without importing torch until a payload shows up.

`PayloadPlane` is an engine process's side: refs in become tensors, tensors out refs.
`ClientPayloads` (omni/runtime/client_payloads.py) is the front side's.

Engines see tensors and never a connector: `resolve` turns every PayloadRef in incoming
inputs into a tensor (a zero-copy view for shared memory), `publish` turns every tensor
an engine puts in its outputs into a ref. Lifetimes, all per request:
- views a request received stay valid until the request finishes here (`done`), then
  their blocks are released to their producers; except CUDA IPC payloads, which are
  copied on receipt and released at once: a device copy takes microseconds, while a
  block held for a request's whole life is what runs a producer's (1 GiB) pool dry when
  many long requests each hold their prompt's hidden states (2500 tokens: 20 MB each);
- on abort or failure (`forget`), this process forgets, without releasing, what it
  received, and keeps what it produced: a consumer elsewhere may still be reading it.
  The orchestrator aborts the request at every replica it touched, each says when it has
  let go (its ABORT is acknowledged after the engine dropped the request), and only then
  tells them to `free` what they produced for it (Free; omni/runtime/aborts.py): so
  no consumer ever reads a block its producer re-used for another request. A release
  sent instead of forgetting could land after the producer freed and re-used the block,
  overwrite the new owner's release flag and leak that block.
torch and the connector are imported on first use: an echo process never pays for them.
"""

from __future__ import annotations

import sys
from typing import Any

from omni.wire.protocol import REF_MARKER


class PayloadPlane:
    """options: ``put`` = "auto" (inline below the threshold, else the arena), "inline" or
    "shm" (from the stage's outgoing edges); ``device``: where this process's engine
    computes (a CUDA payload of another GPU is copied straight there); plus
    make_connector's keyword arguments."""

    def __init__(self, arena_name: str, options: dict[str, Any] | None = None) -> None:
        self.arena_name = arena_name
        self.options = dict(options or {})
        self.put_kind = self.options.pop("put", "auto")
        self.device = _cuda_index(self.options.pop("device", None))
        self._connector: Any = None
        self._held: dict[str, list[Any]] = {}  # request id -> refs it received

    @property
    def connector(self) -> Any:
        if self._connector is None:
            from omni.connector import make_connector

            self._connector = make_connector("auto", name=self.arena_name, **self.options)
        return self._connector

    def resolve(self, request_id: str, value: Any) -> Any:
        """A copy of ``value`` with every wire ref replaced by its payload."""
        if isinstance(value, list):
            if value and value[0] == REF_MARKER:
                return self.get(request_id, value)
            return [self.resolve(request_id, v) for v in value]
        if isinstance(value, dict):
            return {k: self.resolve(request_id, v) for k, v in value.items()}
        return value

    def get(self, request_id: str, wire: list) -> Any:
        """The payload of one wire ref, held for ``request_id`` until done/drop."""
        from omni.connector import PayloadRef

        ref = PayloadRef.from_wire(wire)
        if ref.backend == "cuda_ipc":  # see the module doc
            return self._owned(ref)
        payload = self.connector.get(ref)
        self._held.setdefault(request_id, []).append(ref)
        return payload

    def take(self, wire: list) -> Any:
        """An owned copy of one wire ref's payload; its block goes back at once."""
        from omni.connector import PayloadRef

        return self._owned(PayloadRef.from_wire(wire))

    def _owned(self, ref: Any) -> Any:
        payload = self.connector.get(ref)
        try:
            if not hasattr(payload, "clone"):
                return bytes(payload)
            if payload.is_cuda and self.device is not None \
                    and payload.device.index != self.device:
                # a producer on another GPU: one peer copy onto ours, not a clone there
                # and a second copy here. torch runs a cross-device copy on the source
                # device's current stream, which release() synchronizes
                return payload.to(f"cuda:{self.device}")
            return payload.clone()
        finally:  # after the copy (a CUDA release waits for it), or if it failed
            self.connector.release(ref)

    def publish(self, request_id: str, data: dict[str, Any] | None,
                timeout_s: float | None = None,
                placed: dict[str, list] | None = None) -> dict[str, Any] | None:
        """``data`` with each tensor value put into the connector (owned by the request);
        ``timeout_s``: how long a full store is waited for (None: the connector's own).
        ``placed`` (key -> wire ref) records each tensor as it is put: a retry after a
        full store passes the same dict and puts only the rest, where putting them all
        again would hold a second copy of the first ones until the request's cleanup."""
        torch = sys.modules.get("torch")
        if data is None or torch is None:
            return data
        if not any(isinstance(v, torch.Tensor) for v in data.values()):
            return data
        placed = {} if placed is None else placed
        for key, value in data.items():
            if isinstance(value, torch.Tensor) and key not in placed:
                placed[key] = self._put(value, request_id, timeout_s).to_wire()
        return {k: placed[k] if isinstance(v, torch.Tensor) else v for k, v in data.items()}

    def _put(self, value: Any, owner: str, timeout_s: float | None) -> Any:
        # always an auto connector (a consumer reads refs of any backend); the edge's
        # choice only decides where this process's own payloads go
        target = self.connector if self.put_kind == "auto" else getattr(self.connector,
                                                                        self.put_kind)
        return target.put(value, owner=owner, timeout_s=timeout_s)

    def done(self, request_id: str) -> None:
        """The request finished here: give back what it received."""
        for ref in self._held.pop(request_id, ()):
            self.connector.release(ref)

    def forget(self, request_id: str) -> None:
        """The request is gone here (abort, failure): forget what it got (module doc);
        the connector takes back local memory it lent (mooncake's receive buffers)."""
        for ref in self._held.pop(request_id, ()):
            self.connector.forget(ref)

    def free(self, request_id: str) -> None:
        """No replica reads the request's payloads any more: free what it made here."""
        if self._connector is not None:
            self._connector.cleanup(request_id)

    def stats(self) -> dict[str, Any]:
        """What this process's payload storage holds: the arena (``shm_*``) and, when
        built, the cross-host backends (``zmq_*``, ``mooncake_*``)."""
        if self._connector is None:
            return {}
        health, stats = self._connector.health(), {}
        for kind in ("shm", "zmq", "mooncake"):
            stats.update({f"{kind}_{k}": v for k, v in health.get(kind, {}).items()
                          if isinstance(v, int | float) and not isinstance(v, bool)})
        return stats

    def close(self) -> None:
        if self._connector is not None:
            self._connector.close()


def _cuda_index(device: Any) -> int | None:
    """The GPU index of an engine's device ("cuda:1" -> 1, "cuda" -> the current one);
    None for the CPU or none given."""
    if not isinstance(device, str) or not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    if index:
        return int(index)
    torch = sys.modules.get("torch")
    return torch.cuda.current_device() if torch is not None else 0


def is_wire_ref(value: Any) -> bool:
    """Does this decoded message value look like a PayloadRef's wire list? (The cheap
    check; PayloadRef.from_wire validates the rest.)"""
    return isinstance(value, list) and bool(value) and value[0] == REF_MARKER


def has_ref(data: dict[str, Any]) -> bool:
    return any(is_wire_ref(v) for v in data.values())
