"""OpenAI error objects for every failure, and the middleware that guarantees them."""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from omni.config.pipeline import UnknownModalityError, UnsupportedInputError
from omni.errors import (
    AdmissionError,
    DeadlineExceededError,
    DuplicateRequestIdError,
    InvalidInputError,
    OmniError,
    RejectedInputError,
    ReplicaDeadError,
    RequestAbortedError,
    RequestFailedError,
    ServerStoppedError,
    ShuttingDownError,
    StageUnavailableError,
)

log = logging.getLogger("omni.api")


class APIError(Exception):
    """An error with its HTTP status and OpenAI error fields, raised by handlers."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


# (status, type, code, extra headers); retry hints follow the openai SDK's rules
_OMNI_ERRORS: list[tuple[type[Exception], int, str, str | None, dict[str, str]]] = [
    (AdmissionError, 429, "rate_limit_error", "too_many_requests", {"retry-after": "1"}),
    (ShuttingDownError, 503, "server_error", "shutting_down", {"retry-after": "5"}),
    (StageUnavailableError, 503, "server_error", "stage_unavailable", {"retry-after": "5"}),
    (ReplicaDeadError, 500, "server_error", "replica_died", {}),
    (RejectedInputError, 400, "invalid_request_error", "invalid_input", {}),
    (RequestFailedError, 500, "server_error", "request_failed", {"x-should-retry": "false"}),
    (DeadlineExceededError, 504, "server_error", "deadline_exceeded", {"x-should-retry": "false"}),
    (ServerStoppedError, 503, "server_error", "server_stopped", {}),  # before its base
    (RequestAbortedError, 503, "server_error", "aborted", {}),
    (UnknownModalityError, 400, "invalid_request_error", None, {}),
    (UnsupportedInputError, 400, "invalid_request_error", "unsupported_input", {}),
    (InvalidInputError, 400, "invalid_request_error", "invalid_input", {}),
    (DuplicateRequestIdError, 400, "invalid_request_error", "duplicate_request_id", {}),
]


def from_exception(exc: Exception) -> APIError:
    """Translate an orchestrator error to its OpenAI form."""
    if isinstance(exc, APIError):
        return exc
    for cls, status, type_, code, headers in _OMNI_ERRORS:
        if isinstance(exc, cls):
            param = ("modalities" if cls is UnknownModalityError
                     else getattr(exc, "field", None))  # RejectedInputError's, when named
            return APIError(status, str(exc), type_, param, code, headers)
    if isinstance(exc, OmniError):
        return APIError(500, str(exc), "server_error", None, None)
    return APIError(500, "internal server error; see the server log", "server_error")


def sse_error_event(exc: Exception, event_type: str | None = None) -> bytes:
    """The only way to report a failure after a 200 stream has started; event_type adds
    a "type" key (speech SSE events are typed)."""
    body: dict[str, Any] = from_exception(exc).body()
    if event_type:
        body = {"type": event_type, **body}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _http_error(exc: web.HTTPException, request: web.Request) -> APIError:
    status = exc.status
    if status == 404:
        return APIError(404, f"no such endpoint: {request.method} {request.path}", code="not_found")
    if status == 405:
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
        return APIError(405, f"method {request.method} is not allowed on {request.path}",
                        code="method_not_allowed", headers=allow)
    if status == 413:
        limit = request.app[MAX_BYTES_KEY]
        return APIError(413, f"request body too large (limit {limit} bytes)",
                        code="request_too_large")
    return APIError(status, exc.reason or "request error")


MAX_BYTES_KEY = web.AppKey("max_request_bytes", int)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()
    except (OmniError, UnknownModalityError, UnsupportedInputError) as exc:
        return from_exception(exc).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc, request).response()
    except HttpProcessingError as exc:  # a body part aiohttp cannot parse (multipart headers)
        return APIError(400, f"malformed request body: {exc.message.strip()}").response()
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return from_exception(RuntimeError()).response()


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400/413 in OpenAI form."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body
