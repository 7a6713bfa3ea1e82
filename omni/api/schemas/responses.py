"""Body of POST /v1/responses (OpenAI's Responses API, protocols.md §10.6) and its input
items.

The top-level fields are declared here; ``input`` is a string or a list of items of
several shapes told apart by ``type``, each checked by its own model (`ITEM_MODELS`,
`PART_MODELS`) where the handler reads it (omni/api/response_items.py), so a bad item is
a 400 naming its own path (``input[2].call_id``) rather than every shape it failed.
Fields OpenAI has and this server does not use (``include``, ``truncation``,
``reasoning``, ``user``, ``prompt_cache_key``, ``service_tier``...) are accepted and
ignored, as any unknown field is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr, model_validator

from omni.api.schemas import (
    ModelRequest,
    RequestModel,
    checked,
    choice,
    cross_field,
    int_in,
    number_in,
)
from omni.api.schemas.response_format import FormatName, JsonSchemaFormat, ResponseFormat
from omni.api.schemas.tools import MAX_TOOLS, FlatFunctionTool, FunctionName, ToolChoice

MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
Parts = checked(StrictStr | list[dict[str, Any]], "must be a string or a list of content parts")


class TextFormat(RequestModel):
    """``text.format``: flat, no ``json_schema`` wrapper (unlike chat's response_format)."""

    type: choice(("text", "json_object", "json_schema"))
    name: FormatName | None = None
    description: StrictStr | None = None
    schema_: checked(dict[str, Any], "must be a JSON Schema object") | None = Field(
        None, alias="schema")
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _named(self) -> TextFormat:
        if self.type == "json_schema" and self.name is None:
            raise cross_field("name", "type 'json_schema' needs the format's 'name'")
        return self

    def response_format(self) -> ResponseFormat:
        """As chat's response_format, which the engine's schema check takes."""
        if self.type != "json_schema":
            return ResponseFormat(type=self.type)
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
            name=self.name, description=self.description, schema=self.schema_,
            strict=self.strict))


class TextConfig(RequestModel):
    format: TextFormat | None = None


Metadata = checked(
    Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(
        max_length=512)]], Field(max_length=MAX_METADATA_KEYS)],
    f"must be an object of up to {MAX_METADATA_KEYS} string values (keys up to 64 "
    "characters, values up to 512)")


class ResponseCreateRequest(ModelRequest):
    input: checked(StrictStr | list[dict[str, Any]],
                   "must be a string or a list of input items") | None = Field(
        None, description="a user message, or items: messages, function_call, "
        "function_call_output (protocols.md §10.6)")
    instructions: StrictStr | None = Field(None, description="a system message, first")
    tools: Annotated[list[FlatFunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: checked(StrictBool, "must be true or false") | None = None
    text: TextConfig | None = None
    max_output_tokens: int_in(1) | None = None
    temperature: number_in(0.0, 2.0) | None = None
    top_p: number_in(1e-9, 1.0) | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = Field(None, description="keep the response for "
                                     "previous_response_id and GET (default true)")
    previous_response_id: StrictStr | None = None
    metadata: Metadata | None = None

    @property
    def stores(self) -> bool:
        return self.store is not False  # OpenAI's default: kept


# ---- input items (checked one by one, omni/api/response_items.py) ----------------------

class MessageItem(RequestModel):
    """A role message (``type`` may be left out), or a replayed output message."""

    type: Literal["message"] | None = None
    role: choice(("user", "assistant", "system", "developer"))
    content: Parts


class FunctionCallItem(RequestModel):
    """A call the model made earlier (replayed output)."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: FunctionName
    arguments: StrictStr


class FunctionCallOutputItem(RequestModel):
    """The result of a call, by its ``call_id``."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Parts


class ItemReference(RequestModel):
    type: Literal["item_reference"]
    id: StrictStr


class ReasoningItem(RequestModel):
    """A reasoning model's replayed reasoning: taken and left out of the prompt (this
    server's models give none, so it carries nothing they need)."""

    type: Literal["reasoning"]


ITEM_MODELS: dict[str, type[RequestModel]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem, "item_reference": ItemReference,
    "reasoning": ReasoningItem}


class TextPart(RequestModel):
    type: Literal["input_text", "output_text"]
    text: StrictStr


class RefusalPart(RequestModel):
    type: Literal["refusal"]
    refusal: StrictStr


class ImagePart(RequestModel):
    type: Literal["input_image"]
    image_url: StrictStr | None = None
    file_id: StrictStr | None = None
    detail: choice(("low", "high", "auto", "original")) | None = None

    @model_validator(mode="after")
    def _has_image(self) -> ImagePart:
        if self.image_url is None:
            raise cross_field("image_url", "an input_image needs an 'image_url' (a data: "
                              "or http(s) URL); file ids are not served here")
        return self


PART_MODELS: dict[str, type[RequestModel]] = {
    "input_text": TextPart, "output_text": TextPart, "refusal": RefusalPart,
    "input_image": ImagePart}
