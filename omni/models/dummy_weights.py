"""A diffusion stage's option ``load_format: dummy`` (vLLM's ``--load-format dummy``, for
our own engines): every model component of a diffusers pipeline directory is built from
its folder's config.json with random weights, drawn in the stage's dtype directly on its
device. A directory holding only the configs, tokenizers and scheduler files is then
enough to serve a release's real shapes: a 32 B transformer saved with random weights
would not fit a benchmark machine's disk, and it would only be read back as noise anyway.
The outputs are noise: this measures memory and step times, never pictures.

A model component is one that model_index.json names with a class that is a diffusers
ModelMixin or a transformers PreTrainedModel (from diffusers, transformers, or a diffusers
pipeline's own folder, as diffusers' loader finds them); the others (tokenizers,
schedulers, processors) still load from their files, through the pipeline's own
from_pretrained. Each tensor a checkpoint would hold gets the dtype from_pretrained gives
it (the stage's, or float32 where the class keeps it), so the shapes and dtypes served
are the release's.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import LOAD_FORMATS, EngineLoadError

log = logging.getLogger("omni.models.dummy_weights")
MODEL_LIBRARIES = ("diffusers", "transformers")  # any other: a diffusers pipeline folder
SEED = 0  # every dummy load of a directory draws the same weights


def wants_dummy(load_format: Any, model_dir: Any) -> bool:
    """Whether a stage's option load_format asks for random weights; EngineLoadError for a
    value that is no load format. A dummy load logs that its outputs are noise."""
    if load_format not in LOAD_FORMATS:
        raise EngineLoadError(f"load_format {load_format!r} is not one of "
                              f"{', '.join(LOAD_FORMATS)}")
    if load_format == "auto":
        return False
    log.warning("%s: load_format dummy: random weights, outputs are noise (for benchmarking "
                "shapes only)", model_dir)
    return True


def random_components(model_dir: str | Path, skip: Collection[str], *, dtype: torch.dtype,
                      device: str) -> dict[str, torch.nn.Module]:
    """component name -> its model with random weights, for every model component of
    ``model_dir`` not in ``skip`` (ones the adapter loads itself); EngineLoadError names a
    component whose folder has no config.json, before anything is drawn."""
    classes = {name: cls for name, cls in model_classes(model_dir).items() if name not in skip}
    missing = [name for name in classes if not (Path(model_dir) / name / "config.json").is_file()]
    if missing:
        raise EngineLoadError(f"load_format dummy: {model_dir} has no config.json for "
                              f"{', '.join(f'{name}/' for name in missing)}: a dummy load "
                              "builds each model component from its config")
    with drawing(device, dtype):
        return {name: _build(cls, Path(model_dir) / name, dtype) for name, cls in classes.items()}


def model_classes(model_dir: str | Path) -> dict[str, type]:
    """component name -> its torch-module class, as model_index.json names them (keys
    starting with '_' and plain settings are not components; [null, null] is an absent one)."""
    index = json.loads((Path(model_dir) / "model_index.json").read_text())
    classes = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2:
            continue
        cls = _model_class(*entry)
        if cls is not None:
            classes[name] = cls
    return classes


def _model_class(library: Any, name: Any) -> type | None:
    """The class, if it is a diffusers or transformers model; None for anything else
    (a tokenizer, a scheduler, a class this install lacks: from_pretrained reports that)."""
    if not isinstance(library, str) or not isinstance(name, str):
        return None
    try:
        if library in MODEL_LIBRARIES:
            module = importlib.import_module(library)
        else:  # a class of a diffusers pipeline's own folder (e.g. ["ltx2", "LTX2Vocoder"]),
            import diffusers.pipelines  # which diffusers' loader looks up the same way

            module = getattr(diffusers.pipelines, library, None)
        cls = getattr(module, name, None)
    except ImportError:  # a lazily imported class whose own dependency is missing
        return None
    from diffusers import ModelMixin
    from transformers import PreTrainedModel

    return cls if isinstance(cls, type) and issubclass(cls, ModelMixin | PreTrainedModel) else None


@contextmanager
def drawing(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Tensors created inside land on ``device`` in ``dtype``, from a fixed seed: a model
    built at full size on the CPU first, then moved, would need its bytes twice. The
    process's CPU random state comes back afterwards (requests draw their noise from
    generators of their own; a CUDA one is left seeded)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(SEED)
            yield
    finally:
        torch.set_default_dtype(previous)


def random_model(auto_class: Any, config: Any, device: Any,
                 dtype: torch.dtype) -> torch.nn.Module:
    """One transformers model (``auto_class``, e.g. AutoModelForCausalLM) built from its
    ``config`` with random weights drawn on ``device``, in the dtypes a checkpoint load
    would give it: an AR stage's load_format dummy."""
    with drawing(str(device), dtype):
        model = auto_class.from_config(config, dtype=dtype)
    checkpoint_dtypes(model, dtype)
    return model.eval()


def _build(cls: type, folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, PreTrainedModel

    if issubclass(cls, PreTrainedModel):
        model = cls._from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    else:
        model = cls.from_config(cls.load_config(folder))
    checkpoint_dtypes(model, dtype)
    return model.eval()


def checkpoint_dtypes(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Give every floating tensor a checkpoint holds (parameters, persistent buffers) the
    dtype from_pretrained would: ``dtype``, or float32 where the class keeps it (e.g. a
    video transformer's time embedder and norms); so a dummy load runs the release's
    dtypes. Tensors no checkpoint holds stay as built, as they do in a real load."""
    kept = _fp32_modules(model, dtype)
    saved = set(model.state_dict())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name not in saved or not tensor.is_floating_point():
            continue
        wanted = torch.float32 if _kept(name, kept) else dtype
        if tensor.dtype != wanted:
            tensor.data = tensor.data.to(wanted)


def _fp32_modules(model: torch.nn.Module, dtype: torch.dtype) -> set[str]:
    """transformers says per dtype (its dtype plan: _keep_in_fp32_modules at fp16, the
    _strict ones at fp16 and bf16); diffusers keeps its list at every dtype."""
    plan = getattr(model, "_get_dtype_plan", None)
    if plan is not None:
        return set(plan(dtype))
    return set(getattr(model, "_keep_in_fp32_modules", None) or ())


def _kept(name: str, modules: set[str]) -> bool:
    """Whether a dotted tensor name lies under one of ``modules`` (dotted names too)."""
    padded = f".{name}."
    return any(f".{module}." in padded for module in modules)
