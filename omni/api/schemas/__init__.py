"""Declared request bodies (pydantic v2) and the one place their errors become 400s.

Pydantic, not msgspec: its JSON Schema (2020-12) is what OpenAPI 3.1 embeds as is, so
/openapi.json is generated from the same classes that validate; vLLM's OpenAI server uses
it too, so field semantics match what its users know. Unknown fields are accepted and
ignored (OpenAI clients send fields newer than this server); a known field of the wrong
type or out of range is a 400 whose ``param`` is the field's path (``messages[0].role``).

Fields that need a clearer message than pydantic's own are declared with `checked`: the
message ("must be a number in [0, 2]") is shown after the field's name with the value
that was sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, WrapValidator
from pydantic_core import PydanticCustomError

from omni.api.errors import APIError

Model = TypeVar("Model", bound=BaseModel)
SHOWN_CHARS = 60  # of a refused value, in a message
MAX_SEED = 2**63 - 1


class RequestModel(BaseModel):
    """A request body: unknown fields are accepted and ignored (extras pass through)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def checked(kind: Any, message: str) -> Any:
    """``kind`` whose every validation failure reads "'<field>' <message>, got <value>"."""
    def wrap(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("omni_checked", message + ", got {got}",
                                      {"got": _shown(value)}) from None
    return Annotated[kind, WrapValidator(wrap)]


def number_in(low: float, high: float, description: str = "") -> Any:
    return checked(Annotated[float, Field(ge=low, le=high, strict=True, allow_inf_nan=False,
                                          description=description or None)],
                   f"must be a number in [{low:g}, {high:g}]")


def int_in(low: int, high: int = MAX_SEED, description: str = "") -> Any:
    shown = (f"an integer >= {low} (below 2**63)" if high == MAX_SEED
             else f"an integer in [{low}, {high}]")
    return checked(Annotated[int, Field(ge=low, le=high, strict=True,
                                        description=description or None)],
                   f"must be {shown}")


def choice(values: tuple[str, ...]) -> Any:
    return checked(Literal[values], f"must be one of {', '.join(values)}")


# the model id; a missing or unknown one is answered by the model registry, whose message
# lists the served models (so it is not typed for validation, only documented)
ModelId = Annotated[Any, WithJsonSchema(
    {"type": "string", "description": "a served model's id (GET /v1/models)"})]


def _model_required(schema: dict[str, Any]) -> None:
    schema["required"] = sorted({*schema.get("required", ()), "model"})


class ModelRequest(RequestModel):
    """A body whose 'model' is required (documented as such; the registry checks it)."""

    model_config = ConfigDict(json_schema_extra=_model_required)
    model: ModelId = None


def cross_field(param: str, message: str) -> PydanticCustomError:
    """A rule between fields (raised by a model validator), reported on ``param``."""
    return PydanticCustomError("omni_cross_field", message, {"param": param})


def parse(model: type[Model], body: dict[str, Any]) -> Model:
    """``body`` validated as ``model``; the first problem as a 400 OpenAI error."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise to_api_error(exc) from None


def parse_at(model: type[Model], value: Any, loc: tuple[int | str, ...]) -> Model:
    """``value``, found at ``loc`` of a body, validated as ``model``; a 400 naming the
    field's whole path (``input[2].call_id``), for parts checked one by one."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise to_api_error(exc, loc) from None


def to_api_error(exc: ValidationError, prefix: tuple[int | str, ...] = ()) -> APIError:
    error = exc.errors(include_url=False)[0]
    param = field_path((*prefix, *error["loc"]))
    if error["type"] == "omni_cross_field":  # nested: "messages[0]: ...", on messages[0].x
        where = f"{param}: " if param else ""
        param = ".".join(p for p in (param, error["ctx"]["param"]) if p)
        return APIError(400, where + error["msg"], param=param)
    if error["type"] == "omni_checked":
        return APIError(400, f"'{param}' {error['msg']}", param=param)
    if error["type"] == "missing":
        return APIError(400, f"'{param}' is required", param=param)
    if error["type"] == "too_short":
        return APIError(400, f"'{param}' must have at least {error['ctx']['min_length']} "
                        "item(s)", param=param)
    return APIError(400, f"'{param}': {error['msg'].lower()}, got {_shown(error['input'])}",
                    param=param)


def field_path(loc: tuple[int | str, ...]) -> str:
    """("messages", 0, "role") -> "messages[0].role"."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
