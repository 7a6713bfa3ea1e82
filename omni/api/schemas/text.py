"""Bodies of /v1/completions and /v1/chat/completions (OpenAI's fields, vLLM's extras).

The engine (omni/engines/ar/sampling.py) checks the sampling values again, so a pipeline
driven from Python gets the same rules; here they become 400s naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, StrictStr, model_validator

from omni.api.schemas import (
    ModelRequest,
    RequestModel,
    checked,
    choice,
    cross_field,
    int_in,
    number_in,
)
from omni.api.schemas.response_format import ResponseFormat
from omni.api.schemas.tools import ChatTools, PastToolCall, ToolChoice

MAX_N = 16
MAX_STOPS = 16


TokenIds = Annotated[list[Annotated[int, Field(ge=0, strict=True)]], Field(min_length=1)]
StopString = Annotated[StrictStr, Field(min_length=1)]
Stop = checked(StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)],
               f"must be a non-empty string or a list of up to {MAX_STOPS} of them")


class StreamOptions(RequestModel):
    include_usage: StrictBool | None = None


class SamplingFields(ModelRequest):
    """What both text endpoints take; `sampling()` maps them to the engine's names."""

    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: int_in(1, MAX_N, "choices to return") | None = None
    temperature: number_in(0.0, 2.0) | None = None
    top_p: number_in(1e-9, 1.0) | None = None
    min_p: number_in(0.0, 1.0) | None = None
    presence_penalty: number_in(-2.0, 2.0) | None = None
    frequency_penalty: number_in(-2.0, 2.0) | None = None
    repetition_penalty: number_in(1e-3, 10.0) | None = None
    max_tokens: int_in(1) | None = None
    min_tokens: int_in(0) | None = None
    top_k: int_in(-1, description="-1: no top-k cut") | None = None
    seed: int_in(0) | None = None
    stop: Stop | None = None
    stop_token_ids: checked(list[Annotated[int, Field(ge=0, strict=True)]],
                            "must be a list of token ids") | None = None
    ignore_eos: checked(StrictBool, "must be true or false") | None = None
    response_format: ResponseFormat | None = Field(
        None, description="json_object or json_schema: the answer follows the schema")

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingFields:
        most = self.max_tokens if self.max_tokens is not None else getattr(
            self, "max_completion_tokens", None)
        if self.min_tokens is not None and most is not None and self.min_tokens > most:
            raise cross_field("min_tokens", "'min_tokens' must not exceed 'max_tokens'")
        return self

    def sampling(self) -> dict[str, Any]:
        """The set fields under the engine's parameter names."""
        names = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "max_tokens", "min_tokens", "top_k", "seed",
                 "stop_token_ids", "ignore_eos")
        params = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.stop is not None:
            params["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        return params

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: checked(StrictStr | TokenIds | Annotated[list[StrictStr], Field(min_length=1,
                                                                             max_length=1)],
                    "must be a string or a list of token ids")
    logprobs: int_in(0, 5, "alternatives per token to return") | None = None

    def inputs(self) -> dict[str, Any]:
        prompt = self.prompt[0] if isinstance(self.prompt, list) and isinstance(
            self.prompt[0], str) else self.prompt
        return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}

    def logprobs_count(self) -> int | None:
        return self.logprobs


class ContentPart(RequestModel):
    """One part of a message's content: {"type": "text", "text": ...}, image_url, ...
    (the parts each model takes are checked by the handler)."""

    type: StrictStr


class ChatAudioRef(RequestModel):
    id: StrictStr


class ChatMessage(RequestModel):
    model_config = ConfigDict(json_schema_extra={
        "anyOf": [{"required": ["content"]}, {"required": ["audio"]}]})
    role: StrictStr
    content: checked(StrictStr | list[ContentPart],
                     "must be a string or a list of content parts") | None = None
    audio: ChatAudioRef | None = Field(None, description="an earlier spoken answer, by id")
    tool_calls: list[PastToolCall] | None = Field(None, description="an assistant's calls")
    tool_call_id: StrictStr | None = Field(None, description="a tool message's call")

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and self.audio is None and not self.tool_calls:
            raise cross_field("content", "a message needs a 'content' (or, for an earlier "
                              "spoken answer, 'audio': {\"id\": ...})")
        if self.role == "tool" and self.tool_call_id is None:
            raise cross_field("tool_call_id", "a 'tool' message needs the 'tool_call_id' "
                              "of the call it answers")
        return self


CHAT_AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "aac", "pcm16")


class ChatAudio(RequestModel):
    voice: checked(StrictStr | ChatAudioRef, "must be a voice name or {\"id\": ...}")
    format: choice(CHAT_AUDIO_FORMATS)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int_in(1, description="the newer name of max_tokens") | None = None
    logprobs: checked(StrictBool, "must be true or false") | None = None
    top_logprobs: int_in(0, 20) | None = None
    modalities: checked(list[StrictStr], "must be a list like [\"text\", \"audio\"]") | None \
        = None
    audio: ChatAudio | None = Field(None, description="voice and format of a spoken answer")
    audio_transcript_in_content: StrictBool | None = None
    use_audio_in_video: checked(StrictBool, "must be true or false") | None = None
    tools: ChatTools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: checked(StrictBool, "must be true or false") | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise cross_field("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        return self

    def sampling(self) -> dict[str, Any]:
        params = super().sampling()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            params["max_tokens"] = self.max_completion_tokens
        return params

    def logprobs_count(self) -> int | None:
        """Alternatives per token (0: the sampled token's only); None: not asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None
