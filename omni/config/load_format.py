"""A stage's option ``load_format`` at load time, and the server flag --load-format.

``load_format: dummy`` builds a stage's models from their configs with random weights
(omni/models/dummy_weights.py): a release's real shapes served from a directory of
configs and tokenizer files, for benchmarks whose weights would not fit the disk. Its
outputs are noise. ``auto`` (or null, or unset) loads the weights on disk.

In a pipeline file, the option on a stage whose engine kind cannot take it
(omni/engines/kinds.py: ar and diffusion can; on ar, plain causal LMs only, the others'
adapters refuse it at load) fails the load naming the stage, as does a value that is no
load format: before any engine starts. The flag works as --quantization
does (config/quantization.py): it applies to every stage that can take it, in every
served pipeline, leaves the others as they are, and fails the start only when no served
stage can take dummy, since then it would change nothing. Each stage's READY line and card
on /v1/models say when it runs random weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.config.checks import ConfigError
from omni.config.stage_flags import require_a_taker, stage_kind_setting, with_stage_option
from omni.engines.base import LOAD_FORMATS
from omni.engines.kinds import DUMMY_WEIGHT_KINDS


def check_stage_load_format(src: str, path: str, raw: Mapping[str, Any],
                            options: Mapping[str, Any]) -> None:
    """``options.load_format`` of the stage ``raw`` at ``path`` (an unknown engine kind is
    left to the engine check)."""
    kind = stage_kind_setting(raw, options, "load_format")
    if kind is None:
        return
    value = options["load_format"]
    where = f"{path}.options.load_format"
    if value is not None and value not in LOAD_FORMATS:
        raise ConfigError(src, where, f"unknown load format {value!r} on stage "
                          f"'{raw.get('name')}'", f"Use one of {', '.join(LOAD_FORMATS)}")
    if not kind.dummy_weights:  # its engine would refuse the option at load
        raise ConfigError(src, where, f"stage '{raw.get('name')}' is a {kind.name} stage, which "
                          "takes no load_format",
                          f"Only {' and '.join(DUMMY_WEIGHT_KINDS)} stages do; remove it there")


def with_load_format(pipelines: list[Any], value: str) -> list[Any]:
    """Each pipeline (a PipelineConfig) with ``load_format: value`` on every stage that can
    take it, its views alike; ConfigError for dummy if no stage of any can (module doc)."""
    if value not in LOAD_FORMATS:
        raise ConfigError("command line", "--load-format", f"unknown load format {value!r}",
                          f"Use one of {', '.join(LOAD_FORMATS)}")
    if value != "auto":
        require_a_taker(pipelines, "--load-format", _takes, f"load {value} weights",
                        DUMMY_WEIGHT_KINDS)
    return with_stage_option(pipelines, "load_format", value, _takes)


def _takes(kind: Any) -> bool:
    return kind.dummy_weights
