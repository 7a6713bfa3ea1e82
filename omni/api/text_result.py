"""What one text choice produced (TextResult), and a request's usage over its choices:
shared by the text endpoints (text.py, text_stream.py) and chat with audio (chat_audio.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni.api.tools import CallStream


@dataclass
class TextResult:
    """What one choice produced, accumulated from its outputs."""

    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine did not recompute (prefix cache, session KV)
    completion_tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    calls: CallStream | None = None  # the answer read for tool calls (omni/api/tools.py)

    @property
    def reason(self) -> str:
        """The finish reason a client sees: "tool_calls" when the answer made calls."""
        if self.calls is not None and self.calls.ids and self.finish_reason == "stop":
            return "tool_calls"
        return self.finish_reason

    def add(self, data: dict[str, Any]) -> str:
        delta = data.get("text", "") or ""
        self.text += delta
        self.prompt_tokens = data.get("prompt_tokens", self.prompt_tokens)
        self.cached_tokens = data.get("cached_tokens", self.cached_tokens)
        self.completion_tokens += len(data.get("token_ids", ()))
        self.finish_reason = data.get("finish_reason") or self.finish_reason
        self.logprobs += data.get("logprobs") or []
        return delta


def usage(results: list[TextResult]) -> dict[str, Any]:
    prompt = max((r.prompt_tokens for r in results), default=0)  # one prompt for all choices
    # each choice is its own engine request; the first ran the prompt, so the least
    # cached of them is what this request reused
    cached = min((r.cached_tokens for r in results), default=0)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0}}
