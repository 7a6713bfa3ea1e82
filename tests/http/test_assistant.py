"""The default's spoken assistant (presets/assistant.yaml: Whisper tiny.en -> SmolLM2 ->
Piper, real weights) through the unmodified openai SDK: one pipeline, three engine
processes, four served ids; routes chosen by what a request holds and asks for."""

from __future__ import annotations

import base64

import openai
import pytest
from httputil import ServerSettings, assert_error_object, run

from omni.config.presets import preset_path
from omni.models.smollm2 import ensure_smollm2

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def server(start_server):
    model_dir = ensure_smollm2()  # converted once into the model cache ($OMNI_CACHE_DIR)
    text = preset_path("assistant").read_text().replace(
        "    model: hf_causal\n", f"    model: hf_causal\n    model_dir: {model_dir}\n")
    return start_server({"assistant": text}, ServerSettings(drain_timeout_s=2.0))


def _asr_calls(server) -> int:
    replicas = server.models["assistant"].omni.orchestrator.engines.replicas
    return server.inspect(lambda: replicas["asr/0"].stats.get("requests_run", 0))


def _chat(server, **kwargs):
    async def call():
        return await server.client(timeout=120.0).chat.completions.create(
            temperature=0, max_tokens=40, **kwargs)
    return run(call())


def _speak(server, text: str) -> bytes:
    async def call():
        reply = await server.client(timeout=60.0).audio.speech.create(
            model="piper", voice="alloy", input=text, response_format="wav")
        return reply.read()
    return run(call())


def _hear(server, wav: bytes) -> str:
    async def call():
        return await server.client(timeout=60.0).audio.transcriptions.create(
            model="whisper", file=("a.wav", wav, "audio/wav"))
    return run(call()).text


def _audio_part(wav: bytes) -> dict:
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}


def test_one_pipeline_four_ids_four_processes(server):
    async def listing():
        return [m async for m in server.client().models.list()]
    cards = {m.id: m.model_extra for m in run(listing())}
    assert set(cards) == {"assistant", "smollm2", "piper", "whisper"}
    assert cards["assistant"]["input_modalities"] == ["text", "audio"]
    assert cards["assistant"]["modalities"] == ["text", "audio"]
    assert (cards["whisper"]["input_modalities"], cards["whisper"]["modalities"]) == (
        ["audio"], ["text"])
    omnis = {id(server.models[name].omni.orchestrator) for name in cards}
    assert len(omnis) == 1  # every id runs on the same engines
    replicas = server.models["assistant"].omni.orchestrator.engines.replicas
    assert sorted(replicas) == ["asr/0", "llm/0", "tts/0", "vad/0"]  # vad: realtime turns


def test_a_text_question_runs_no_whisper_step(server):
    before = _asr_calls(server)
    for model in ("assistant", "smollm2"):
        answer = _chat(server, model=model, messages=[{"role": "user", "content": QUESTION}])
        assert "Paris" in answer.choices[0].message.content, answer
    assert _asr_calls(server) == before


def test_a_spoken_question_is_transcribed_then_answered(server):
    wav = _speak(server, QUESTION)
    assert "capital of France" in _hear(server, wav)
    before = _asr_calls(server)
    answer = _chat(server, model="assistant",
                   messages=[{"role": "user", "content": [_audio_part(wav)]}])
    assert "Paris" in answer.choices[0].message.content, answer
    assert _asr_calls(server) == before + 1
    assert server.in_flight("assistant")["requests"] == []


def test_the_answer_is_spoken(server):
    answer = _chat(server, model="assistant", modalities=["text", "audio"],
                   audio={"voice": "alloy", "format": "wav"},
                   messages=[{"role": "user", "content": [_audio_part(_speak(server, QUESTION))]}])
    audio = answer.choices[0].message.audio
    assert "Paris" in audio.transcript
    wav = base64.b64decode(audio.data)
    assert wav[:4] == b"RIFF" and len(wav) > 44 + 22050
    assert "paris" in _hear(server, wav).lower()


def test_a_streamed_spoken_answer(server):
    async def call():
        stream = await server.client(timeout=120.0).chat.completions.create(
            model="assistant", temperature=0, max_tokens=40, stream=True,
            modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
            messages=[{"role": "user", "content": QUESTION}])
        return [chunk async for chunk in stream]
    chunks = run(call())
    audio = [_fields(c.choices[0].delta.audio) for c in chunks
             if c.choices and c.choices[0].delta.audio]
    pcm = b"".join(base64.b64decode(a["data"]) for a in audio if a.get("data"))
    transcript = "".join(a.get("transcript", "") for a in audio)
    assert len(pcm) > 2 * 22050 and "Paris" in transcript


def _fields(audio) -> dict:
    return audio if isinstance(audio, dict) else audio.model_dump(exclude_none=True)


def test_what_the_ids_refuse(server):
    cases = [
        ("/v1/audio/transcriptions", None, "model"),
        ("/v1/audio/speech", {"model": "assistant", "voice": "alloy", "input": "hi"}, "model"),
        ("/v1/chat/completions", {"model": "whisper", "messages": [
            {"role": "user", "content": "hi"}]}, "model"),
        ("/v1/chat/completions", {"model": "assistant", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"}}]}]},
         "messages[0].content[0]"),
    ]
    for path, body, param in cases:
        async def post(path=path, body=body):
            async with server.session() as session:
                if body is None:
                    import aiohttp

                    form = aiohttp.FormData()
                    form.add_field("model", "assistant")
                    form.add_field("file", b"RIFF", filename="a.wav")
                    async with session.post(path, data=form) as r:
                        return r.status, await r.json()
                async with session.post(path, json=body) as r:
                    return r.status, await r.json()
        status, body = run(post())
        assert status == 400, body
        assert_error_object(body, type_="invalid_request_error", param=param)
    with pytest.raises(openai.BadRequestError):
        _chat(server, model="piper", messages=[{"role": "user", "content": "hi"}])
    assert server.in_flight("assistant")["requests"] == []
