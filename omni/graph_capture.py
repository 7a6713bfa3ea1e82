"""CUDA graph capture that leaves the process's random numbers usable when it fails.

A capture registers the default CUDA generator and marks it as capturing; torch clears the
mark when the capture ends. When a capture fails (an op that syncs with the host, a
library that allocates inside it), ``torch.cuda.graph``'s exit raises before that, and the
mark stays: every later eager random draw of the process (sampling's torch.rand,
multinomial, noise) fails with "Offset increment outside graph capture encountered
unexpectedly". Our captures fall back to eager when they fail, so the fallback itself
would then fail its first sampled request. Seen on an H100: π0's prefix-pass capture
failed under transformers 5.17, and every later draw in that process raised.

``capturing`` is torch.cuda.graph that, when the capture fails, captures one tiny graph
that ends well (its start and end reset every generator registered with it, the default
one always) before the error goes on. ``forwards_replaced`` swaps modules' forwards for
compiled ones while a capture records them (the AR decode graphs, the code predictor's).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger("omni.graph_capture")


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, **kwargs: Any) -> Iterator[None]:
    """``with torch.cuda.graph(graph, **kwargs)``, healing the generators on failure."""
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    except BaseException:
        heal_generators()
        raise


def heal_generators() -> bool:
    """Begin and end one capture of a single add, which clears a failed capture's mark on
    the default CUDA generator; False (logged) when that capture fails too."""
    try:
        scratch = torch.zeros(1, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            scratch.add_(1)
        return True
    except Exception as e:  # noqa: BLE001 - the first error is the one that matters
        log.warning("after a failed CUDA graph capture, the random generator could not be "
                    "reset (%s: %s): eager random draws in this process may fail", type(e).__name__, e)
        return False


@contextlib.contextmanager
def forwards_replaced(modules: list[torch.nn.Module], forwards: list[Any]) -> Iterator[None]:
    """Within the block, each module's forward is the matching callable (e.g. its
    torch.compile'd forward, what a capture should record); the class's after."""
    for module, forward in zip(modules, forwards, strict=True):
        module.forward = forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for module in modules:
            del module.forward
