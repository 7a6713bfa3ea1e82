"""Bodies of the image, video and transcription endpoints.

Image and video bodies arrive as JSON or as multipart forms (every value a string, as the
openai SDK sends ``extra_body`` there), so these models validate in pydantic's lax mode:
"3" is the integer 3. The limits that depend on the served model (size, n, steps, frames,
guidance) are the diffusion stage's and are checked by omni/api/media_params.py against
what it reported; here are the fields' types and the fixed rules.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

from omni.api.schemas import ModelId, ModelRequest, RequestModel, checked, choice
from omni.api.subtitles import FORMATS as TRANSCRIPT_FORMATS
from omni.media.image import IMAGE_FORMATS

QUALITIES = ("auto", "low", "medium", "high", "xhigh", "max", "standard", "hd")
MAX_PROMPT_CHARS = 32000
FileUpload = Annotated[Any, WithJsonSchema({"type": "string", "format": "binary"})]
Prompt = checked(Annotated[str, Field(pattern=r"\S", max_length=MAX_PROMPT_CHARS)],
                 f"must be a non-empty string of at most {MAX_PROMPT_CHARS} characters")


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # lax int/float would take true as 1
        raise ValueError("a boolean")
    return value


Number = checked(Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)],
                 "must be a number")
Integer = checked(Annotated[int, BeforeValidator(_not_bool)], "must be an integer")


class EngineFields(RequestModel):
    """The diffusion stage's per-request params, typed: what media_params.engine_params
    checks against the model's limits (also read from a chat body's extra fields)."""

    n: Integer | None = None
    seed: Integer | None = None
    num_inference_steps: Integer | None = Field(None, description="also 'steps'")
    steps: Integer | None = Field(None, description="num_inference_steps, vLLM-Omni's name")
    guidance_scale: Number | None = Field(
        None, description="also 'true_cfg_scale' or 'cfg_scale'")
    true_cfg_scale: Number | None = Field(None, description="guidance_scale, diffusers' name")
    cfg_scale: Number | None = Field(None, description="guidance_scale, another name")
    guidance_scale_2: Number | None = Field(
        None, description="the low-noise expert's guidance (two-expert video models)")
    step_cache: checked(bool | Annotated[float, Field(ge=0, le=10)],
                        "must be true, false or a threshold from 0 to 10") | None = None


class DiffusionFields(EngineFields):
    """What image and video requests share; the model's limits are checked later."""

    model: ModelId = None
    prompt: Prompt
    negative_prompt: checked(str, "must be a string") | None = None
    size: checked(str, "must be 'WIDTHxHEIGHT'") | None = Field(
        None, description="WIDTHxHEIGHT within the model's limits, or auto")


class ImageGenerationRequest(DiffusionFields):
    output_format: choice(IMAGE_FORMATS) | None = Field(None, description="default: png")
    output_compression: checked(Annotated[int, Field(ge=0, le=100)],
                                "must be an integer in [0, 100]") | None = None
    response_format: choice(("b64_json", "url")) | None = None
    background: choice(("auto", "opaque", "transparent")) | None = Field(
        None, description="transparent is refused: the models paint opaque images")
    quality: choice(QUALITIES) | None = None
    stream: checked(bool, "must be true or false") | None = None
    partial_images: checked(Annotated[int, Field(ge=0, le=3)],
                            "must be an integer in [0, 3]") | None = None


class ImageEditForm(ImageGenerationRequest):
    """multipart/form-data; 'image[]' (several files) is accepted like 'image'."""

    image: FileUpload = Field(None, description="the image to edit (PNG, JPEG or WebP)")
    mask: FileUpload = Field(None, description="PNG whose transparent pixels are edited")


class VideoRequest(DiffusionFields):
    """JSON or multipart/form-data (with 'input_reference', the first frame, as a file)."""

    seconds: Number | None = Field(None, description="> 0, up to the model's frame limit")
    num_frames: Integer | None = Field(None, description="also 'frames'; frame_step*k+1")
    frames: Integer | None = Field(None, description="num_frames, another name")


class VideoForm(VideoRequest):
    input_reference: FileUpload = Field(None, description="the first frame (image-to-video)")


class TranscriptionForm(ModelRequest):
    """multipart/form-data; every field arrives as text, validated in lax mode ("0.2" is
    0.2) by omni/api/transcriptions.py, the list fields under their plain names. 'model'
    is required (as OpenAI's): there is no default transcriber."""

    file: FileUpload = Field(..., description="the audio (any container PyAV reads)")
    language: str | None = None
    prompt: str | None = None
    response_format: choice(TRANSCRIPT_FORMATS) | None = Field(None, description="default: json")
    temperature: checked(Annotated[float, Field(ge=0, le=1)],
                         "must be a number in [0, 1]") | None = None
    stream: checked(bool, "must be true or false") | None = None
    timestamp_granularities: list[choice(("segment", "word"))] | None = Field(
        None, alias="timestamp_granularities[]")
    include: list[str] | None = Field(None, alias="include[]")
