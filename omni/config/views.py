"""Views: served ids that run a part of a pipeline on the pipeline's own engine processes.

A pipeline file may list, under ``views``, sub-pipelines made of some of its stages::

    views:
      chat: {stages: [llm]}                              # the LLM alone, text in, text out
      listen: {stages: [asr], outputs: {text: [asr]}}    # asr's output is final here

Each view is validated like a pipeline of its own (its stages, the edges between them,
its ``outputs``: given, or the stages' ``final_output``) and served under its name, but
its requests run on the parent pipeline's replicas: every model is loaded once, however
many ids serve it (omni/runtime/async_omni.py, ``AsyncOmni.view``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from omni.config.checks import (
    ConfigError,
    as_list,
    as_mapping,
    check_choice,
    check_keys,
    require,
)

VIEW_KEYS = ("stages", "outputs", "default_modalities", "defaults")  # own defaults only
INHERITED = ("max_inflight", "request_timeout_s")


def parse_views(src: str, data: Mapping[str, Any], base_dir: str | None,
                parse: Callable[..., Any]) -> dict[str, Any]:
    """name -> PipelineConfig of each view in ``data["views"]`` (``data`` is valid)."""
    raw = as_mapping(src, "views", data.get("views"))
    stages = {s["name"]: s for s in data["stages"]}
    views = {}
    for name, spec in raw.items():
        path = f"views.{name}"
        if name == data.get("name"):
            raise ConfigError(src, path, "a view cannot have its pipeline's name",
                              "Name the view after what it serves, e.g. the model")
        spec = as_mapping(src, path, spec, allow_none=False)
        check_keys(src, path, spec, VIEW_KEYS)
        views[name] = parse(_sub_pipeline(src, path, name, spec, data, stages),
                            f"{src} (view '{name}')", base_dir)
    return views


def _sub_pipeline(src: str, path: str, name: str, spec: Mapping[str, Any],
                  data: Mapping[str, Any], stages: Mapping[str, Any]) -> dict[str, Any]:
    chosen = [check_choice(src, f"{path}.stages[{i}]", s, stages, "stage")
              for i, s in enumerate(as_list(src, f"{path}.stages",
                                            require(src, path, spec, "stages", "[llm]")))]
    picked = {s: copy.deepcopy(stages[s]) for s in chosen}
    outputs = spec.get("outputs")
    if outputs is not None:  # the view says which stages are final, and for what
        for stage in picked.values():
            stage.pop("final_output", None)
        for modality, finals in as_mapping(src, f"{path}.outputs", outputs).items():
            for i, final in enumerate(as_list(src, f"{path}.outputs.{modality}", finals)):
                check_choice(src, f"{path}.outputs.{modality}[{i}]", final, picked, "stage")
                picked[final]["final_output"] = modality
    sub: dict[str, Any] = {
        "name": name, "stages": list(picked.values()),
        "edges": [e for e in data.get("edges") or ()
                  if isinstance(e, Mapping) and e.get("from") in picked and e.get("to") in picked],
        **{key: data[key] for key in INHERITED if key in data},
    }
    if outputs is not None:
        sub["outputs"] = outputs
    for key in ("default_modalities", "defaults"):
        if key in spec:
            sub[key] = spec[key]
    return sub
