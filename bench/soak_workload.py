"""The soak's requests: one function per kind that sends a request over HTTP and returns
what came back in a form the checker compares with the reference run's.

Each kind reads the response with an idle deadline: no byte for longer than the kind's
deadline is a hang (a non-streamed response sends nothing until it is done, so there the
deadline covers the whole request). Failures are classified here:

  typed    an OpenAI error object (HTTP body, SSE error event, or a failed video job's
           error) carrying a code: the server said what went wrong
  untyped  anything else: a connection reset, a 500 without the object, a body that does
           not parse; always a failure of the run
  hung     the idle deadline passed
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import time
import wave
from dataclasses import dataclass, field
from typing import Any

# the models the soak serves (bench/soak.py starts them): the default assistant's views
# and the tiny diffusion fixtures, served under these ids
IMAGE_MODEL, VIDEO_MODEL = "tiny_image", "tiny_video"
# the stages whose death may fail a request of each kind: (served pipeline, stage)
ROUTES = {
    "chat": {("assistant", "llm")},
    "chat_audio": {("assistant", "llm"), ("assistant", "tts")},
    "speech": {("assistant", "tts")},
    "transcription": {("assistant", "asr")},
    "image": {(IMAGE_MODEL, "diffusion")},
    "video": {(VIDEO_MODEL, "diffusion")},
}
KINDS = tuple(ROUTES)
PROMPTS = ("Name one colour.", "Say hello to Ann.", "What is two plus two?")
SENTENCES = ("The red fox runs home.", "Rain falls on the old town.")


class Failure(Exception):
    """A request that did not produce a result: status typed/untyped/hung."""

    def __init__(self, status: str, detail: str, code: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.code = status, detail, code


@dataclass
class Settings:
    chat_tokens: int = 8
    audio_tokens: int = 12
    image_size: str = "32x32"
    image_steps: int = 2
    video_size: str = "32x32"
    video_frames: int = 5
    video_steps: int = 2
    deadlines: dict[str, float] = field(default_factory=dict)
    clips: dict[str, bytes] = field(default_factory=dict)  # sentence -> WAV (transcription)

    def deadline(self, kind: str) -> float:
        return self.deadlines.get(kind, 120.0)


def variants(kind: str) -> list[str]:
    """The distinct requests of a kind (each has a reference)."""
    if kind in ("chat", "chat_audio"):
        return list(PROMPTS)
    if kind in ("speech", "transcription"):
        return list(SENTENCES)
    return ["a small red fox"]


async def _idle(awaitable: Any, deadline: float, what: str) -> Any:
    try:
        return await asyncio.wait_for(awaitable, deadline)
    except TimeoutError:
        raise Failure("hung", f"no byte for {deadline:g} s ({what})") from None


def typed_or_untyped(status: int, body: bytes) -> Failure:
    """An error response: typed when it is an OpenAI error object with a code."""
    try:
        error = json.loads(body)["error"]
        code = error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        return Failure("untyped", f"HTTP {status} without an error object: {body[:200]!r}")
    if not code:
        return Failure("untyped", f"HTTP {status} error object without a code: {error}")
    return Failure("typed", f"HTTP {status} {code}: {error.get('message', '')[:160]}", code)


async def _post(session: Any, url: str, deadline: float, **kwargs: Any) -> Any:
    """The response once its headers are in; an error status raises its Failure."""
    resp = await _idle(session.post(url, **kwargs), deadline, "waiting for headers")
    if resp.status != 200:
        body = await _idle(resp.read(), deadline, "reading an error body")
        resp.release()
        raise typed_or_untyped(resp.status, body)
    return resp


async def _sse(resp: Any, deadline: float) -> Any:
    """Each SSE data event as a dict, up to [DONE]; an error event raises typed."""
    buffer = b""
    while True:
        chunk = await _idle(resp.content.readany(), deadline, "mid-stream")
        if not chunk:
            raise Failure("untyped", "the stream ended without [DONE]")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            if line == b"data: [DONE]":
                return
            event = json.loads(line[5:])
            if "error" in event:
                raise Failure("typed", f"SSE error event: {event['error']}",
                              (event["error"] or {}).get("code") or "unknown")
            yield event


async def chat(session: Any, base: str, prompt: str, s: Settings, audio: bool) -> dict:
    body: dict[str, Any] = {
        "model": "assistant" if audio else "smollm2", "stream": True, "temperature": 0,
        "max_tokens": s.audio_tokens if audio else s.chat_tokens,
        "messages": [{"role": "user", "content": prompt}]}
    if audio:
        body.update(modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
    deadline = s.deadline("chat_audio" if audio else "chat")
    resp = await _post(session, f"{base}/v1/chat/completions", deadline, json=body)
    text, pcm = [], []
    async with resp:
        async for event in _sse(resp, deadline):
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            text.append(delta.get("content") or "")
            sound = delta.get("audio") or {}
            text.append(sound.get("transcript") or "")
            pcm.append(base64.b64decode(sound["data"]) if sound.get("data") else b"")
    data = b"".join(pcm)
    result = {"text": "".join(text), "pcm_bytes": len(data)}
    # the bytes themselves ("audio"): where a wrong answer first differs (soak.py)
    return {**result, "audio": data, "audio_sha": hashlib.sha256(data).hexdigest()} \
        if audio else result


async def speech(session: Any, base: str, sentence: str, s: Settings) -> dict:
    deadline = s.deadline("speech")
    body = {"model": "piper", "voice": "alloy", "input": sentence, "response_format": "wav"}
    resp = await _post(session, f"{base}/v1/audio/speech", deadline, json=body)
    async with resp:
        wav = await _read_all(resp, deadline)
    return {"duration_s": wav_duration(wav), "wav": wav, "audio": wav,
            "audio_sha": hashlib.sha256(wav).hexdigest()}


async def _read_all(resp: Any, deadline: float) -> bytes:
    parts = []
    while chunk := await _idle(resp.content.readany(), deadline, "reading the body"):
        parts.append(chunk)
    return b"".join(parts)


def first_difference(got: bytes, want: bytes) -> str:
    """Where two answers' audio bytes part: the first differing byte, or which is longer."""
    if got == want:
        return "audio bytes equal"
    pairs = zip(got, want, strict=False)  # unequal lengths are one way to differ
    at = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if at is None:
        return f"audio equal for {min(len(got), len(want))} bytes, then one ends"
    return f"audio first differs at byte {at} of {len(want)}"


