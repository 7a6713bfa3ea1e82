"""Request fields the image and video endpoints share: picking the model, and checking
size / n / steps / guidance / seed against the limits its diffusion stage reported.

Bodies arrive as JSON (typed values) or multipart forms (every value a string, as the
openai SDK sends ``extra_body`` there), so each reader accepts both forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from omni.api.errors import APIError
from omni.api.state import MODELS_KEY, ServedModel, live_output_info
from omni.models import diffusion_limits as limits_of

# extra_body names accepted for one engine param (diffusers' and vLLM-Omni's spellings)
ALIASES = {"steps": ("num_inference_steps", "steps"),
           "guidance_scale": ("guidance_scale", "true_cfg_scale", "cfg_scale"),
           "frames": ("num_frames", "frames")}


def require_served(request: web.Request, modality: str) -> list[ServedModel]:
    """The served models that output ``modality``; a 404 naming the served models when
    none does. Checked before the body: an endpoint that is not served says so whatever
    the body holds."""
    models = request.app[MODELS_KEY]
    capable = models.producing(modality)
    if not capable:
        raise APIError(404, f"{request.path} (a {modality} endpoint) is not served by this "
                       f"server. Served models: {models.listing()}", param="model",
                       code="model_not_found")
    return capable


def pick_model(request: web.Request, model_id: Any, modality: str, task: str,
               endpoint_hint: str) -> tuple[ServedModel, dict[str, Any]]:
    """The served model a request names (or the only one that can do ``task``), with the
    READY info of its ``modality`` stage. 400 when the model cannot do the task."""
    models = request.app[MODELS_KEY]
    capable = require_served(request, modality)
    if model_id in (None, ""):
        able = [m for m in capable if task in live_output_info(m, modality).get("tasks", ())]
        if len(able) != 1:
            raise APIError(400, f"'model' is required: {_can(capable, modality)}",
                           param="model")
        model = able[0]
    else:
        model = models.get(model_id)
        if modality not in model.modalities:
            raise APIError(400, f"model '{model.id}' does not output {modality}s "
                           f"({_can(capable, modality)})", param="model")
    info = live_output_info(model, modality)
    if task not in info.get("tasks", ()):
        raise APIError(400, f"model '{model.id}' ({info.get('pipeline')}) cannot do "
                       f"{task.replace('_', ' ')}: it does {', '.join(info.get('tasks', ()))}. "
                       f"{endpoint_hint}", param="model", code="unsupported_task")
    return model, info


def _can(capable: list[ServedModel], modality: str) -> str:
    return "models with " + modality + " output: " + ", ".join(
        f"{m.id} ({'/'.join(live_output_info(m, modality).get('tasks', ()))})" for m in capable)


def field(body: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """``body[name]`` as ``kind`` (int, float, bool or str); form strings are converted.
    400 naming the field when it does not convert."""
    value = body.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, str) and kind is not str:
        try:
            value = _from_text(value, kind)
        except ValueError:
            raise APIError(400, f"'{name}' must be {kind.__name__}, got {value!r}",
                           param=name) from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise APIError(400, f"'{name}' must be {kind.__name__}, got {value!r}", param=name)
    return value


def _from_text(text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    return kind(text)


def engine_params(body: Mapping[str, Any], info: Mapping[str, Any],
                  size: Any = None) -> dict[str, Any]:
    """The diffusion stage's per-request params from a body already typed by
    omni/api/schemas/media.py's EngineFields (its n, steps, guidance, seed, frames and
    step_cache are ints, floats and bools by now), checked against ``info``'s limits (the
    engine checks them again): size, n, steps, guidance_scale, guidance_scale_2 (where the
    stage reports it takes one), seed, frames."""
    lim = limits_of.from_info(info)
    params: dict[str, Any] = {}
    checks = [("n", lambda v: limits_of.bounded_int({"n": v}, "n", 1, 1, lim.max_n)),
              ("steps", lambda v: limits_of.bounded_int({"steps": v}, "steps", 1, 1,
                                                        lim.max_steps)),
              ("guidance_scale", lambda v: limits_of.guidance(
                  {"guidance_scale": v}, lim.default_guidance)),
              ("seed", lambda v: limits_of.seed_of({"seed": v}))]
    if body.get("guidance_scale_2") is not None:
        checks.append(("guidance_scale_2", lambda v: _second_guidance(v, info)))
    if lim.max_frames:
        checks.append(("frames", lambda v: limits_of.bounded_int(
            {"frames": v}, "frames", 1, 1, lim.max_frames)))
    for name, check in checks:
        spelled = next((a for a in ALIASES.get(name, (name,)) if body.get(a) is not None),
                       None)
        if spelled is None:
            continue
        try:
            params[name] = check(body[spelled])
        except ValueError as e:
            raise APIError(400, str(e).replace(f"'{name}'", f"'{spelled}'"),
                           param=spelled) from None
    if (cache := body.get("step_cache")) is not None:
        params["step_cache"] = cache
    if size not in (None, "auto"):
        try:
            limits_of.parse_size(size, lim)
        except ValueError as e:
            raise APIError(400, str(e), param="size") from None
        params["size"] = size
    return params


def _second_guidance(value: Any, info: Mapping[str, Any]) -> float:
    """``guidance_scale_2``: only models with a second (low-noise) expert take it."""
    if not info.get("guidance_scale_2"):
        raise ValueError(f"'guidance_scale_2' is for models with a second (low-noise) "
                         f"expert; {info.get('pipeline')} has one transformer")
    try:
        return limits_of.guidance({"guidance_scale": value}, 0.0)
    except ValueError as e:
        raise ValueError(str(e).replace("'guidance_scale'", "'guidance_scale_2'")) from None


def prompt(body: Mapping[str, Any], limit: int = 32000) -> str:
    value = body.get("prompt")
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, "'prompt' is required (a non-empty string)", param="prompt")
    if len(value) > limit:
        raise APIError(400, f"'prompt' is longer than {limit} characters", param="prompt")
    return value


def negative_prompt(body: Mapping[str, Any]) -> dict[str, str]:
    value = body.get("negative_prompt")
    if value is None:
        return {}
    if not isinstance(value, str):
        raise APIError(400, "'negative_prompt' must be a string", param="negative_prompt")
    return {"negative_prompt": value}
