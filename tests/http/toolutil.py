"""Tool schemas the tool-call tests share (chat, Responses, realtime): bounded, so a
random model's constrained call always ends within max_tokens."""

from __future__ import annotations

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
         "required": ["zone"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
