"""Spoken answers in chat completions through the unmodified openai SDK: an LLM stage
(tiny random Qwen3) streams its text over a stream edge into a TTS stage (the real Piper
voice), which speaks each sentence as it ends."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import openai
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest
from httputil import Server, ServerSettings, run, write_pipeline

from omni.fixtures.tiny_models import ensure_tiny_model

PIPELINE = """\
name: spoken
default_modalities: [text]
stages:
  - name: llm
    engine: ar
    model_dir: {model_dir}
    final_output: text
  - name: tts
    engine: generation
    model: piper
    final_output: audio
    options: {{openai_voices: true}}
edges:
  - {{from: llm, to: tts, delivery: stream}}
"""
ASK = [{"role": "user", "content": "Tell me a story about a robot."}]


def speak(fmt: str) -> dict:
    """The request fields of a spoken answer in ``fmt``."""
    return {"model": "spoken", "messages": ASK, "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": fmt}}

# sampled with a seed: greedy decoding of the random model repeats "\\n" (nothing to say);
# plain sampling, not the fixture's generation_config.json (top_k 20, top_p 0.95), which
# the stop word below was picked under
GREEDY = {"max_tokens": 24, "temperature": 1.0, "top_p": 1.0, "seed": 7,
          "extra_body": {"ignore_eos": True, "top_k": -1}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = ensure_tiny_model("qwen3", tmp_path_factory.getbasetemp() / "models")
    path = write_pipeline(tmp_path_factory.mktemp("spoken"), "spoken",
                          PIPELINE.format(model_dir=model_dir))
    srv = Server({"spoken": path, "qwen3": str(model_dir)},
                 ServerSettings(drain_timeout_s=2.0)).start()
    yield srv
    srv.stop()


def as_dict(value):
    """A delta's audio as the fields that were sent (a dict, or the SDK's typed model)."""
    return value if isinstance(value, dict) else value.model_dump(exclude_unset=True)


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(f.samples for f in container.decode(stream))
        return samples / stream.rate


def test_non_stream_answer_carries_audio_and_transcript(server):
    async def body():
        async with server.client(timeout=60) as client:
            reply = await client.chat.completions.create(
                **speak("wav"), **GREEDY)
            message = reply.choices[0].message
            assert message.content is None and message.audio.id.startswith("audio_")
            assert message.audio.transcript and message.audio.expires_at > 0
            wav = base64.b64decode(message.audio.data)
            assert wav[:4] == b"RIFF" and decoded_seconds(wav) > 0.2
            details = reply.usage.completion_tokens_details
            assert details.audio_tokens > 0 and reply.usage.completion_tokens == 24
            text = await client.chat.completions.create(model="spoken", messages=ASK,
                                                        **GREEDY)
            assert text.choices[0].message.content == message.audio.transcript
            mp3 = await client.chat.completions.create(
                **speak("mp3"), **GREEDY)
            assert decoded_seconds(base64.b64decode(mp3.choices[0].message.audio.data)) > 0.2
        async with server.session() as session, session.get("/metrics") as resp:
            metrics = await resp.text()
        for name in ("omni_ttft_seconds", "omni_ttfp_seconds", "omni_rtf",
                     "omni_audio_underrun_seconds"):
            assert f'{name}_count{{pipeline="spoken"}} 2.0' in metrics, name
    run(body())


def test_stream_sends_the_id_once_and_pcm16_pieces(server):
    async def body():
        async with server.client(timeout=60) as client:
            stream = await client.chat.completions.create(
                **speak("pcm16"), stream=True,
                stream_options={"include_usage": True}, **GREEDY)
            chunks = [c async for c in stream]
            assert chunks[0].choices[0].delta.role == "assistant"
            audio = [as_dict(c.choices[0].delta.audio) for c in chunks
                     if c.choices and c.choices[0].delta.audio]
            ids = [a["id"] for a in audio if "id" in a]
            assert len(ids) == 1 and sum("expires_at" in a for a in audio) == 1
            pieces = [base64.b64decode(a["data"]) for a in audio if "data" in a]
            assert pieces and all(len(p) % 2 == 0 for p in pieces)
            pcm = np.frombuffer(b"".join(pieces), dtype="<i2")
            assert len(pcm) > 24000 * 0.2  # 24 kHz mono
            transcript = "".join(a.get("transcript", "") for a in audio)
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
            whole = await client.chat.completions.create(model="spoken", messages=ASK,
                                                         **GREEDY)
            assert transcript == whole.choices[0].message.content
            # the helper refuses finish_reason "length": stop at a word this seed writes
            async with client.chat.completions.stream(
                    **speak("pcm16"), stop=["system"],
                    **GREEDY) as helper:
                final = await helper.get_final_completion()
            assert final.choices[0].finish_reason == "stop"
            assert final.choices[0].message.audio.id.startswith("audio_")
            assert len(final.choices[0].message.audio.id) == len(ids[0])
    run(body())


def test_an_earlier_spoken_turn_is_referenced_by_its_audio_id(server):
    async def body():
        async with server.client(timeout=60) as client:
            first = await client.chat.completions.create(
                **speak("wav"), **GREEDY)
            history = ASK + [{"role": "assistant",
                              "audio": {"id": first.choices[0].message.audio.id}},
                             {"role": "user", "content": "And then?"}]
            again = await client.chat.completions.create(model="spoken", messages=history,
                                                         **GREEDY)
            assert again.choices[0].message.content
            history[1] = {"role": "assistant", "audio": {"id": "audio_unknown"}}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="spoken", messages=history,
                                                     **GREEDY)
            assert info.value.body["param"] == "messages[1].audio"
    run(body())


@pytest.mark.parametrize("kwargs, param, text", [
    ({"audio": {"voice": "alloy", "format": "wav"}, "stream": True}, "audio.format",
     "'pcm16'"),
    ({"audio": {"voice": "nobody", "format": "wav"}}, "voice", "valid voices"),
    ({"audio": {"voice": "alloy", "format": "ogg"}}, "audio.format", "one of"),
    ({}, "audio", "'voice' and 'format'"),
    ({"audio": {"voice": "alloy", "format": "wav"}, "n": 2}, "n", "must be 1"),
    ({"audio": {"voice": "alloy", "format": "wav"}, "model": "qwen3"}, "modalities",
     "does not speak"),
])
def test_bad_audio_requests_are_400s(server, kwargs, param, text):
    async def body():
        async with server.client() as client:
            args = {"model": "spoken", "messages": ASK, "modalities": ["text", "audio"],
                    "max_tokens": 4, **kwargs}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(**args)
            assert info.value.body["param"] == param and text in info.value.message
    run(body())


def test_leaving_a_spoken_stream_early_aborts_both_stages(server):
    async def body():
        async with server.client(timeout=60) as client:
            stream = await client.chat.completions.create(
                **speak("pcm16"), stream=True,
                max_tokens=200, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.audio:
                    break
            await stream.close()
        state = await server.wait_idle("spoken", timeout_s=10)
        assert not state["requests"] and not any(state["outstanding"].values())
    run(body())
