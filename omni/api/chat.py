"""/v1/chat/completions: one endpoint, answered by what the model outputs and what the
request asks for: an image (chat_images.py), audio (chat_audio.py) or text (text.py),
with the media a message carries read first (chat_media.py)."""

from __future__ import annotations

from aiohttp import web

from omni.api.chat_audio import (
    TRANSCRIPTS_KEY,
    Transcripts,
    chat_with_audio,
    restore_audio_turns,
    wants_audio,
)
from omni.api.chat_images import chat_image
from omni.api.chat_media import prepare_media
from omni.api.errors import APIError, read_json
from omni.api.schemas import parse
from omni.api.schemas.text import ChatCompletionRequest
from omni.api.state import MODELS_KEY
from omni.api.text import EXTRA_INPUTS, TextCall, respond


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = parse(ChatCompletionRequest, body)
    model = request.app[MODELS_KEY].get(body.get("model"))
    if "text" not in model.modalities and "image" in model.modalities:
        return await chat_image(request, body, model)
    restore_audio_turns(request, body)
    request[EXTRA_INPUTS] = await prepare_media(request, model, body)
    if wants_audio(req):
        if req.response_format is not None and req.response_format.type != "text":
            raise APIError(400, "'response_format' json_object / json_schema is for text "
                           "answers; a spoken answer (modalities with \"audio\") is free "
                           "text", param="response_format")
        if req.tools and req.tool_choice != "none":
            raise APIError(400, "tool calls are answered in text; ask for modalities "
                           "[\"text\"] (or use /v1/realtime, whose voice answers call tools)",
                           param="tools")
        return await chat_with_audio(request, body, req)
    return await respond(TextCall(request, body, req))


def add_routes(app: web.Application) -> None:
    app[TRANSCRIPTS_KEY] = Transcripts()  # spoken answers' transcripts, by audio id
    app.router.add_post("/v1/chat/completions", chat_completions)
