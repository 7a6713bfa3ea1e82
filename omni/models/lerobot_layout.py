"""A policy release in LeRobot's layout: its config, dataset statistics and tokenizer.

LeRobot ships (e.g. ``lerobot/pi0_base``): ``config.json`` (``"type": "pi0"``, features,
chunk size, ...), ``model.safetensors``, ``policy_preprocessor.json`` /
``policy_postprocessor.json`` whose normalizer steps name a ``state_file`` of statistics
(keys ``observation.state.mean``, ``action.std``, ``action.q01``, ...) and a ``norm_map``
(``MEAN_STD``, ``QUANTILES``, ``MIN_MAX`` or ``IDENTITY`` per feature type). The
tokenizer is named (``google/paligemma-3b-pt-224``), not shipped: offline it must sit in
the directory's ``tokenizer/`` folder (or the stage option ``tokenizer``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError

EPS = 1e-8  # LeRobot's default; a step's config may name its own ("eps")
# the statistics each mode reads: MEAN_STD's, then the bounds mapped to [-1, 1]
NEEDS = {"MEAN_STD": ("mean", "std"), "QUANTILES": ("q01", "q99"), "MIN_MAX": ("min", "max")}


@dataclass
class Normalizer:
    """One feature's statistics and mode: LeRobot 0.4.4's NormalizerProcessorStep /
    UnnormalizerProcessorStep arithmetic (normalize_processor._apply_transform)."""

    mode: str
    stats: dict[str, torch.Tensor]
    eps: float = EPS

    @property
    def width(self) -> int | None:
        """The feature's width, from the mode's own statistics: LeRobot also stores
        ``count`` (shape (1,)) beside them."""
        if self.mode not in NEEDS:
            return None
        return int(self.stats[NEEDS[self.mode][0]].shape[-1])

    def _bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = (self.stats[k] for k in NEEDS[self.mode])
        span = hi - lo
        # LeRobot substitutes eps only where the bounds coincide
        return lo, torch.where(span == 0, torch.full_like(span, self.eps), span)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "MEAN_STD":
            return (x - self.stats["mean"]) / (self.stats["std"] + self.eps)
        if self.mode in ("QUANTILES", "MIN_MAX"):
            lo, span = self._bounds()
            return 2 * (x - lo) / span - 1
        return x

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "MEAN_STD":
            return x * self.stats["std"] + self.stats["mean"]  # no eps here, as LeRobot
        if self.mode in ("QUANTILES", "MIN_MAX"):
            lo, span = self._bounds()
            return (x + 1) / 2 * span + lo
        return x


IDENTITY = Normalizer("IDENTITY", {})


def read_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EngineLoadError(f"{model_dir}: no readable config.json ({e})") from e


def _steps(model_dir: Path, name: str) -> list[dict[str, Any]]:
    path = model_dir / f"{name}.json"
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("steps", []))
    except (OSError, ValueError, AttributeError) as e:
        raise EngineLoadError(f"{path}: unreadable ({e})") from e


def _mode(step_config: dict[str, Any], feature: str, kind: str,
          config: dict[str, Any]) -> str:
    """The mode LeRobot applies to ``feature``: its step normalises only the observation
    features its ``features`` lists, by their declared type (the action always, as
    ACTION); a step without ``features`` (not LeRobot's format) goes by ``kind``."""
    norm_map = step_config.get("norm_map") or config.get("normalization_mapping") or {}
    features = step_config.get("features")
    if features is not None and kind != "ACTION":
        if feature not in features:
            return "IDENTITY"
        kind = str((features[feature] or {}).get("type", kind))
    return str(norm_map.get(kind, "IDENTITY")).upper()


def _normalizer(model_dir: Path, processor: str, feature: str, kind: str,
                config: dict[str, Any]) -> Normalizer:
    """The statistics of ``feature`` (e.g. "observation.state") from the processor's
    normalizer step; IDENTITY when the release ships none for it (as LeRobot, which
    leaves a feature without statistics as it is)."""
    from safetensors.torch import load_file

    for step in _steps(model_dir, processor):
        name = step.get("registry_name", "")
        if "normalizer" not in name or "state_file" not in step:
            continue
        step_config = step.get("config") or {}
        mode = _mode(step_config, feature, kind, config)
        if mode == "IDENTITY":
            return IDENTITY
        if mode not in NEEDS:
            raise EngineLoadError(f"{model_dir}: normalization {mode!r} of {feature} is not "
                                  "supported (MEAN_STD, QUANTILES, MIN_MAX, IDENTITY)")
        try:
            tensors = load_file(str(model_dir / step["state_file"]))
        except OSError as e:
            raise EngineLoadError(f"{model_dir}: {step['state_file']}: {e}") from e
        prefix = f"{feature}."
        stats = {k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)}
        if not stats:
            return IDENTITY
        missing = [n for n in NEEDS[mode] if n not in stats]
        if missing:  # LeRobot raises at the first call; serving unnormalised would be wrong
            raise EngineLoadError(f"{model_dir}: {step['state_file']} has no "
                                  f"{', '.join(prefix + n for n in missing)} for {mode}")
        return Normalizer(mode, stats, float(step_config.get("eps", EPS)))
    return IDENTITY


@dataclass
class LeRobotRelease:
    config: dict[str, Any]
    state: Normalizer
    actions: Normalizer
    tokenizer_dir: Path
    prompt_length: int

    @property
    def cameras(self) -> list[str]:
        """The release's camera features, in its order."""
        features = self.config.get("input_features") or {}
        return [k for k, v in features.items() if (v or {}).get("type") == "VISUAL"]

    @property
    def state_width(self) -> int | None:
        """The robot's state width: the state feature's shape, else its statistics."""
        feature = (self.config.get("input_features") or {}).get("observation.state") or {}
        shape = feature.get("shape")
        if isinstance(shape, list) and shape:
            return int(shape[-1])
        return self.state.width

    @property
    def action_width(self) -> int | None:
        """The robot's action width: the action feature's shape, else its statistics."""
        feature = (self.config.get("output_features") or {}).get("action") or {}
        shape = feature.get("shape")
        if isinstance(shape, list) and shape:
            return int(shape[-1])
        return self.actions.width


def read_release(model_dir: str | Path, tokenizer: str | None = None) -> LeRobotRelease:
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    tok = Path(tokenizer) if tokenizer else model_dir / "tokenizer"
    if not (tok / "tokenizer_config.json").exists() and not (tok / "tokenizer.json").exists():
        if (model_dir / "tokenizer_config.json").exists():
            tok = model_dir
        else:
            raise EngineLoadError(
                f"{model_dir}: no tokenizer. LeRobot releases name theirs "
                "(google/paligemma-3b-pt-224) without shipping it: copy its files into "
                f"{model_dir / 'tokenizer'} or set the stage option 'tokenizer' to a folder")
    return LeRobotRelease(
        config=config,
        state=_normalizer(model_dir, "policy_preprocessor", "observation.state", "STATE",
                          config),
        actions=_normalizer(model_dir, "policy_postprocessor", "action", "ACTION", config),
        tokenizer_dir=tok, prompt_length=int(config.get("tokenizer_max_length", 48)))
