"""Video generation (protocols.md §4): async jobs under /v1/videos, and /v1/videos/sync.

``POST /v1/videos`` (multipart, as the openai SDK sends it, or JSON) stores a job and
returns it queued; a task runs it on a pipeline ending in a diffusion stage, updating
``progress`` from the stage's step counter, then writes the MP4 and a thumbnail
(video_jobs.py owns the files). ``seconds`` maps to the frame rule the stage reports
(``fps``, and frames = ``frame_step`` * k + 1; ``num_frames`` in extra_body sets frames
directly); ``size`` is WxH. A model that makes sound with its video (its output holds
"audio" and "sample_rate") gets an AAC track in the MP4.
``POST /v1/videos/sync`` (our extension) takes the same fields and answers with the MP4.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api import media_params as mp
from omni.api.errors import APIError, from_exception, read_json
from omni.api.schemas import parse
from omni.api.schemas.media import VideoRequest
from omni.api.state import MODELS_KEY, SETTINGS_KEY, ServedModel
from omni.api.video_jobs import VideoJob, VideoStore, default_data_dir
from omni.errors import ShuttingDownError
from omni.media.image import check_image, encode_image
from omni.media.video import encode_mp4

log = logging.getLogger("omni.api.videos")
POLL_AFTER_MS = "500"
MAX_SECONDS = 60.0


@dataclass
class VideoCall:
    model: ServedModel
    inputs: dict[str, Any]
    params: dict[str, Any]
    seconds: str
    size: str
    fps: int

    def outputs(self, request_id: str) -> Any:
        return self.model.omni.generate(self.inputs, modalities=["video"],
                                        params={"*": self.params}, request_id=request_id)


@dataclass
class VideoService:
    """The job store and the tasks running its jobs."""

    store: VideoStore
    max_active: int
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)


VIDEOS_KEY = web.AppKey("videos", VideoService)


# -- request checking -------------------------------------------------------------------
async def _body(request: web.Request) -> tuple[dict[str, Any], list[bytes]]:
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.post()
        body = {k: v for k, v in form.items() if isinstance(v, str)}
        images = []
        for part in form.getall("input_reference", []):
            if isinstance(part, str) or not hasattr(part, "file"):
                raise APIError(400, "'input_reference' must be an image file",
                               param="input_reference")
            images.append(_reference(await asyncio.to_thread(part.file.read)))
        return body, images
    return await read_json(request), []


def _reference(data: bytes) -> bytes:
    """An input_reference file whose header reads as an image within the pixel limit:
    checked here, or /v1/videos would queue a job that can only fail."""
    try:
        check_image(data)
    except ValueError as e:
        raise APIError(400, f"'input_reference' is not an image this server accepts: {e}",
                       param="input_reference") from None
    return data


async def parse_video(request: web.Request) -> VideoCall:
    mp.require_served(request, "video")  # before the body, as every media endpoint
    body, images = await _body(request)
    req = parse(VideoRequest, body)  # a form's text fields convert ("8" -> 8.0)
    task = "image_to_video" if images else "text_to_video"
    hint = ("Image-to-video models need 'input_reference' (the first frame)." if not images
            else "Only image-to-video models take 'input_reference'.")
    model, info = mp.pick_model(request, req.model, "video", task, hint)
    typed = {**body, **req.model_dump(exclude_none=True, exclude={"model", "prompt", "size"})}
    params = mp.engine_params(typed, info, size=req.size)
    fps, step = int(info["fps"]), int(info.get("frame_step") or 1)
    seconds = req.seconds
    if "frames" not in params:
        if seconds is not None:
            if not 0 < seconds <= MAX_SECONDS:
                raise APIError(400, f"'seconds' must be > 0 and <= {MAX_SECONDS:g}",
                               param="seconds")
            params["frames"] = step * max(1, round(seconds * fps / step)) + 1
        else:
            params["frames"] = int(info["default_frames"])
    most = int(info["max_frames"])
    if (params["frames"] - 1) % step or params["frames"] > most:
        raise APIError(400, f"{params['frames']} frames is not possible on model "
                       f"'{model.id}': frames are {step}k+1, at most {most} "
                       f"(= {(most - 1) / fps:g} s at {fps} fps)",
                       param="num_frames" if seconds is None else "seconds")
    inputs = {"prompt": req.prompt}
    if req.negative_prompt is not None:
        inputs["negative_prompt"] = req.negative_prompt
    if images:
        inputs["images"] = images
    size = params.get("size") or info.get("default_size", "")
    shown = body.get("seconds") or f"{(params['frames'] - 1) / fps:g}"
    return VideoCall(model, inputs, params, str(shown), size, fps)


async def _run(call: VideoCall, request_id: str, on_progress: Any = None) -> tuple[Any, dict]:
    """Generate; returns (frames uint8 (F, H, W, 3), the final output's data)."""
    final: dict[str, Any] = {}
    async with contextlib.aclosing(call.outputs(request_id)) as outputs:
        async for out in outputs:
            data = out.data or {}
            if "progress" in data and on_progress is not None:
                on_progress(data["progress"])
            if "video" in data:
                final = data
    if "video" not in final:
        raise RuntimeError("the pipeline finished without a video")
    return final["video"].numpy(), final


def _mp4(frames: Any, fps: int, data: dict[str, Any], request_id: str) -> bytes:
    """The MP4, with the audio track when the model made one ("audio": float32
    (channels, samples) at "sample_rate"). Its encoding time is logged: H.264 of noisy
    frames (random weights) takes ~10x that of smooth ones, a visible share of a request."""
    begun = time.perf_counter()
    audio = data.get("audio")
    mp4 = encode_mp4(frames, fps) if audio is None else encode_mp4(
        frames, fps, audio=audio.numpy(), audio_rate=int(data["sample_rate"]))
    log.info("video %s: %d frames encoded in %.3f s (%d bytes)", request_id, len(frames),
             time.perf_counter() - begun, len(mp4))
    return mp4


async def _encode(frames: Any, fps: int, data: dict[str, Any],
                  request_id: str) -> tuple[bytes, bytes]:
    return await asyncio.gather(asyncio.to_thread(_mp4, frames, fps, data, request_id),
                                asyncio.to_thread(encode_image, frames[0], "jpeg"))


# -- jobs ---------------------------------------------------------------------------------
async def _job_task(service: VideoService, job: VideoJob, call: VideoCall) -> None:
    store = service.store

    def progress(p: dict[str, Any]) -> None:
        job.status = "in_progress"
        job.progress = min(99, int(100 * p["step"] / max(1, p["steps"])))

    try:
        job.status = "in_progress"
        frames, data = await _run(call, job.id, progress)
        job.seed, job.steps = data.get("seed"), data.get("steps")
        # the size as made: an image-to-video model may take it from the input image
        job.size = f"{frames.shape[2]}x{frames.shape[1]}"
        mp4, thumbnail = await _encode(frames, call.fps, data, job.id)
        store.finish(job, mp4, thumbnail)
        log.info("video %s completed (%d frames, %d bytes)", job.id, len(frames), len(mp4))
    except asyncio.CancelledError:
        if store.get(job.id) is job:  # not deleted: the server is stopping
            store.fail(job, "server_stopped", "the server stopped before this video was "
                       "finished; create it again")
        raise
    except Exception as exc:
        err = from_exception(exc)
        log.error("video %s failed: %s", job.id, err.message)
        store.fail(job, err.code or "generation_failed", err.message)
    finally:
        service.tasks.pop(job.id, None)


async def create(request: web.Request) -> web.Response:
    service = _service(request)
    call = await parse_video(request)
    if not call.model.omni.orchestrator.accepting:  # draining: a new job is a new request
        raise ShuttingDownError("server is shutting down; not admitting new video jobs")
    if service.store.active() >= service.max_active:
        raise APIError(429, f"{service.max_active} video jobs are already queued or running; "
                       "retry when one finishes", "rate_limit_error", code="too_many_requests",
                       headers={"retry-after": "5"})
    job = VideoJob(model=call.model.id, prompt=call.inputs["prompt"], seconds=call.seconds,
                   size=call.size, frames=call.params["frames"], fps=call.fps,
                   seed=call.params.get("seed"), steps=call.params.get("steps"))
    service.store.add(job)
    service.tasks[job.id] = asyncio.get_running_loop().create_task(
        _job_task(service, job, call), name=f"video-{job.id}")
    return _job_response(job)


async def sync(request: web.Request) -> web.Response:
    call = await parse_video(request)
    request_id = f"video_sync_{uuid.uuid4().hex}"
    frames, data = await _run(call, request_id)
    mp4 = await asyncio.to_thread(_mp4, frames, call.fps, data, request_id)
    return web.Response(body=mp4, content_type="video/mp4", headers={
        "X-Seed": str(data.get("seed", "")), "X-Frames": str(len(frames))})


async def retrieve(request: web.Request) -> web.Response:
    return _job_response(_job(request))


async def content(request: web.Request) -> web.StreamResponse:
    job = _job(request)
    variant = request.query.get("variant", "video")
    if variant not in ("video", "thumbnail"):
        raise APIError(400, f"variant {variant!r} is not available; use 'video' or "
                       "'thumbnail'", param="variant")
    if job.status != "completed":
        raise APIError(400, f"video {job.id} is {job.status}; its content exists once it is "
                       "completed", param="video_id", code="video_not_ready")
    path = _service(request).store.path(job, "mp4" if variant == "video" else "jpg")
    return web.FileResponse(path, headers={
        "Content-Type": "video/mp4" if variant == "video" else "image/jpeg"})


async def listing(request: web.Request) -> web.Response:
    if request.query.get("limit") == "":  # present but empty: not an integer, not absent
        raise APIError(400, "'limit' must be an integer from 1 to 100", param="limit")
    limit = mp.field(dict(request.query), "limit", int, 20)
    order = request.query.get("order", "desc")
    if not 1 <= limit <= 100:
        raise APIError(400, "'limit' must be an integer from 1 to 100", param="limit")
    if order not in ("asc", "desc"):
        raise APIError(400, "'order' must be asc or desc", param="order")
    jobs, more = _service(request).store.listing(request.query.get("after"), limit, order)
    return web.json_response({"object": "list", "data": [j.api() for j in jobs],
                              "has_more": more, "first_id": jobs[0].id if jobs else None,
                              "last_id": jobs[-1].id if jobs else None})


async def delete(request: web.Request) -> web.Response:
    service, job = _service(request), _job(request)
    task = service.tasks.pop(job.id, None)
    service.store.delete(job)
    if task is not None:
        task.cancel()  # closing its outputs aborts the request in every stage
        await asyncio.gather(task, return_exceptions=True)
    return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})


