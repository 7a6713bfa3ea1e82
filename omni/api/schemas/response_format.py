"""``response_format`` of /v1/chat/completions and /v1/completions: OpenAI's
{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
"strict", "description"}}, turned into the engine's ``json_schema`` sampling param (the
schema's JSON text; json_object is {"type": "object"}). The grammar library checks the
schema (`check_response_format`, off the event loop): what it refuses is a 400 naming the
feature, on param "response_format"; so is a schema over MAX_SCHEMA_CHARS.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictStr, model_validator

from omni.api.errors import APIError
from omni.api.schemas import RequestModel, checked, choice, cross_field

MAX_SCHEMA_CHARS = 32_768  # of the schema's JSON text: a bigger one is a 400
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # as omni/engines/ar/grammar.py's
PARAM = "response_format"


FormatName = Annotated[StrictStr, Field(min_length=1, max_length=64,
                                        pattern=r"^[A-Za-z0-9_-]+$")]


class JsonSchemaFormat(RequestModel):
    name: FormatName
    description: StrictStr | None = None
    schema_: checked(dict[str, Any], "must be a JSON Schema object") | None = Field(
        None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(RequestModel):
    type: choice(("text", "json_object", "json_schema"))
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise cross_field("json_schema", "type 'json_schema' needs 'json_schema': "
                              "{\"name\": ..., \"schema\": {...}}")
        return self

    def schema_text(self) -> str | None:
        """The schema the answer must follow, as JSON text; None: free text."""
        if self.type == "json_object":
            return JSON_OBJECT_SCHEMA
        if self.type == "json_schema":
            # no schema: any JSON object, as OpenAI's json_schema without one
            schema = self.json_schema.schema_
            return JSON_OBJECT_SCHEMA if schema is None else json.dumps(closed_objects(schema))
        return None


# subschema keywords walked when closing objects: name -> how its value holds schemas
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
        "propertyNames", "unevaluatedItems")
_LISTS = ("prefixItems", "anyOf", "oneOf")
_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def closed_objects(schema: Any, close_here: bool = True) -> Any:
    """``schema`` with every object that lists ``properties`` and says nothing about
    other keys closed (``additionalProperties: false``). Constrained decoding follows a
    schema exactly, and plain JSON Schema lets an object hold any other key: random or
    small models then add keys until max_tokens (instructor's and pipecat's schemas omit
    the keyword). OpenAI's strict mode requires it on every object; vLLM's default
    grammar backend closes them the same way. A schema that wants other keys says
    ``additionalProperties: true`` (or patternProperties). ``allOf`` branches are left
    open: closing each would forbid the keys the others bring."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = closed_objects(out[key])
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(s, close_here=False) for s in out["allOf"]]
    if close_here and isinstance(out.get("properties"), dict) and not any(
            k in out for k in ("additionalProperties", "patternProperties",
                               "unevaluatedProperties")):
        out["additionalProperties"] = False
    return out


def _problem(schema: str) -> str | None:
    from llguidance import LLMatcher  # no torch: the front end does not import it
    try:
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(
            json.loads(schema), defaults={"whitespace_flexible": False}))
    except ValueError as e:
        return str(e)
    return error or None


async def check_response_format(fmt: ResponseFormat | None, param: str = PARAM,
                                schema_field: str = "response_format.json_schema.schema",
                                ) -> str | None:
    """The request's schema text, once the grammar library takes it; else a 400 on
    ``param`` (the Responses API's format is ``text.format``, its schema ``text.format.schema``)."""
    schema = fmt.schema_text() if fmt is not None else None
    if schema is None or schema == JSON_OBJECT_SCHEMA:
        return schema
    if len(schema) > MAX_SCHEMA_CHARS:
        raise APIError(400, f"'{schema_field}' is {len(schema)} characters of JSON; at most "
                       f"{MAX_SCHEMA_CHARS} are taken", param=param)
    problem = await asyncio.to_thread(_problem, schema)
    if problem:
        raise APIError(400, f"'{param}' schema not supported: {problem}", param=param)
    return schema
