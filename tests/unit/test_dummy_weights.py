"""``load_format: dummy`` (omni/models/dummy_weights.py through diffusion.load_pipeline):
tiny Wan 2.2 TI2V, FLUX.2 and LTX-2 directories with every weight file deleted load with
random weights in the stage dtype on the stage device, the same weights on every load and
not the release's; the same stripped directories fail to load their weights the usual way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import omni.models.diffusion as common
from omni.engines.base import EngineLoadError
from omni.models.dummy_weights import drawing, random_components
from omni.models.flux2 import build_flux2
from omni.models.ltx2 import build_ltx2
from omni.models.wan import _classes as wan_classes

torch.set_num_threads(1)
MODELS = ("transformer", "vae", "text_encoder")
EXTRA = {"ltx2": ("vocoder", "connectors", "audio_vae")}  # every model component


def _stripped(source: str, target: Path) -> str:
    """A copy of a release directory with only its configs, tokenizer and scheduler."""
    shutil.copytree(source, target)
    for weights in target.rglob("*.safetensors"):
        weights.unlink()
    assert not list(target.rglob("*.safetensors"))
    return str(target)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, models):
    out = tmp_path_factory.mktemp("dummy")
    return {name: (models(name), _stripped(models(name), out / name))
            for name in ("wan22_ti2v", "flux2", "ltx2")}


def _wan(model_dir: str, load_format: str = "auto"):
    return common.load_pipeline(model_dir, wan_classes(), device="cpu", dtype="bfloat16",
                                load_format=load_format)


def _flux2(model_dir: str, load_format: str = "auto"):
    """Through the adapter: it loads FLUX.2's tokenizer itself where torchvision is absent."""
    return build_flux2(model_dir=model_dir, device="cpu", dtype="bfloat16",
                       options={"load_format": load_format}).pipe


def _ltx2(model_dir: str, load_format: str = "auto"):
    """LTX-2 names two models by its pipeline's own folder (["ltx2", "LTX2Vocoder"])."""
    return build_ltx2(model_dir=model_dir, device="cpu", dtype="bfloat16",
                      options={"load_format": load_format}).pipe


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict([*module.named_parameters(), *module.named_buffers()])


@pytest.mark.parametrize("family, load", [("wan22_ti2v", _wan), ("flux2", _flux2),
                                          ("ltx2", _ltx2)])
def test_dummy_loads_random_weights_in_the_release_dtypes(dirs, family, load):
    release, stripped = dirs[family]
    dummy, real = load(stripped, "dummy"), load(release)
    for name in MODELS + EXTRA.get(family, ()):
        got, want = _tensors(getattr(dummy, name)), _tensors(getattr(real, name))
        # every tensor of the real load, in its dtype (bf16, or the fp32 that
        # from_pretrained keeps, e.g. Wan's time embedder) and on its device
        assert {k: (t.dtype, t.device, t.shape) for k, t in got.items()} == {
            k: (t.dtype, t.device, t.shape) for k, t in want.items()}, name
        assert not getattr(dummy, name).training
    params = dict(dummy.transformer.named_parameters())
    assert all(p.device.type == "cpu" for p in params.values())
    assert sum(p.dtype == torch.bfloat16 for p in params.values()) > len(params) // 2
    # random, not the release's (the tiny LTX-2 was itself saved from seed-0 default
    # inits in this order, so a dummy load draws its very numbers: the others show it)
    for name in ("transformer", "text_encoder") if family != "ltx2" else ():
        key, weight = next((k, t) for k, t in getattr(real, name).named_parameters()
                           if t.dim() == 2)
        assert not torch.equal(dict(getattr(dummy, name).named_parameters())[key], weight)
    again = load(stripped, "dummy").transformer.state_dict()
    assert all(torch.equal(t, again[k]) for k, t in dummy.transformer.state_dict().items())


def test_wan_keeps_the_fp32_modules_of_the_release(dirs):
    """The dtype comparison above can fail: Wan's transformer holds fp32 weights."""
    dummy = _wan(dirs["wan22_ti2v"][1], "dummy")
    kept = [k for k, p in dummy.transformer.named_parameters() if p.dtype == torch.float32]
    assert any("time_embedder" in k for k in kept) and "scale_shift_table" in kept


def test_auto_on_the_stripped_directory_fails(dirs):
    with pytest.raises(OSError, match="no file named"):
        _wan(dirs["wan22_ti2v"][1])
    with pytest.raises(OSError):
        _flux2(dirs["flux2"][1])


def test_weights_are_drawn_on_the_device_in_the_dtype(dirs):
    """On the meta device nothing is allocated: every tensor of every model lands there,
    so none was drawn on the CPU first; the default dtype comes back afterwards."""
    components = random_components(dirs["wan22_ti2v"][1], {"vae"}, dtype=torch.bfloat16,
                                   device="meta")
    assert set(components) == {"transformer", "text_encoder"}  # vae: the caller's
    for model in components.values():
        assert {t.device.type for t in _tensors(model).values()} == {"meta"}
    state = torch.random.get_rng_state()
    with drawing("meta", torch.float16):
        assert (torch.empty(2).device.type, torch.empty(2).dtype) == ("meta", torch.float16)
        torch.rand(3, device="cpu")
    assert torch.get_default_dtype() == torch.float32
    assert torch.equal(torch.random.get_rng_state(), state)  # the process's, untouched


def test_bad_values_and_missing_configs_fail_the_load(dirs, tmp_path):
    stripped = dirs["wan22_ti2v"][1]
    for bad in ("random", "DUMMY", 1):
        with pytest.raises(EngineLoadError, match=r"load_format .* is not one of auto, dummy"):
            _wan(stripped, bad)
    with pytest.raises(EngineLoadError, match="is not one of auto, dummy"):
        _flux2(dirs["flux2"][1], "safetensors")
    assert [common.load_format(o) for o in ({}, {"load_format": None},
                                            {"load_format": "dummy"})] == [
        "auto", "auto", "dummy"]
    broken = Path(shutil.copytree(stripped, tmp_path / "broken"))
    (broken / "transformer" / "config.json").unlink()
    with pytest.raises(EngineLoadError, match=r"no config\.json for transformer/"):
        _wan(str(broken), "dummy")