def _job_response(job: VideoJob) -> web.Response:
    return web.json_response(job.api(), headers={"openai-poll-after-ms": POLL_AFTER_MS})


def _job(request: web.Request) -> VideoJob:
    job = _service(request).store.get(request.match_info["video_id"])
    if job is None:
        raise APIError(404, f"no video with id '{request.match_info['video_id']}'",
                       param="video_id", code="not_found")
    return job


def _service(request: web.Request) -> VideoService:
    service = request.app.get(VIDEOS_KEY)
    if service is None:
        models = request.app[MODELS_KEY]
        raise APIError(404, f"{request.path} (a video endpoint) is not served by this server. "
                       f"Served models: {models.listing()}", param="model",
                       code="model_not_found")
    return service


async def _videos_ctx(app: web.Application) -> AsyncIterator[None]:
    """The store opens with the app; running jobs are cancelled (and marked failed) when
    it stops."""
    service = app[VIDEOS_KEY]
    service.store.open()
    yield
    tasks = list(service.tasks.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def drain(app: web.Application, timeout_s: float) -> None:
    """On SIGTERM a running video job is an in-flight request like any other: wait (bounded)
    until it is stored, encoding included; the app's cleanup would otherwise cancel a job
    whose denoising the orchestrator's drain had just let finish."""
    service = app.get(VIDEOS_KEY)
    tasks = list(service.tasks.values()) if service is not None else []
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, timeout_s))


def add_routes(app: web.Application) -> None:
    if app[MODELS_KEY].producing("video"):  # no data directory for servers without video
        settings = app[SETTINGS_KEY]
        store = VideoStore(settings.data_dir or default_data_dir(), settings.video_retention_s)
        app[VIDEOS_KEY] = VideoService(store, settings.max_video_jobs)
        app.cleanup_ctx.append(_videos_ctx)
    app.router.add_post("/v1/videos", create)
    app.router.add_post("/v1/videos/sync", sync)
    app.router.add_get("/v1/videos", listing)
    app.router.add_get("/v1/videos/{video_id}", retrieve)
    app.router.add_get("/v1/videos/{video_id}/content", content)
    app.router.add_delete("/v1/videos/{video_id}", delete)
