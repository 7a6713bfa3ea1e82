"""POST /v1/images/generations and /v1/images/edits (protocols.md §3).

The request runs on a pipeline ending in a diffusion stage; its final output carries
uint8 pixels (n, H, W, 3), encoded here (off the event loop) into the asked format and
returned as ``b64_json`` (default) or a ``data:`` URL (``response_format: url``). With
``stream: true`` and ``partial_images`` = k, the stage's k previews go out as
``image_generation.partial_image`` events (``image_edit.*`` for edits), then one
``completed`` event per image. Extras through ``extra_body``: seed,
num_inference_steps, guidance_scale, negative_prompt.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api import media_params as mp
from omni.api.errors import APIError, read_json, sse_error_event
from omni.api.schemas import parse
from omni.api.schemas.media import ImageGenerationRequest
from omni.api.state import ServedModel
from omni.api.streams import first_output, next_with_pings, sse_data, start_sse
from omni.media.image import (
    MIME,
    apply_mask,
    check_image,
    check_mask,
    encode_image,
)

log = logging.getLogger("omni.api.images")
# fields the handler reads itself; the rest go on to the stage-limit checks
NOT_ENGINE_FIELDS = ("model", "prompt", "negative_prompt", "size", "output_format",
                     "output_compression", "response_format", "background", "quality",
                     "stream", "partial_images")


@dataclass
class ImageCall:
    """One checked image request."""

    request: web.Request
    model: ServedModel
    kind: str  # "image_generation" or "image_edit"
    inputs: dict[str, Any]
    params: dict[str, Any]
    format: str
    compression: int | None
    as_url: bool
    stream: bool
    quality: str
    mask: bytes | None = None
    id: str = field(default_factory=lambda: f"img-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def outputs(self) -> Any:
        return self.model.omni.generate(self.inputs, modalities=["image"],
                                        params={"*": self.params}, request_id=self.id)

    async def encode(self, pixels: Any) -> bytes:
        def work() -> bytes:
            begun = time.perf_counter()
            image = pixels
            if self.mask is not None:
                image = apply_mask(pixels, self.inputs["images"][0], self.mask)
            data = encode_image(image, self.format, self.compression)
            # logged as the videos' MP4 encode is: part of what a request waits for
            log.info("image %s: %s %s encoded in %.3f s (%d bytes)", self.id,
                     _size_of(pixels), self.format, time.perf_counter() - begun, len(data))
            return data
        return await asyncio.to_thread(work)

    def meta(self, size: str) -> dict[str, Any]:
        return {"background": "opaque", "output_format": self.format,
                "quality": self.quality, "size": size}


def usage(data: dict[str, Any]) -> dict[str, Any]:
    text, image = int(data.get("text_tokens", 0)), int(data.get("image_tokens", 0))
    return {"input_tokens": text, "input_tokens_details": {"text_tokens": text,
                                                           "image_tokens": 0},
            "output_tokens": image, "output_tokens_details": {"image_tokens": image,
                                                              "text_tokens": 0},
            "total_tokens": text + image}


def _size_of(pixels: Any) -> str:
    return f"{pixels.shape[-2]}x{pixels.shape[-3]}"


# -- request checking -------------------------------------------------------------------
def _common(request: web.Request, body: dict[str, Any], task: str, hint: str) -> dict[str, Any]:
    """Checks ``body`` (JSON, or a form's text fields) against the declared schema, then
    against the limits of the model's diffusion stage."""
    mp.require_served(request, "image")
    req = parse(ImageGenerationRequest, body)
    model, info = mp.pick_model(request, req.model, "image", task, hint)
    if req.background == "transparent":
        raise APIError(400, "transparent backgrounds are not supported by this model; use "
                       "'opaque' or 'auto'", param="background")
    # typed values (a form's "3" is 3 by now) for the stage-limit checks
    typed = {**body, **req.model_dump(exclude_none=True, exclude=set(NOT_ENGINE_FIELDS))}
    params = mp.engine_params(typed, info, size=req.size)
    if req.stream:
        if params.get("n", 1) != 1:
            raise APIError(400, "'stream' supports n=1", param="n")
        params["previews"] = req.partial_images or 0
    return {"model": model, "info": info, "format": req.output_format or "png",
            "compression": req.output_compression, "as_url": req.response_format == "url",
            "stream": bool(req.stream), "quality": req.quality or "auto", "params": params,
            "prompt": req.prompt, "negative_prompt": req.negative_prompt}


def _inputs(checked: dict[str, Any]) -> dict[str, Any]:
    negative = checked.pop("negative_prompt")
    return {"prompt": checked.pop("prompt"),
            **({"negative_prompt": negative} if negative is not None else {})}


async def parse_generation(request: web.Request) -> ImageCall:
    body = await read_json(request)
    checked = _common(request, body, "generate",
                      "Send edits of an input image to POST /v1/images/edits.")
    checked.pop("info")
    inputs = _inputs(checked)
    return ImageCall(request, kind="image_generation", inputs=inputs, **checked)


async def parse_edit(request: web.Request) -> ImageCall:
    mp.require_served(request, "image")  # before the body, as every media endpoint
    if not request.content_type.startswith("multipart/"):
        raise APIError(400, "/v1/images/edits takes multipart/form-data (fields 'image' or "
                       "'image[]', 'prompt', optional 'mask')")
    form = await request.post()
    images = [await _file_bytes(f, "image") for f in form.getall("image", [])]
    images += [await _file_bytes(f, "image[]") for f in form.getall("image[]", [])]
    if not images:
        raise APIError(400, "'image' is required: the image to edit (a PNG, JPEG or WebP "
                       "file)", param="image")
    body = {k: v for k, v in form.items() if isinstance(v, str)}
    checked = _common(request, body, "edit",
                      "Generate from text alone with POST /v1/images/generations.")
    most = int(checked.pop("info").get("max_input_images", 1))
    if len(images) > most:
        raise APIError(400, f"model '{checked['model'].id}' edits {most} image(s) per "
                       f"request; {len(images)} were sent", param="image")
    mask = form.get("mask")
    mask_bytes = None if mask is None else await _file_bytes(mask, "mask")
    if mask_bytes is not None:
        try:
            check_mask(mask_bytes, images[0])
        except ValueError as e:
            raise APIError(400, str(e), param="mask") from None
    inputs = {**_inputs(checked), "images": images}
    return ImageCall(request, kind="image_edit", inputs=inputs, mask=mask_bytes, **checked)


async def _file_bytes(part: Any, name: str) -> bytes:
    if isinstance(part, str) or not hasattr(part, "file"):
        raise APIError(400, f"'{name}' must be a file upload", param=name)
    data = await asyncio.to_thread(part.file.read)
    if not data:
        raise APIError(400, f"'{name}' is empty", param=name)
    try:  # its header, before an engine decodes it
        check_image(data)
    except ValueError as e:
        raise APIError(400, f"'{name}': {e}", param=name) from None
    return data


# -- responses --------------------------------------------------------------------------
async def generate(call: ImageCall) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the request: (its final output's data, one ``data`` entry per image)."""
    final: dict[str, Any] = {}
    async with contextlib.aclosing(call.outputs()) as outputs:
        async for out in outputs:
            if out.data and "images" in out.data:
                final = out.data
    if "images" not in final:
        raise APIError(500, "the pipeline finished without an image", "server_error")
    data = []
    for image in final["images"].numpy():
        encoded = base64.b64encode(await call.encode(image)).decode()
        data.append({"url": f"data:{MIME[call.format]};base64,{encoded}"} if call.as_url
                    else {"b64_json": encoded, "revised_prompt": None})
    return final, data


async def _whole(call: ImageCall) -> web.Response:
    final, data = await generate(call)
    body = {"created": call.created, "data": data,
            **call.meta(_size_of(final["images"])), "usage": usage(final)}
    return web.json_response(body, headers={"X-Request-Id": call.id,
                                            "X-Seed": str(final.get("seed", ""))})


async def _stream(call: ImageCall) -> web.StreamResponse:
    outputs = call.outputs()
    item = await first_output(outputs)  # a failure before the 200 keeps its status
    response = await start_sse(call.request, call.id)
    try:
        async with contextlib.aclosing(outputs):
            while item is not None:
                await _send_event(call, response, item)
                item = None if item.finished else await next_with_pings(outputs, response)
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception as exc:
        log.error("image request %s failed after the stream started: %s", call.id, exc)
        await response.write(sse_error_event(exc, event_type="error"))
    return response


async def _send_event(call: ImageCall, response: web.StreamResponse, item: Any) -> None:
    data = item.data or {}
    if "preview" in data:
        pixels = data["preview"].numpy()
        await response.write(sse_data({
            "type": f"{call.kind}.partial_image", "partial_image_index": int(data["index"]),
            "b64_json": base64.b64encode(await call.encode(pixels[0])).decode(),
            "created_at": int(time.time()), **call.meta(_size_of(pixels))}))
    if "images" in data:
        pixels = data["images"].numpy()
        for image in pixels:
            await response.write(sse_data({
                "type": f"{call.kind}.completed",
                "b64_json": base64.b64encode(await call.encode(image)).decode(),
                "created_at": int(time.time()), **call.meta(_size_of(pixels)),
                "usage": usage(data)}))


async def generations(request: web.Request) -> web.StreamResponse:
    call = await parse_generation(request)
    return await (_stream(call) if call.stream else _whole(call))


async def edits(request: web.Request) -> web.StreamResponse:
    call = await parse_edit(request)
    return await (_stream(call) if call.stream else _whole(call))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/images/generations", generations)
    app.router.add_post("/v1/images/edits", edits)
