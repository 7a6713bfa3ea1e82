"""openpi's msgpack-numpy convention (protocols.md §7.3), the array wire form of request
inputs, and the image preprocessing policies share (reading cameras and state by key:
test_policy_inputs.py)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch

from omni.api.openpi import codec
from omni.models.policy_images import image_uint8, resize_pad
from omni.wire.arrays import pack_tree, unpack_tree


def test_arrays_and_scalars_round_trip_with_bin_marker_keys():
    obs = {"img": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
           "state": np.array([1.5, -2.0], np.float32), "n": np.int64(7),
           "nested": {"x": np.ones((2, 2), "<f8")}, "prompt": "hi"}
    frame = codec.packb(obs)
    raw = msgpack.unpackb(frame, raw=False)  # the marker keys are bin, as openpi needs
    assert raw["img"][b"__ndarray__"] is True and raw["img"][b"dtype"] == "|u1"
    back = codec.unpackb(frame)
    assert np.array_equal(back["img"], obs["img"]) and back["img"].dtype == np.uint8
    assert np.array_equal(back["nested"]["x"], obs["nested"]["x"])
    assert back["n"] == 7 and isinstance(back["n"], np.int64) and back["prompt"] == "hi"
    assert np.array_equal(unpack_tree(pack_tree(back))["state"], obs["state"])


@pytest.mark.parametrize("bad", [
    {b"__ndarray__": True, b"data": b"\x00" * 5, b"dtype": "<f4", b"shape": [2]},
    {b"__ndarray__": True, b"data": "text", b"dtype": "<f4", b"shape": [1]},
    {b"__ndarray__": True, b"data": b"", b"dtype": "not-a-dtype", b"shape": [0]},
    {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]},
    {b"__ndarray__": True, b"data": b"\x00" * 4, b"dtype": "<f4", b"shape": [-1]},
])
def test_malformed_arrays_are_value_errors(bad):
    with pytest.raises(ValueError):
        codec.unpackb(msgpack.packb({"x": bad}, use_bin_type=True))


def test_garbage_is_a_value_error():
    for frame in (b"\xc1", b"\x92\x01", msgpack.packb([1]) + b"\x01"):
        with pytest.raises(ValueError):
            codec.unpackb(frame)
    with pytest.raises(ValueError):
        codec.packb({"x": np.array([object()])})


def test_resize_pad_fits_the_long_side_and_pads_bottom_right_with_zero():
    image = torch.full((3, 100, 200), 255, dtype=torch.uint8)
    out = resize_pad(image, 56)
    assert out.shape == (3, 56, 56)
    assert torch.all(out[:, :28, :] == 1.0)  # white -> 1 after (x - 0.5) / 0.5
    assert torch.all(out[:, 28:, :] == 0.0)  # the pad, written after normalising


def test_images_in_any_layout_and_float_range():
    hwc = np.random.default_rng(0).integers(0, 256, (8, 6, 3), dtype=np.uint8)
    assert torch.equal(image_uint8("a", hwc), image_uint8("a", hwc.transpose(2, 0, 1)))
    assert torch.equal(image_uint8("a", hwc.astype(np.float32) / 255), image_uint8("a", hwc))
    with pytest.raises(ValueError, match="colour channels"):
        image_uint8("a", np.zeros((8, 6, 4), np.uint8))
