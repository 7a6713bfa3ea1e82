"""A pipeline's ``defaults:`` block: request params per output modality and stage.

A stage's ``params`` apply to every request it runs (under every served id, views
included); ``defaults`` apply to the requests of this pipeline that ask for a modality::

    defaults:
      audio:                  # requests whose answer is spoken
        llm: {max_tokens: 96, system_prompt: "Answer in one or two short sentences."}

A request's params for one stage, lowest first: what the stage's engine takes from its
model (an AR stage: generation_config.json), the stage's ``params``, ``defaults`` of each
modality the request asks for (in the block's order), then the request's own params
(docs/pipeline.md, "Request defaults"). A view takes none of its pipeline's ``defaults``;
it may set its own.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from omni.config.checks import ConfigError, as_mapping, check_choice

Defaults = Mapping[str, Mapping[str, Mapping[str, Any]]]


def parse_request_defaults(src: str, raw: object, stages: Iterable[str],
                           outputs: Mapping[str, Any]) -> Defaults:
    """modality -> stage -> params, checked: known modalities and stages, mappings."""
    names = list(stages)
    parsed = {}
    for modality, per_stage in as_mapping(src, "defaults", raw).items():
        path = f"defaults.{modality}"
        if modality not in outputs:
            raise ConfigError(src, path, f"'{modality}' is not an output modality of this "
                              f"pipeline", f"Use one of: {', '.join(outputs)}")
        parsed[modality] = {check_choice(src, f"{path}.{stage}", stage, names, "stage"):
                            as_mapping(src, f"{path}.{stage}", params)
                            for stage, params in as_mapping(src, path, per_stage).items()}
    return parsed


def stage_defaults(params: Mapping[str, Any], defaults: Defaults, stage: str,
                   modalities: Iterable[str]) -> dict[str, Any]:
    """One stage's default params for a request asking for ``modalities``."""
    merged = copy.deepcopy(dict(params))
    asked = set(modalities)
    for modality, per_stage in defaults.items():
        if modality in asked and stage in per_stage:
            merged.update(copy.deepcopy(dict(per_stage[stage])))
    return merged


def effective_defaults(pipeline: Any, modalities: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Every stage's default params (stage params + ``defaults``) for these modalities."""
    return {s.name: stage_defaults(s.params, pipeline.defaults, s.name, modalities)
            for s in pipeline.stages}
