"""What the client tests share: a bounded schema (as a pydantic model and as JSON Schema),
and httpx clients that keep the JSON bodies the frameworks send."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

MODEL = "qwen3"  # the id the session's server serves the tiny random Qwen3 under
QUESTION = "What is the weather in Paris?"


class Weather(BaseModel):
    """A weather forecast request."""

    # extra="forbid": additionalProperties false, so a constrained answer has no key
    # beyond these three and always ends (random weights would add keys of any length)
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=10)
    unit: Literal["c", "f"]
    days: int = Field(ge=1, le=7)


WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["city", "unit", "days"],
    "properties": {"city": {"type": "string", "maxLength": 10},
                   "unit": {"type": "string", "enum": ["c", "f"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}}}


class Recorder:
    """httpx clients (sync and async) whose every request's JSON body lands in ``bodies``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def _keep(self, request: httpx.Request) -> None:
        if request.content:
            self.bodies.append(json.loads(request.content))

    async def _keep_async(self, request: httpx.Request) -> None:
        self._keep(request)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self._keep]})

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self._keep_async]})

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [b for b in self.bodies if "messages" in b]
