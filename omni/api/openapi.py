"""GET /openapi.json: an OpenAPI 3.1 document of every HTTP route, built from the declared
request schemas (omni/api/schemas/), with the OpenAI error object on every error status.

`ROUTES` is the table of what each route takes and answers; tests/http/test_openapi_fuzz.py
compares it with the app's router, so a route added without an entry here fails the suite.
WebSocket routes are listed as GET with a 101 response and a description of the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from omni.api.schemas.media import (
    ImageEditForm,
    ImageGenerationRequest,
    TranscriptionForm,
    VideoForm,
    VideoRequest,
)
from omni.api.schemas.responses import ResponseCreateRequest
from omni.api.schemas.speech import AUDIO_FORMATS, SpeechRequest
from omni.api.schemas.text import ChatCompletionRequest, CompletionRequest
from omni.api.state import MODELS_KEY
from omni.media.audio import FORMATS as AUDIO_FORMAT_INFO

REF = "#/components/schemas/{model}"
OBJECT = {"type": "object"}
SSE = {"text/event-stream": {"schema": {"type": "string"}}}
JSON_OR_SSE = {"application/json": {"schema": OBJECT}, **SSE}
AUDIO = {AUDIO_FORMAT_INFO[f].content_type: {"schema": {"type": "string",
                                                        "format": "binary"}}
         for f in AUDIO_FORMATS}
ERROR_STATUSES = {"400": "invalid request (the message names the field in 'param')",
                  "401": "missing or wrong API key (when the server has one)",
                  "404": "unknown model, object or endpoint",
                  "413": "request body too large",
                  "429": "too many requests in flight; retry after 'retry-after'",
                  "500": "the request failed in the server",
                  "503": "no live replica right now, or the server is stopping",
                  "504": "the request ran past its deadline"}
ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}}}


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class Route:
    """One operation: what it reads and what a 200 (or 101) carries."""

    summary: str
    body: tuple[type[BaseModel], ...] = ()  # JSON first, then the multipart form, if any
    multipart_only: bool = False
    query: tuple[Query, ...] = ()
    ok: dict[str, Any] | None = None  # content type -> media object of the 2xx answer
    websocket: str = ""  # the protocol, for WebSocket routes

    def operation(self, path: str) -> dict[str, Any]:
        op: dict[str, Any] = {"summary": self.summary, "operationId": _operation_id(path)}
        params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                  for n in _path_names(path)]
        params += [{"name": q.name, "in": "query", "required": q.required, "schema": q.schema,
                    "description": q.description} for q in self.query]
        if params:
            op["parameters"] = params
        if self.body:
            op["requestBody"] = {"required": True, "content": self._content()}
        op["responses"] = self._responses()
        if self.websocket:
            op["description"] = self.websocket
        return op

    def _content(self) -> dict[str, Any]:
        refs = [{"$ref": REF.format(model=m.__name__)} for m in self.body]
        if self.multipart_only:
            return {"multipart/form-data": {"schema": refs[0]}}
        content = {"application/json": {"schema": refs[0]}}
        if len(refs) > 1:
            content["multipart/form-data"] = {"schema": refs[1]}
        return content

    def _responses(self) -> dict[str, Any]:
        error = {"$ref": "#/components/responses/Error"}
        responses: dict[str, Any] = {}
        if self.websocket:
            responses["101"] = {"description": "switched to the WebSocket protocol"}
        if self.ok or not self.websocket:  # "/" is both: the page, or an upgrade to OpenPI
            responses["200"] = {"description": "OK", "content": self.ok or {
                "application/json": {"schema": OBJECT}}}
        return {**responses, **{status: error for status in ERROR_STATUSES},
                "default": error}


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _operation_id(path: str) -> str:
    return "_".join(p.strip("{}") for p in path.split("/") if p) or "root"


MODEL_QUERY = Query("model", {"type": "string"}, "a served model's id")
ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/health"): Route("200 when every stage has a live replica, else 503"),
    ("GET", "/metrics"): Route("Prometheus metrics", ok={"text/plain": {
        "schema": {"type": "string"}}}),
    ("GET", "/openapi.json"): Route("this document"),
    ("GET", "/v1/models"): Route("the served models"),
    ("GET", "/v1/models/{model}"): Route("one served model"),
    ("POST", "/v1/completions"): Route("text completion (SSE with stream: true)",
                                       (CompletionRequest,), ok=JSON_OR_SSE),
    ("POST", "/v1/chat/completions"): Route(
        "chat completion: text, spoken answers (modalities), or images from an image "
        "model", (ChatCompletionRequest,), ok=JSON_OR_SSE),
    ("POST", "/v1/responses"): Route(
        "a model response (OpenAI Responses API; SSE events with stream: true)",
        (ResponseCreateRequest,), ok=JSON_OR_SSE),
    ("GET", "/v1/responses/{response_id}"): Route("a kept response (store: true)"),
    ("DELETE", "/v1/responses/{response_id}"): Route("forget a kept response"),
    ("POST", "/v1/audio/speech"): Route("text to speech (audio bytes, or SSE)",
                                        (SpeechRequest,), ok={**AUDIO, **SSE}),
    ("GET", "/v1/audio/voices"): Route("the voices of one model, or of every speaking one",
                                       query=(MODEL_QUERY,)),
    ("POST", "/v1/audio/transcriptions"): Route(
        "speech to text", (TranscriptionForm,), multipart_only=True, ok={
            **JSON_OR_SSE, "text/plain": {"schema": {"type": "string"}},
            "text/vtt": {"schema": {"type": "string"}}}),
    ("POST", "/v1/audio/translations"): Route(
        "speech to English text (refused by models that do not translate)",
        (TranscriptionForm,), multipart_only=True),
    ("POST", "/v1/images/generations"): Route("text to image (SSE with stream: true)",
                                              (ImageGenerationRequest,), ok=JSON_OR_SSE),
    ("POST", "/v1/images/edits"): Route("edit an image", (ImageEditForm,),
                                        multipart_only=True, ok=JSON_OR_SSE),
    ("POST", "/v1/videos"): Route("create a video job", (VideoRequest, VideoForm)),
    ("POST", "/v1/videos/sync"): Route("make a video and answer with the MP4",
                                       (VideoRequest, VideoForm), ok={"video/mp4": {
                                           "schema": {"type": "string", "format": "binary"}}}),
    ("GET", "/v1/videos"): Route("list video jobs", query=(
        Query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
        Query("order", {"enum": ["asc", "desc"]}), Query("after", {"type": "string"}))),
    ("GET", "/v1/videos/{video_id}"): Route("one video job"),
    ("DELETE", "/v1/videos/{video_id}"): Route("delete a video job and its files"),
    ("GET", "/v1/videos/{video_id}/content"): Route(
        "a completed video's MP4 or thumbnail",
        query=(Query("variant", {"enum": ["video", "thumbnail"]}),),
        ok={t: {"schema": {"type": "string", "format": "binary"}}
            for t in ("video/mp4", "image/jpeg")}),
    ("GET", "/v1/realtime"): Route("OpenAI Realtime API session", query=(MODEL_QUERY,),
                                   websocket="WebSocket: OpenAI Realtime events (JSON)."),
    ("GET", "/v1/duplex"): Route("full-duplex voice conversation", query=(MODEL_QUERY,),
                                 websocket="WebSocket: duplex audio and JSON events."),
    ("GET", "/v1/world"): Route("world-model session", query=(MODEL_QUERY,),
                                websocket="WebSocket: JSON events; each frame chunk is one "
                                "binary message of raw RGB (docs/worlds.md)."),
    ("GET", "/"): Route("the browser playground (a plain GET; not with --no-ui), or the "
                        "OpenPI robot policy, the only policy model (an upgrade)",
                        ok={"text/html": {"schema": {"type": "string"}}},
                        websocket="WebSocket: openpi-client's msgpack protocol."),
    ("GET", "/ui/{name}"): Route("the playground's static files (no API key needed)", ok={
        t: {"schema": {"type": "string"}} for t in ("text/javascript", "text/css",
                                                    "image/svg+xml", "text/html")}),
    ("GET", "/openpi/{model}"): Route("OpenPI robot policy of one model",
                                      websocket="WebSocket: openpi-client's msgpack protocol."),
    ("GET", "/healthz"): Route("OpenPI health check", ok={"text/plain": {
        "schema": {"type": "string"}}}),
}


def openapi_path(canonical: str) -> str:
    """aiohttp's ``/v1/models/{model:.+}`` as OpenAPI writes it: ``/v1/models/{model}``."""
    return "/".join(p.split(":")[0] + "}" if p.startswith("{") and ":" in p else p
                    for p in canonical.split("/"))


