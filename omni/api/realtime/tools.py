"""A realtime session's tools (protocols.md §10.10): ``tools`` (flat function tools) and
``tool_choice`` of ``session.update``, and the same two fields of ``response.create``,
which override the session's for that response only.

They are checked as chat completions' are (omni/api/tools.py: the schemas the call
grammar must follow, a named function that is in the list), before anything changes, so
a bad one is an ``error`` event naming the field and the session keeps its settings.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from omni.api.errors import APIError
from omni.api.realtime.config import ConfigError, ToolSettings
from omni.api.schemas import RequestModel, checked, parse
from omni.api.schemas.tools import MAX_TOOLS, FlatFunctionTool, NamedToolChoice
from omni.api.tools import plan_tools

ECHOED = ("type", "name", "description", "parameters")  # a tool's fields, as echoed
# realtime's choices (no allowed_tools; an MCP server's tools are not served)
ToolChoice = checked(Literal["none", "auto", "required"] | NamedToolChoice,
                     "must be \"none\", \"auto\", \"required\" or {\"type\": "
                     "\"function\", \"name\": ...}")


class RealtimeTools(RequestModel):
    tools: Annotated[list[FlatFunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None


def has_tools(raw: Any) -> bool:
    return isinstance(raw, dict) and ("tools" in raw or "tool_choice" in raw)


async def read_tools(model: Any, raw: dict[str, Any], current: ToolSettings,
                     where: str) -> ToolSettings:
    """``raw``'s tools and tool_choice over ``current`` (a key it lacks keeps its value);
    ConfigError with the field's path under ``where`` ("session" / "response")."""
    merged = {"tools": raw.get("tools", current.tools),
              "tool_choice": raw.get("tool_choice", current.choice)}
    _check_types(merged["tools"], where)
    try:
        body = parse(RealtimeTools, {k: v for k, v in merged.items() if v is not None})
        plan = await plan_tools(model, body.tools, body.tool_choice, None,
                                lambda i: f"tools[{i}].parameters")
    except APIError as exc:
        raise ConfigError(exc.message, f"{where}.{exc.param or 'tools'}") from None
    tools = [t.model_dump(include=set(ECHOED), exclude_none=True) for t in body.tools or ()]
    choice = body.tool_choice or "auto"
    if not isinstance(choice, str):
        choice = {"type": "function", "name": choice.function_name}
    return ToolSettings(tools, choice, plan)


def _check_types(tools: Any, where: str) -> None:
    """An MCP server (or any tool but a function) is refused by its type first, not by
    the function fields it lacks."""
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind is not None and kind != "function":
            raise ConfigError(f"tool type {kind!r} is not served here; only 'function' "
                              "tools are", f"{where}.tools[{i}].type")
