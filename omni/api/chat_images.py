"""Chat completions on a model whose pipeline ends in an image (diffusion) stage.

A documented extension (README): the prompt is the text of the last user message;
image_url parts in that message (``data:`` URLs, or http(s) URLs fetched under the
server's --media-fetch policy, omni/media/fetch.py) are the images to edit (for
image-editing models).
The answer is an ordinary ``chat.completion`` whose choices each carry one image as a
content part, ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
(``n`` images -> n choices). Image knobs ride at the top level as with
/v1/images/generations (size, output_format, seed, num_inference_steps, guidance_scale,
negative_prompt). Streaming is refused with a 400 that points at the images endpoint,
which streams partial images.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from omni.api import media_params as mp
from omni.api.errors import APIError
from omni.api.images import ImageCall, generate, usage
from omni.api.schemas import parse
from omni.api.schemas.media import EngineFields
from omni.api.state import SETTINGS_KEY, ServedModel
from omni.media import fetch
from omni.media.image import IMAGE_FORMATS


async def _last_user(request: web.Request, body: dict[str, Any]) -> tuple[str, list[bytes]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    user = next((m for m in reversed(messages) if isinstance(m, dict)
                 and m.get("role") == "user"), None)
    if user is None:
        raise APIError(400, "no user message to draw from", param="messages")
    content = user.get("content")
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise APIError(400, "a user message's content must be a string or a list of parts",
                       param="messages")
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            images.append(await _image(request, part.get("image_url")))
        else:
            raise APIError(400, f"content part type {kind!r} is not taken by image models "
                           "(text and image_url are)", param="messages")
    return " ".join(texts), images


async def _image(request: web.Request, value: Any) -> bytes:
    url = value.get("url") if isinstance(value, dict) else value
    try:
        return (await fetch.load(url, request.app[SETTINGS_KEY].media_fetch)).data
    except fetch.MediaError as e:
        raise APIError(400, f"image_url: {e}", param="messages") from None


async def chat_image(request: web.Request, body: dict[str, Any],
                     model: ServedModel) -> web.Response:
    if body.get("stream"):
        raise APIError(400, f"model '{model.id}' answers with images, which chat completions "
                       "do not stream; POST /v1/images/generations with stream=true streams "
                       "partial images", param="stream")
    prompt, images = await _last_user(request, body)
    task = "edit" if images else "generate"
    model, info = mp.pick_model(request, model.id, "image", task,
                                "Send text only for a text-to-image model, or an image for "
                                "an image-editing one.")
    fmt = mp.field(body, "output_format", str, "png")
    if fmt not in IMAGE_FORMATS:
        raise APIError(400, f"'output_format' must be one of {', '.join(IMAGE_FORMATS)}",
                       param="output_format")
    typed = {**body, **parse(EngineFields, body).model_dump(exclude_none=True)}
    params = mp.engine_params(typed, info, size=mp.field(body, "size", str))
    inputs = {"prompt": mp.prompt({"prompt": prompt}), **mp.negative_prompt(body)}
    if images:
        inputs["images"] = images
    call = ImageCall(request, model, "image_generation", inputs, params, fmt, None,
                     as_url=True, stream=False, quality="auto")
    final, data = await generate(call)
    return web.json_response(_as_chat(call, data, usage(final)), headers={
        "X-Request-Id": call.id, "X-Seed": str(final.get("seed", ""))})


def _as_chat(call: ImageCall, data: list[dict[str, Any]],
             usage: dict[str, Any]) -> dict[str, Any]:
    choices = [{"index": i, "finish_reason": "stop", "logprobs": None,
                "message": {"role": "assistant", "content": [
                    {"type": "image_url", "image_url": {"url": item["url"]}}]}}
               for i, item in enumerate(data)]
    return {"id": f"chatcmpl-{call.id}", "object": "chat.completion",
            "created": int(time.time()), "model": call.model.id, "choices": choices,
            "usage": {"prompt_tokens": usage["input_tokens"],
                      "completion_tokens": usage["output_tokens"],
                      "total_tokens": usage["total_tokens"]}}
