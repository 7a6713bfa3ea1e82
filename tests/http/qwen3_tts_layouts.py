"""The Qwen3-TTS pipelines the tests serve (test_qwen3_tts*.py), written once: the fused
layout (one stage), the split one (a talker streaming codes to a code2wav stage) and the AR
one (the talker on the AR engine, then code2wav), each optionally voicing a text stage's
streamed answer; the tiny release the qwen3-tts environment builds, which every Qwen3-TTS
test uses; and what the tests read served audio with (pcm16, sse_deltas)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from httputil import run

from omni.config.environments import env_python
from omni.fixtures.tiny_qwen3_tts import ensure_tiny_qwen3_tts
from omni.models.cache import default_cache_dir

PYTHON = env_python("qwen3-tts")
REQUIRED = os.environ.get("OMNI_REQUIRE_QWEN3_TTS_ENV") == "1"


def release_dir(tts_type: str = "custom_voice") -> Path:
    """The tiny random release of ``tts_type``, built with qwen-tts in its environment;
    without that environment the test skips, saying how to build it (fails under
    OMNI_REQUIRE_QWEN3_TTS_ENV=1: .ci/run builds it)."""
    if not os.access(PYTHON, os.X_OK):
        reason = (f"no qwen3-tts environment at {PYTHON}: build it with "
                  "`bash scripts/install_qwen3_tts_env.sh`")
        (pytest.fail if REQUIRED else pytest.skip)(reason)
    return ensure_tiny_qwen3_tts(PYTHON, default_cache_dir(), tts_type)

# greedy talker and code predictor, so served audio equals qwen-tts's generate
GREEDY = "do_sample: false, subtalker_dosample: false"
# a text stage whose answer is voiced: the echo stage answers with the user's words in 30
# pieces, one per 100 ms, so a short answer's last pieces are empty and its stream ends well
# after its last sentence was voiced (the engine's closing output), as an LLM's does when
# its answer ends in words the voice leaves out (a tool call)
ECHO = ("  - {name: echo, engine: echo, params: {chunks: 30}, options: {delay_ms: 100},\n"
        "     final_output: text}\n")


def fused(name: str, model_dir: str, frames: int, options: str = "",
          voiced: bool = False) -> str:
    head, inputs, edges = _voiced(voiced, "tts")
    return f"""\
name: {name}
default_modalities: [audio]
stages:
{head}  - name: tts
    engine: generation
    model: qwen3_tts
    model_dir: {model_dir}
    env: qwen3-tts
{inputs}    final_output: audio
    options: {{{GREEDY}, max_new_tokens: {frames}{options}}}
{edges}"""


def split(name: str, model_dir: str, frames: int, options: str = "",
          voiced: bool = False) -> str:
    """The talker as a generation stage streaming codes to a code2wav stage."""
    talker = f"""\
    engine: generation
    model: qwen3_tts_talker
    model_dir: {model_dir}
    env: qwen3-tts
    options: {{{GREEDY}, max_new_tokens: {frames}{options}}}
"""
    return _talker_then_code2wav(name, model_dir, talker, voiced)


def ar(name: str, model_dir: str, frames: int, options: str = "",
       voiced: bool = False, greedy: bool = True) -> str:
    """The talker on the AR engine (omni/models/qwen3_tts_talker.py): greedy (else the
    release's sampling), ``frames`` frames a request as qwen-tts's max_new_tokens gives
    them (its N - 1)."""
    params, sampling = ("temperature: 0, ", "subtalker_dosample: false, ") if greedy else ("", "")
    talker = f"""\
    engine: ar
    model: qwen3_tts_ar_talker
    model_dir: {model_dir}
    env: qwen3-tts
    params: {{{params}max_tokens: {frames - 1}}}
    options: {{{sampling}kv_cache_mb: 16{options}}}
"""
    return _talker_then_code2wav(name, model_dir, talker, voiced)


def _talker_then_code2wav(name: str, model_dir: str, talker: str, voiced: bool) -> str:
    """A pipeline of ``talker`` (its stage's lines below the name) streaming codes to a
    code2wav stage (chunks of 4, then 8 frames, 25 of left context)."""
    head, inputs, edges = _voiced(voiced, "talker")
    return f"""\
name: {name}
default_modalities: [audio]
stages:
{head}  - name: talker
{inputs}{talker}  - name: code2wav
    engine: generation
    model: qwen3_tts_code2wav
    model_dir: {model_dir}
    env: qwen3-tts
    final_output: audio
    options: {{first_chunk_frames: 4, chunk_frames: 8, left_context: 25}}
edges:
  - {{from: talker, to: code2wav, delivery: stream}}
{edges.removeprefix("edges:" + chr(10))}"""


def _voiced(voiced: bool, first: str) -> tuple[str, str, str]:
    """(the echo stage, the first voice stage's inputs line, the edge from the echo)."""
    if not voiced:
        return "", "", ""
    return ECHO, "    inputs: [text]\n", f"edges:\n  - {{from: echo, to: {first}, delivery: stream}}\n"


def pcm16(audio: np.ndarray) -> np.ndarray:
    """Float audio as the server's pcm16 (the comparisons' 2 LSB bound is against this)."""
    return np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)


def sse_deltas(server: Any, model: str, text: str, voice: str = "vivian") -> list[bytes]:
    """The pcm16 deltas of one speech request streamed as SSE (its last event checked to
    be speech.audio.done)."""
    async def sse() -> list[bytes]:
        async with server.session() as session:
            async with session.post("/v1/audio/speech", json={
                    "model": model, "voice": voice, "input": text,
                    "response_format": "pcm", "stream_format": "sse"}) as resp:
                assert resp.status == 200
                events = [json.loads(line[6:]) async for line in resp.content
                          if line.startswith(b"data: ")]
        assert events[-1]["type"] == "speech.audio.done"
        return [base64.b64decode(e["audio"]) for e in events[:-1]]
    return run(sse())
