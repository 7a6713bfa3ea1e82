"""Built-in pipelines, and picking one for a model directory.

A transformers model directory is matched by ``config.json``'s ``model_type``; a
diffusers pipeline directory by ``model_index.json``'s ``_class_name``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from omni.config.pipeline import ConfigError, PipelineConfig, load_pipeline_file, parse_pipeline
from omni.models.catalog import (  # re-exported: callers pick presets through this module
    DEFAULT_PIPELINES,
    PRESET_BY_MODEL_TYPE,
    PRESET_BY_PIPELINE_CLASS,
)

PRESET_DIR = Path(__file__).resolve().parent
__all__ = ["DEFAULT_PIPELINES", "PRESET_BY_MODEL_TYPE", "PRESET_BY_PIPELINE_CLASS", "PRESET_DIR",
           "load_pipeline", "pipeline_for_model_dir", "preset_path", "preset_with_model_dirs",
           "renamed"]


def preset_path(name: str) -> Path:
    """The file of a built-in preset, by name (``echo`` -> presets/echo.yaml)."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
        raise ConfigError(name, "pipeline", f"no such file and no built-in pipeline '{name}'",
                          f"Known built-ins: {known}")
    return path


def load_pipeline(target: str | os.PathLike, name: str | None = None) -> PipelineConfig:
    """A pipeline from a YAML file, a model directory, or a built-in preset name."""
    path = Path(target)
    if path.is_dir():
        return pipeline_for_model_dir(path, name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        config = load_pipeline_file(path)
    else:
        config = load_pipeline_file(preset_path(str(target)))
    return renamed(config, name)


def preset_with_model_dirs(name: str, model_dirs: dict[str, str]) -> PipelineConfig:
    """A built-in preset with some stages' model_dir filled in (stage name -> dir)."""
    path = preset_path(name)
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    for stage in data.get("stages", []):
        if stage.get("name") in model_dirs:
            stage["model_dir"] = str(model_dirs[stage["name"]])
    return parse_pipeline(data, source=str(path), base_dir=str(PRESET_DIR))


def pipeline_for_model_dir(model_dir: str | os.PathLike, name: str | None = None,
                           preset_file: str | None = None) -> PipelineConfig:
    """The built-in pipeline for a model directory (`preset_file`, else the one its
    config names), with its stages pointed at it."""
    model_dir = Path(model_dir).resolve()
    preset = PRESET_DIR / (preset_file or _preset_file_for(model_dir))
    data: dict[str, Any] = yaml.safe_load(preset.read_text())
    for stage in data.get("stages", []):
        stage.setdefault("model_dir", str(model_dir))
        if stage["model_dir"] is None:
            stage["model_dir"] = str(model_dir)
    # served as --served-model-name, else as the directory's name (not the preset's)
    data["name"] = name or model_dir.name
    return parse_pipeline(data, source=f"{preset} (for {model_dir})", base_dir=str(model_dir))


def model_family(model_dir: str | os.PathLike | None) -> str | None:
    """What a model directory says it is: config.json's model_type (LeRobot's "type"),
    else model_index.json's pipeline class; None when it says neither."""
    for file, key in (("config.json", "model_type"), ("model_index.json", "_class_name")):
        path = Path(model_dir or "") / file
        if model_dir and path.is_file():
            try:
                config = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            value = config.get(key) or (config.get("type") if file == "config.json" else None)
            if isinstance(value, str):
                return value
    return None


def _preset_file_for(model_dir: Path) -> str:
    for file, key, presets in (("config.json", "model_type", PRESET_BY_MODEL_TYPE),
                               ("model_index.json", "_class_name", PRESET_BY_PIPELINE_CLASS)):
        path = model_dir / file
        if not path.is_file():
            continue
        config = json.loads(path.read_text())
        # LeRobot's policy releases name their family "type", not "model_type"
        value = config.get(key) or (config.get("type") if file == "config.json" else None)
        if value in presets:
            return presets[value]
        raise ConfigError(str(path), key, f"'{value}' has no built-in pipeline",
                          f"Supported: {', '.join(sorted(presets))}; or pass "
                          "--pipeline FILE describing its stages")
    raise ConfigError(str(model_dir), "directory",
                      "not a model directory (no config.json or model_index.json)")


def renamed(config: PipelineConfig, name: str | None) -> PipelineConfig:
    """`config` served under `name` (unchanged when None)."""
    if name is None or name == config.name:
        return config
    import dataclasses

    return dataclasses.replace(config, name=name)
