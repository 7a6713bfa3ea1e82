"""``tools``, ``tool_choice`` and the tool parts of a chat history, as the openai SDK sends
them (protocols.md §10.1). Only function tools are served: a custom tool is a 400 that
says so. The Responses API's flat tool shape (``{"type": "function", "name", ...}``) is
`FlatFunctionTool`; both become a `FunctionDef`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr, field_validator, model_validator

from omni.api.schemas import RequestModel, checked, choice, cross_field

MAX_TOOLS = 128
FunctionName = checked(Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")],
                       "must be a function name of 1 to 64 letters, digits, '_', '.' or '-'")
Parameters = checked(dict[str, Any], "must be a JSON Schema object")


class FunctionDef(RequestModel):
    name: FunctionName
    description: StrictStr | None = None
    parameters: Parameters | None = None
    strict: StrictBool | None = None


def _function_only(value: str) -> str:
    if value != "function":
        raise ValueError(f"tool type {value!r} is not served here; only 'function' tools are")
    return value


class ChatTool(RequestModel):
    """Chat Completions' tool: ``{"type": "function", "function": {...}}``."""

    type: StrictStr
    function: FunctionDef

    _only_functions = field_validator("type")(_function_only)


class FlatFunctionTool(FunctionDef):
    """The Responses API's and realtime's tool: the function's fields at the top."""

    type: StrictStr

    _only_functions = field_validator("type")(_function_only)

    @model_validator(mode="before")
    @classmethod
    def _type_first(cls, value: Any) -> Any:
        """Another tool type (web_search, file_search...) is refused for its type, not
        for the function fields it lacks."""
        kind = value.get("type", "function") if isinstance(value, dict) else "function"
        if isinstance(kind, str) and kind != "function":
            raise cross_field("type", f"tool type {kind!r} is not served here; only "
                              "'function' tools are")
        return value


class NamedFunction(RequestModel):
    name: FunctionName


class NamedToolChoice(RequestModel):
    """``{"type": "function", "function": {"name"}}`` (chat) or ``{"type": "function",
    "name"}`` (Responses, realtime)."""

    type: Literal["function"]
    function: NamedFunction | None = None
    name: FunctionName | None = None

    @property
    def function_name(self) -> str | None:
        return self.function.name if self.function is not None else self.name


class AllowedTools(RequestModel):
    mode: choice(("auto", "required"))
    tools: list[dict[str, Any]]


class AllowedToolsChoice(RequestModel):
    """``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`` (chat) or the
    same fields at the top (Responses)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools | None = None
    mode: choice(("auto", "required")) | None = None
    tools: list[dict[str, Any]] | None = None


ToolChoice = checked(
    Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice,
    "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}")
ChatTools = Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)]


class CalledFunction(RequestModel):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"


class PastToolCall(RequestModel):
    """An assistant's earlier call, in the history."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: CalledFunction
