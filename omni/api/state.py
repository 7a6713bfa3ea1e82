"""What the app holds and every handler reads: the served models, the metrics, the
server settings (app keys), and the helpers that look a model's stages up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api.errors import APIError
from omni.config.request_defaults import effective_defaults
from omni.media.fetch import FetchPolicy
from omni.runtime.async_omni import AsyncOmni
from omni.runtime.metrics import Metrics

# outputs the realtime layer reads (speech started / stopped), not answers a client asks
# for: left off the model card
SIGNAL_MODALITIES = ("voice_activity",)
# what a stage's card on /v1/models repeats of its READY: where it runs, and for an AR stage
# what its KV cache holds (how many sequences of the full context fit at once), and whether
# its weights run quantized (fp8) and how many linear layers are, and whether they are
# random (load_format dummy: its outputs are noise)
STAGE_CARD_KEYS = ("python", "versions", "device", "max_num_seqs", "kv_tokens", "max_context",
                   "full_context_sequences", "quantization", "quantized_weights",
                   "load_format")


@dataclass
class ServedModel:
    """One pipeline as the API sees it: an id clients put in ``model``, and its runtime."""

    id: str
    omni: AsyncOmni
    created: int = field(default_factory=lambda: int(time.time()))
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.omni.pipeline.modalities

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return self.omni.pipeline.input_modalities

    def card(self) -> dict[str, Any]:
        """The /v1/models entry; extra keys beyond OpenAI's are ignored by clients."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "omni",
                "modalities": [m for m in self.modalities if m not in SIGNAL_MODALITIES],
                "input_modalities": list(self.input_modalities),
                "defaults": self.request_defaults(), "stages": self.stage_environments(),
                **self.metadata}

    def stage_environments(self) -> dict[str, dict[str, Any]]:
        """stage -> its engine kind and, from a live replica's READY, the interpreter and
        library versions it runs with: a stage may run in an environment of its own
        (`python:` / `env:`, docs/pipeline.md), with other versions than the server's."""
        cards = {}
        for stage in self.omni.pipeline.stages:
            info = self.omni.stage_info(stage.name)
            cards[stage.name] = {"engine": stage.engine, "replicas": stage.replicas,
                                 **{k: info[k] for k in STAGE_CARD_KEYS if k in info}}
        return cards

    def request_defaults(self) -> dict[str, dict[str, dict[str, Any]]]:
        """output modality -> stage -> the params a request asking for it gets when it
        sets none: the model's own (an AR stage's generation_config.json, from its live
        engine), then the pipeline's (docs/pipeline.md, "Request defaults"). Stages with
        neither are left out."""
        pipeline = self.omni.pipeline
        cards = {}
        for modality in self.modalities:
            if modality in SIGNAL_MODALITIES:
                continue
            params = effective_defaults(pipeline, [modality])
            stages = {}
            for stage in pipeline.route([modality]).stages:
                model = self.omni.stage_info(stage).get("sampling_defaults") or {}
                if model or params[stage]:
                    stages[stage] = {**model, **params[stage]}
            cards[modality] = stages
        return cards


class ModelRegistry:
    """Served models by id; handlers look models up here and nowhere else."""

    def __init__(self, models: list[ServedModel]) -> None:
        self.by_id = {m.id: m for m in models}

    def __iter__(self) -> Any:
        return iter(self.by_id.values())

    def get(self, model_id: Any) -> ServedModel:
        if not isinstance(model_id, str) or not model_id:
            raise APIError(400, "'model' is required: one of " + self.listing(), param="model")
        model = self.by_id.get(model_id)
        if model is None:
            raise APIError(404, f"model '{model_id}' is not served here; served: "
                           f"{self.listing()}", param="model", code="model_not_found")
        return model

    def producing(self, modality: str) -> list[ServedModel]:
        return [m for m in self if modality in m.modalities]

    def listing(self) -> str:
        return ", ".join(f"{m.id} ({'+'.join(m.modalities)})" for m in self)


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_request_bytes: int = 16 * 1024 * 1024
    drain_timeout_s: float = 30.0
    max_speech_chars: int = 4096  # OpenAI's limit for /v1/audio/speech input
    max_audio_bytes: int = 25 * 1024 * 1024  # an uploaded audio file (OpenAI's limit)
    max_audio_seconds: float = 300.0  # decoded audio; it rides in one control message
    data_dir: str | None = None  # video jobs and files (None: video_jobs.default_data_dir)
    video_retention_s: float = 24 * 3600.0  # finished videos are deleted after this
    max_video_jobs: int = 16  # queued + running video jobs; beyond: 429
    media_fetch: FetchPolicy = field(default_factory=FetchPolicy)  # media URLs in requests
    policy_seed: int | None = None  # OpenPI: call k of a connection draws seed + k
    max_observation_bytes: int = 64 * 1024 * 1024  # one OpenPI frame (several cameras)
    ui: bool = True  # the browser playground at / (omni/api/ui); --no-ui turns it off


def live_output_info(model: ServedModel, modality: str) -> dict[str, Any]:
    """What the stage giving ``modality`` reported at load; a 503 while none is live."""
    info = model.omni.output_info(modality)
    if not info:
        raise APIError(503, f"model '{model.id}' has no live {modality} stage right now; "
                       "retry shortly", "server_error", code="stage_unavailable",
                       headers={"retry-after": "5"})
    return info


MODELS_KEY = web.AppKey("models", ModelRegistry)
METRICS_KEY = web.AppKey("metrics", Metrics)
SETTINGS_KEY = web.AppKey("settings", ServerSettings)
