"""A stage's option ``quantization`` at load time, and the server flag --quantization.

In a pipeline file, ``options: {quantization: fp8}`` on a stage whose engine kind cannot
store its weights in fp8 (omni/engines/kinds.py: only ar and diffusion can) fails the load
naming the stage, as does a value that is no known method: before any engine starts.
``quantization: null`` is none, the default. ``quantization_method`` is the one check of
the value: the config's here, and the engine's (omni/engines/quantization/) for an engine
built from options that no pipeline file checked.

The flag applies the method to every stage that can take it, in every served pipeline,
and leaves the others as they are: an omni model's server asked for fp8 runs its AR stages
(thinker, talker) in fp8 and its vocoder as it was, and a server of an LLM beside a TTS
voice runs the LLM in fp8. That is what a user asking a whole server for fp8 means; failing
because one stage is a vocoder would make the flag useless for every speech model. Each stage's READY
line and card on /v1/models say whether it runs fp8, so nothing is silent. Only when no
served stage can take it does the start fail: then the flag would change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.config.checks import ConfigError
from omni.config.stage_flags import require_a_taker, stage_kind_setting, with_stage_option
from omni.engines.kinds import QUANTIZATIONS, QUANTIZING_KINDS


def quantization_method(value: object) -> str | None:
    """A stage's option ``quantization`` -> its method ('fp8'), or None for none, null or
    unset (the model's own dtype); ValueError for anything else."""
    if value is None or value == "none":
        return None
    if not isinstance(value, str) or value not in QUANTIZATIONS:
        raise ValueError(f"must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")
    return value


def check_stage_quantization(src: str, path: str, raw: Mapping[str, Any],
                             options: Mapping[str, Any]) -> None:
    """``options.quantization`` of the stage ``raw`` at ``path`` (an unknown engine kind is
    left to the engine check)."""
    kind = stage_kind_setting(raw, options, "quantization")
    if kind is None:
        return
    value = options["quantization"]
    try:
        method = quantization_method(value)
    except ValueError:
        raise ConfigError(src, f"{path}.options.quantization",
                          f"unknown method {value!r} on stage '{raw.get('name')}'",
                          f"Use one of {', '.join(QUANTIZATIONS)}") from None
    if method is not None and not kind.quantizes:
        raise ConfigError(src, f"{path}.options.quantization",
                          f"stage '{raw.get('name')}' is a {kind.name} stage, which cannot store "
                          f"its weights in {method}",
                          f"Only {' and '.join(QUANTIZING_KINDS)} stages can; remove it there")


def with_quantization(pipelines: list[Any], method: str) -> list[Any]:
    """Each pipeline (a PipelineConfig) with ``quantization: method`` on every stage that
    can take it, its views alike; ConfigError if no stage of any can (see the module doc)."""
    try:
        chosen = quantization_method(method)
    except ValueError:
        raise ConfigError("command line", "--quantization", f"unknown method {method!r}",
                          f"Use one of {', '.join(QUANTIZATIONS)}") from None
    if chosen is not None:
        require_a_taker(pipelines, "--quantization", _quantizes,
                        f"store its weights in {method}", QUANTIZING_KINDS)
    return with_stage_option(pipelines, "quantization", method, _quantizes)


def _quantizes(kind: Any) -> bool:
    return kind.quantizes
