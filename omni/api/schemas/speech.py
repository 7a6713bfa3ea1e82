"""Body of POST /v1/audio/speech (OpenAI's fields).

The input's length limit is a server setting (--max-speech-chars) and the voice list is
the model's, so the handler (omni/api/speech.py) checks those two. ``ref_audio`` and
``ref_text`` are this server's extension for models that clone a voice from a reference
clip (omni/api/speech_reference.py decodes and checks the clip against the model); ``seed``
(also an extension) seeds a sampling model's draws.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictStr, WithJsonSchema

from omni.api.schemas import ModelRequest, checked, choice, int_in, number_in
from omni.media.audio import FORMATS
from omni.models.speech import SPEED_MAX, SPEED_MIN

AUDIO_FORMATS = tuple(FORMATS)
STREAM_FORMATS = ("audio", "sse")
# the voice list is the model's (GET /v1/audio/voices): the handler's message lists it
Voice = Annotated[Any, WithJsonSchema({
    "anyOf": [{"type": "string"},
              {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}],
    "description": "a voice of the model (GET /v1/audio/voices), or {\"id\": ...}"})]


class SpeechRequest(ModelRequest):
    input: checked(Annotated[StrictStr, Field(pattern=r"\S")], "must be a non-empty string")
    voice: Voice = None
    # null means the default, as omitting the field does
    response_format: choice(AUDIO_FORMATS) | None = Field(None, description="default: mp3")
    speed: number_in(SPEED_MIN, SPEED_MAX) | None = Field(None, description="default: 1")
    stream_format: choice(STREAM_FORMATS) | None = Field(
        None, description="absent: the whole file at once")
    instructions: checked(StrictStr, "must be a string") | None = None
    ref_audio: checked(StrictStr, "must be a string: base64 audio or a data:/http(s) URL") | None = (
        Field(None, description="voice-clone models only: the reference voice, a base64 "
              "audio file (WAV, FLAC, MP3, ...) or a data: / http(s) URL of one"))
    ref_text: checked(Annotated[StrictStr, Field(pattern=r"\S")],
                      "must be a non-empty string (the words of ref_audio)") | None = Field(
        None, description="what ref_audio says; without it the voice is cloned from the "
        "speaker embedding alone")
    seed: int_in(0, description="a sampling voice model's random draws: the same seed, the "
                 "same audio, in any batch") | None = None
