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
            return JSON_OBJECT_SCHEMA if schema is None else json.dumps(schema)
        return None


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
