"""An AR stage's ``load_format: dummy`` (omni/models/hf_causal.py): a plain causal LM's
directory without its weight files loads with random weights drawn from config.json, of
the checkpoint's names, shapes and dtypes, the same draw every time; without dummy that
directory fails to load; composite releases and the codec talkers refuse dummy, naming why."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from omni.engines.base import EngineLoadError
from omni.fixtures import ensure_tiny_model
from omni.models.hf_causal import load_causal_lm

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    release = ensure_tiny_model("qwen3", cache_dir=tmp_path_factory.getbasetemp() / "models")
    stripped = tmp_path_factory.mktemp("dummy") / "qwen3"
    shutil.copytree(release, stripped)
    for weights in stripped.glob("*.safetensors*"):
        weights.unlink()
    return release, stripped


def test_random_weights_of_the_checkpoints_layout(dirs):
    release, stripped = dirs
    real = load_causal_lm(str(release)).model.state_dict()
    lm = load_causal_lm(str(stripped), load_format="dummy")
    drawn = lm.model.state_dict()
    assert lm.random_weights and lm.load_format == "dummy"
    assert set(drawn) == set(real)
    for name, tensor in drawn.items():
        assert (tensor.shape, tensor.dtype) == (real[name].shape, real[name].dtype), name
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(drawn[name], real[name])
    again = load_causal_lm(str(stripped), load_format="dummy").model.state_dict()
    assert all(torch.equal(again[k], v) for k, v in drawn.items())  # seeded


def test_without_dummy_the_stripped_directory_does_not_load(dirs):
    with pytest.raises(EngineLoadError, match="has no weights"):
        load_causal_lm(str(dirs[1]))
    with pytest.raises(EngineLoadError, match="load_format 'random' is not one of auto, dummy"):
        load_causal_lm(str(dirs[1]), load_format="random")


def test_composite_releases_refuse_dummy(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    with pytest.raises(EngineLoadError, match="qwen2_5_vl release, which loads through its "
                                              "own adapter"):
        load_causal_lm(str(tmp_path), load_format="dummy")


def test_codec_talkers_refuse_dummy(dirs):
    from omni.engines.ar.feedback import build_feedback_engine

    with pytest.raises(EngineLoadError, match="adapter loads its own weights"):
        build_feedback_engine("qwen3_omni_talker", str(dirs[1]),
                              options={"load_format": "dummy"})