def wav_duration(wav: bytes) -> float:
    try:
        with wave.open(io.BytesIO(wav)) as w:
            return w.getnframes() / w.getframerate()
    except (wave.Error, EOFError) as e:
        raise Failure("wrong", f"the WAV does not decode: {e}") from None


async def transcription(session: Any, base: str, sentence: str, s: Settings) -> dict:
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("model", "whisper")
    form.add_field("file", s.clips[sentence], filename="clip.wav", content_type="audio/wav")
    deadline = s.deadline("transcription")
    resp = await _post(session, f"{base}/v1/audio/transcriptions", deadline, data=form)
    async with resp:
        return {"text": json.loads(await _read_all(resp, deadline))["text"]}


async def image(session: Any, base: str, prompt: str, s: Settings) -> dict:
    from PIL import Image

    body = {"model": IMAGE_MODEL, "prompt": prompt, "size": s.image_size, "seed": 7,
            "num_inference_steps": s.image_steps, "response_format": "b64_json"}
    deadline = s.deadline("image")
    resp = await _post(session, f"{base}/v1/images/generations", deadline, json=body)
    async with resp:
        data = json.loads(await _read_all(resp, deadline))["data"][0]["b64_json"]
    try:
        size = Image.open(io.BytesIO(base64.b64decode(data))).size
    except Exception as e:  # noqa: BLE001 - any decode failure is a wrong answer
        raise Failure("wrong", f"the image does not decode: {e}") from None
    return {"size": f"{size[0]}x{size[1]}"}


async def video(session: Any, base: str, prompt: str, s: Settings) -> dict:
    """A video job: create, poll until it ends (the deadline is the job's whole life:
    a poll answer is a byte, but a job that never ends is hung), fetch, delete."""
    deadline = s.deadline("video")
    body = {"model": VIDEO_MODEL, "prompt": prompt, "size": s.video_size, "seed": 7,
            "num_frames": s.video_frames, "num_inference_steps": s.video_steps}
    async with await _post(session, f"{base}/v1/videos", deadline, json=body) as resp:
        job = json.loads(await _read_all(resp, deadline))
    end = time.monotonic() + deadline
    while job["status"] in ("queued", "in_progress"):
        if time.monotonic() > end:
            raise Failure("hung", f"video job {job['id']} not done in {deadline:g} s")
        await asyncio.sleep(0.5)  # the server's openai-poll-after-ms hint
        async with session.get(f"{base}/v1/videos/{job['id']}") as resp:
            job = json.loads(await _idle(resp.read(), deadline, "polling"))
    try:
        if job["status"] != "completed":
            error = job.get("error") or {}
            if not error.get("code"):
                raise Failure("untyped", f"video job {job['status']} without an error: {job}")
            raise Failure("typed", f"video job failed: {error}", error["code"])
        async with session.get(f"{base}/v1/videos/{job['id']}/content") as resp:
            mp4 = await _idle(resp.read(), deadline, "fetching the video")
    finally:
        async with session.delete(f"{base}/v1/videos/{job['id']}") as resp:
            await resp.read()  # the soak must not fill the disk with its videos
    return video_shape(mp4)


def video_shape(mp4: bytes) -> dict:
    import av

    try:
        with av.open(io.BytesIO(mp4)) as container:
            frames = [f for f in container.decode(video=0)]
    except Exception as e:  # noqa: BLE001 - any decode failure is a wrong answer
        raise Failure("wrong", f"the video does not decode: {e}") from None
    if not frames:
        raise Failure("wrong", "the video holds no frame")
    return {"frames": len(frames), "size": f"{frames[0].width}x{frames[0].height}"}


async def send(session: Any, base: str, kind: str, variant: str, s: Settings) -> dict:
    if kind in ("chat", "chat_audio"):
        return await chat(session, base, variant, s, audio=kind == "chat_audio")
    return await {"speech": speech, "transcription": transcription, "image": image,
                  "video": video}[kind](session, base, variant, s)