def build_document(model_ids: list[str]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), route in ROUTES.items():
        paths.setdefault(path, {})[method.lower()] = route.operation(path)
    return {"openapi": "3.1.0",
            "info": {"title": "omni", "version": "1",
                     "description": "OpenAI-compatible omni-modality serving"},
            "servers": [{"url": "/"}], "paths": paths,
            "components": {"schemas": _schemas(model_ids),
                           "responses": {"Error": {
                               "description": "an OpenAI error object; the status says "
                               "which: " + "; ".join(f"{s} {d}" for s, d in
                                                      ERROR_STATUSES.items()),
                               "content": {"application/json": {
                                   "schema": {"$ref": REF.format(model="ErrorResponse")}}}}},
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}, {}]}


def _schemas(model_ids: list[str]) -> dict[str, Any]:
    schemas: dict[str, Any] = {"ErrorResponse": ERROR_SCHEMA}
    for route in ROUTES.values():
        for model in route.body:
            schema = model.model_json_schema(ref_template=REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
    for schema in schemas.values():  # the served ids, for people reading and for fuzzers
        model = schema.get("properties", {}).get("model")
        if model is not None and model_ids:
            model["examples"] = model_ids
    return schemas


def add_routes(app: web.Application) -> None:
    document = build_document([m.id for m in app[MODELS_KEY]])  # the routes never change

    async def openapi_json(request: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_get("/openapi.json", openapi_json)
