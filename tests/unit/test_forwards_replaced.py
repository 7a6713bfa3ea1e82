"""omni/graph_capture.py's forwards_replaced, on CPU: the modules run the given forwards
inside the block and their own after it, an error inside the block included (the CUDA
captures that use it: tests/gpu/test_omni_cuda.py, test_ar_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from omni.graph_capture import forwards_replaced


def test_modules_run_the_given_forwards_only_inside_the_block():
    layers = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    x = torch.ones(1, 2)
    own = [layer(x) for layer in layers]
    doubled = [lambda t, layer=layer: 2 * type(layer).forward(layer, t) for layer in layers]
    with forwards_replaced(layers, doubled):
        for layer, out in zip(layers, own, strict=True):
            torch.testing.assert_close(layer(x), 2 * out)
    with pytest.raises(RuntimeError, match="inside"), forwards_replaced(layers, doubled):
        raise RuntimeError("inside")
    for layer, out in zip(layers, own, strict=True):
        assert "forward" not in vars(layer)
        torch.testing.assert_close(layer(x), out)
