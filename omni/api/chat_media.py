"""Media parts of chat messages, checked and decoded before a request is queued.

``input_audio`` parts ({"data": base64, "format": "wav" | "mp3" | ...}, OpenAI's shape) and
``audio_url`` parts (data: or fetched http(s) URLs, --media-fetch) are decoded here, at the
rate the model's text stage reports as ``input_audio_rate``, into float32 samples that
ride to the engine in the message (``{"type": "input_audio", "input_audio": {"pcm_f32le":
bytes, "sample_rate": rate}}``). When the text stage does not hear audio but a speech
stage before it does (the assistant: asr -> llm), each clip is decoded at that stage's
rate into int16 and sent beside the messages (``inputs["audio"]``), its part standing as
``{"input_audio": {"transcript": i}}`` until the transcript replaces it. A model that takes no audio, an undecodable clip or one
longer than MAX_AUDIO_SECONDS is a 400 naming the part. ``image_url`` parts (data: or
fetched URLs) of a model that lists them in ``input_parts`` are checked to be a readable
image of at most MAX_IMAGE_PIXELS and go to the engine as ``{"type": "image", "image":
{"data": file bytes}}`` (the model's processor resizes them); ``video_url`` parts alike,
checked to be a readable video of at most MAX_VIDEO_SECONDS and MAX_IMAGE_PIXELS a frame,
as ``{"type": "video", "video": {"data": file bytes}}`` (the engine samples the frames);
with ``"use_audio_in_video": true`` in the request, each video's audio track is decoded
like input_audio and rides along (``"pcm_f32le"``, ``"sample_rate"``), for a model that
hears it with the picture; a video without one is then a 400. Other parts go to the
engine as they are, if the text stage lists their type; else they are a 400 naming the
part.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from aiohttp import web

from omni.api.errors import APIError
from omni.api.state import SETTINGS_KEY
from omni.media import fetch
from omni.media.audio import decode_audio, pcm16
from omni.media.image import MAX_IMAGE_PIXELS, check_image
from omni.media.video import probe_video

MAX_AUDIO_SECONDS = 300.0
MAX_VIDEO_SECONDS = 600.0


async def prepare_media(request: web.Request, model: Any,
                        body: dict[str, Any]) -> dict[str, Any]:
    """Check and decode the media parts in place; returns inputs to add beside the
    messages: ``{"audio": [clips]}`` when a speech stage upstream transcribes the audio
    parts (each part then stands as ``{"input_audio": {"transcript": i}}``)."""
    messages = body.get("messages")
    clips: list[dict[str, Any]] = []
    if not isinstance(messages, list):
        return {}
    with_audio = bool(body.get("use_audio_in_video"))  # a bool: schemas/text.py checked it
    for i, message in enumerate(messages):
        parts = message.get("content") if isinstance(message, dict) else None
        if not isinstance(parts, list):
            continue
        for j, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind in ("input_audio", "audio_url"):
                parts[j] = await _audio_part(request, model, part, where, clips)
            elif kind in ("image_url", "video_url"):
                _check_accepted(model, kind, where)
                parts[j] = await _visual_part(request, part, kind, where)
                if kind == "video_url" and with_audio:
                    await _video_audio(model, parts[j]["video"], where)
            elif kind != "text":
                _check_accepted(model, kind, where)
    return {"audio": clips} if clips else {}


def _check_accepted(model: Any, kind: Any, where: str) -> None:
    """A part the engine takes as is: only if the model says it takes that kind."""
    accepted = model.omni.output_info("text").get("input_parts") or ["text"]
    if kind not in accepted:
        raise APIError(400, f"model '{model.id}' does not take {kind!r} content parts (it "
                       f"takes: {', '.join(accepted)})", param=where)


async def _audio_part(request: web.Request, model: Any, part: dict[str, Any],
                      where: str, clips: list[dict[str, Any]]) -> dict[str, Any]:
    rate = model.omni.output_info("text").get("input_audio_rate")
    upstream = None if rate else _transcriber_rate(model)
    if not rate and not upstream:
        raise APIError(400, f"model '{model.id}' does not take audio input", param=where)
    data = await _audio_bytes(request, part, where)
    try:
        samples = await asyncio.to_thread(decode_audio, data, int(rate or upstream),
                                          MAX_AUDIO_SECONDS)
    except ValueError as e:
        raise APIError(400, f"{where}: {e}", param=where) from None
    if rate:  # the text stage hears the audio itself
        return {"type": "input_audio",
                "input_audio": {"pcm_f32le": samples.tobytes(), "sample_rate": int(rate)}}
    clips.append({"pcm_s16le": pcm16(samples), "sample_rate": int(upstream)})
    return {"type": "input_audio", "input_audio": {"transcript": len(clips) - 1}}


def _transcriber_rate(model: Any) -> int | None:
    """The sample rate of the stage that transcribes a chat's audio before the text stage
    reads it (omni/config/views.py's assistant: asr -> llm), None if there is none."""
    pipeline = model.omni.pipeline
    if "audio" not in model.input_modalities:
        return None
    for stage in pipeline.route(["text"], ["text", "audio"]).entries:
        if "audio" in pipeline.stage(stage).inputs:
            rate = model.omni.stage_info(stage).get("input_audio_rate")
            if rate:
                return int(rate)
    return None


async def _audio_bytes(request: web.Request, part: dict[str, Any], where: str) -> bytes:
    policy = request.app[SETTINGS_KEY].media_fetch
    if part["type"] == "audio_url":
        url = part.get("audio_url")
        url = url.get("url") if isinstance(url, dict) else url
        try:
            return (await fetch.load(url, policy)).data
        except fetch.MediaError as e:
            raise APIError(400, f"{where}: {e}", param=where) from None
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise APIError(400, f"{where}: input_audio needs base64 'data' and a 'format'",
                       param=where)
    if len(audio["data"]) > policy.max_bytes * 4 // 3 + 4:
        raise APIError(400, f"{where}: the audio is larger than {policy.max_bytes} bytes",
                       param=where)
    try:
        return base64.b64decode(audio["data"], validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: input_audio.data is not valid base64",
                       param=where) from None


async def _visual_part(request: web.Request, part: dict[str, Any], kind: str,
                       where: str) -> dict[str, Any]:
    """An image_url / video_url part, fetched and checked: an image / video part."""
    url = part.get(kind)
    url = url.get("url") if isinstance(url, dict) else url
    policy = request.app[SETTINGS_KEY].media_fetch
    try:
        if kind == "image_url":
            return image_part(await load_image(url, policy))
        data = (await fetch.load(url, policy)).data
        width, height, seconds = await asyncio.to_thread(probe_video, data)
        if seconds > MAX_VIDEO_SECONDS:
            raise ValueError(f"the video lasts {seconds:.0f} s; at most "
                             f"{MAX_VIDEO_SECONDS:.0f} s are accepted")
    except ValueError as e:  # MediaError is one
        raise APIError(400, f"{where}: {e}", param=where) from None
    if width * height > MAX_IMAGE_PIXELS:
        raise APIError(400, f"{where}: the video is {width}x{height}; at most "
                       f"{MAX_IMAGE_PIXELS} pixels are accepted", param=where)
    return {"type": "video", "video": {"data": data}}


async def load_image(url: Any, policy: fetch.FetchPolicy) -> bytes:
    """The image file a URL names (data:, or fetched under ``policy``), its header checked
    to be a readable image of at most MAX_IMAGE_PIXELS; ValueError saying what is wrong.
    Chat's image_url parts and realtime's input_image parts both come this way."""
    data = (await fetch.load(url, policy)).data
    check_image(data, MAX_IMAGE_PIXELS)
    return data


def image_part(data: bytes) -> dict[str, Any]:
    """An image file as the engine's chat content part (what the model adapters read)."""
    return {"type": "image", "image": {"data": data}}


async def _video_audio(model: Any, video: dict[str, Any], where: str) -> None:
    """Add a video's audio track, decoded at the model's input rate."""
    rate = model.omni.output_info("text").get("input_audio_rate")
    if not rate:
        raise APIError(400, f"model '{model.id}' does not take audio input",
                       param="use_audio_in_video")
    try:
        samples = await asyncio.to_thread(decode_audio, video["data"], int(rate),
                                          MAX_VIDEO_SECONDS)
    except ValueError as e:
        raise APIError(400, f"{where}: use_audio_in_video: {e}", param=where) from None
    video.update(pcm_f32le=samples.tobytes(), sample_rate=int(rate))
