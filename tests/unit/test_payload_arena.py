"""An engine process sizes its payload arena to hold its engine's largest output: a video
stage at its limits outgrew the 64 MiB default, which refused such an output outright."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from omni.config.presets import PRESET_DIR
from omni.connector import DEFAULT_CAPACITY
from omni.engines.proc.main import arena_options
from omni.models.diffusion_limits import Limits

MiB = 2**20


def _stage_options(preset: str) -> dict:
    import yaml

    return yaml.safe_load((PRESET_DIR / f"{preset}.yaml").read_text())["stages"][0]["options"]


def test_largest_output_at_the_video_and_image_presets_limits():
    wan = Limits.from_options(_stage_options("wan"), default_size="832x480")  # its adapter's
    assert wan.largest_output_bytes() == 1280 * 720 * 3 * 129  # 340 MiB of frames
    image = Limits.from_options(_stage_options("qwen_image"))
    assert image.largest_output_bytes() == 2048 * 2048 * 3 * image.max_n  # n images
    assert image.largest_output_bytes() <= DEFAULT_CAPACITY


def test_arena_holds_the_largest_output_unless_the_stage_set_its_own(caplog):
    spec = SimpleNamespace(stage="video", payload_options={"put": "auto"})
    assert "capacity_bytes" not in arena_options(spec, DEFAULT_CAPACITY)  # fits: default
    raised = arena_options(spec, 340 * MiB + 1)
    assert raised["capacity_bytes"] == 341 * MiB and raised["put"] == "auto"
    assert spec.payload_options == {"put": "auto"}  # the spec's own options untouched
    small = SimpleNamespace(stage="video", payload_options={"capacity_bytes": 32 * MiB})
    with caplog.at_level(logging.WARNING):
        assert arena_options(small, 340 * MiB)["capacity_bytes"] == 32 * MiB
    assert "less than one output at its limits" in caplog.text


def test_a_retried_publish_puts_only_what_the_full_try_left_out():
    """Two tensors, room for one: the try without waiting puts the first and fails on the
    second; the retry with the same `placed` puts only the second (before, the first was
    put twice, its first copy held until the request's cleanup)."""
    import pytest
    import torch

    from omni.connector.base import ArenaFullError
    from omni.wire.payloads import PayloadPlane

    block = 64 * 1024
    plane = PayloadPlane("test-publish-placed", {"capacity_bytes": 2 * block,
                                                 "block_size": block})
    try:
        data = {"a": torch.ones(block // 4), "b": torch.full((block // 4,), 2.0),
                "note": "kept"}
        filler = plane.publish("other", {"x": torch.zeros(block // 4)})
        placed: dict = {}
        with pytest.raises(ArenaFullError):
            plane.publish("r", data, timeout_s=0.0, placed=placed)
        assert list(placed) == ["a"]
        plane.connector.release(_ref(filler["x"]))  # its reader is done: room for b
        out = plane.publish("r", data, timeout_s=0.0, placed=placed)
        assert out["a"] == placed["a"] and out["note"] == "kept"
        got = {k: plane.take(out[k]) for k in ("a", "b")}
        assert torch.equal(got["a"], data["a"]) and torch.equal(got["b"], data["b"])
        assert plane.stats()["shm_blocks_in_use"] == 0  # nothing of r left behind
    finally:
        plane.close()


def _ref(wire):
    from omni.connector import PayloadRef

    return PayloadRef.from_wire(wire)
