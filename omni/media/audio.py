"""Encoding float32 mono audio into the formats of OpenAI's speech API, incrementally.

`AudioEncoder(fmt, rate, streaming)` takes audio chunk by chunk (``encode``) and returns
the bytes each chunk completes; ``finish`` returns the rest. Concatenating everything it
returned is one valid file of that format, so a stream can be sent as it is produced.

Formats (``FORMATS``): mp3 (MPEG audio, libmp3lame), opus (Ogg Opus, libopus), aac (ADTS
AAC), flac, wav (16-bit PCM), pcm (raw s16le). ``pcm`` is 24 kHz as OpenAI defines it and
Opus is 24 kHz because libopus takes no 22.05 kHz; the others keep the voice's own rate
(no resampling loss). Resampling is libswresample's (through PyAV, as every codec here).

Streaming vs whole responses differ only in headers that state a length: a streamed WAV
says "unknown length" (0xFFFFFFFF, what streaming WAV writers use and decoders accept),
a streamed FLAC leaves STREAMINFO's sample count 0 ("unknown", valid FLAC), a streamed
MP3 has no length in its Xing header. Whole responses carry the exact values.
"""

from __future__ import annotations

import io
import struct
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

PCM_RATE = 24_000  # OpenAI: response_format "pcm" is 24 kHz, 16-bit, mono, little-endian
OPUS_RATE = 24_000


@dataclass(frozen=True)
class AudioFormat:
    name: str
    content_type: str
    container: str | None  # PyAV muxer; None: written here (wav, pcm)
    codec: str | None
    rate: int | None  # fixed output rate; None: the input's rate
    bit_rate: int | None = None


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", None, 64_000),
    AudioFormat("opus", "audio/ogg", "ogg", "libopus", OPUS_RATE, 32_000),
    AudioFormat("aac", "audio/aac", "adts", "aac", None, 64_000),
    AudioFormat("flac", "audio/flac", "flac", "flac", None),
    AudioFormat("wav", "audio/wav", None, None, None),
    AudioFormat("pcm", "audio/pcm", None, None, PCM_RATE),
)}
# Ogg pages are flushed at this duration (µs) at most; the muxer's default (1 s) would
# hold a streamed sentence back until the next one is done.
_OGG_PAGE_US = "100000"


class _Sink:
    """A write-only file for the muxer. It has no seek, so libavformat treats the
    output as a stream: it flushes after every packet and never rewrites headers."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class AudioEncoder:
    """Incremental encoder of float32 mono samples (see module docstring)."""

    def __init__(self, fmt: str, sample_rate: int, streaming: bool) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown audio format {fmt!r} (one of {', '.join(FORMATS)})")
        if sample_rate <= 0:
            raise ValueError(f"sample rate must be positive, got {sample_rate}")
        self.format = FORMATS[fmt]
        self.in_rate = int(sample_rate)
        self.rate = self.format.rate or self.in_rate
        self.streaming = streaming
        self.samples_in = 0
        self._pcm: list[bytes] = []  # whole (non-streaming) wav: held until the header is known
        self._resampler = self._make_resampler() if self.format.container is None else None
        self._header_sent = False
        # The API encodes on a worker thread; a client that leaves mid-encode makes the
        # event loop close() while that thread may still be inside FFmpeg: serialise them.
        self._lock = threading.Lock()
        if self.format.container is not None:
            self._open_container()

    @property
    def content_type(self) -> str:
        return self.format.content_type

    def encode(self, samples: np.ndarray) -> bytes:
        """Bytes completed by this chunk (may be empty while the codec buffers)."""
        with self._lock:
            return self._encode(samples)

    def _encode(self, samples: np.ndarray) -> bytes:
        if self.format.container is not None and self._container is None:
            raise RuntimeError("the encoder is closed")
        samples = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        self.samples_in += samples.size
        if not samples.size:
            return self._head()
        if self.format.container is None:
            return self._raw(self._resample(samples))
        frame = _frame(samples, self.in_rate)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._drain()

    def finish(self) -> bytes:
        """The remaining bytes; the encoder is closed after this."""
        with self._lock:
            return self._finish()

    def _finish(self) -> bytes:
        if self.format.container is None:
            tail = self._raw(self._resample(None))
            if self.format.name == "wav" and not self.streaming:
                data = b"".join(self._pcm)
                return wav_header(self.rate, len(data)) + data
            return tail
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None
        if self.streaming:
            return self._out.take()
        return self._out.getvalue()

    def close(self) -> None:
        """Release codec state without finishing (the request ended early)."""
        with self._lock:
            container = getattr(self, "_container", None)
            if container is not None:
                try:
                    container.close()
                except Exception:  # noqa: BLE001 - a half-written stream may fail to close
                    pass
                self._container = None

    # -- internals --------------------------------------------------------------------
    def _open_container(self) -> None:
        import av

        fmt = self.format
        self._out: Any = _Sink() if self.streaming else io.BytesIO()
        options = {"page_duration": _OGG_PAGE_US} if fmt.container == "ogg" else {}
        self._container = av.open(self._out, "w", format=fmt.container, options=options)
        self._stream = self._container.add_stream(fmt.codec, rate=self.rate, layout="mono")
        if fmt.bit_rate:
            self._stream.bit_rate = fmt.bit_rate

    def _drain(self) -> bytes:
        if self.streaming:
            return self._out.take()
        return b""  # whole response: everything comes out of finish()

    def _make_resampler(self) -> Any:
        if self.rate == self.in_rate:
            return None
        import av

        return av.AudioResampler(format="s16", layout="mono", rate=self.rate)

    def _resample(self, samples: np.ndarray | None) -> bytes:
        """float32 at in_rate -> s16le bytes at self.rate (None flushes the resampler)."""
        if self._resampler is None:
            return b"" if samples is None else pcm16(samples)
        frame = None if samples is None else _frame(samples, self.in_rate)
        return b"".join(f.to_ndarray().astype("<i2").tobytes()
                        for f in self._resampler.resample(frame))

    def _raw(self, pcm: bytes) -> bytes:
        if self.format.name == "wav" and not self.streaming:
            self._pcm.append(pcm)  # the header needs the length: sent by finish()
            return b""
        return self._head() + pcm

    def _head(self) -> bytes:
        """A streamed wav's header, once, before its first samples."""
        if self._header_sent or self.format.name != "wav" or not self.streaming:
            return b""
        self._header_sent = True
        return wav_header(self.rate, None)


def _frame(samples: np.ndarray, rate: int) -> Any:
    import av

    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = rate
    frame.time_base = Fraction(1, rate)
    return frame


def wav_header(rate: int, data_bytes: int | None) -> bytes:
    """44-byte RIFF/WAVE header for 16-bit mono PCM. data_bytes None: unknown length
    (streaming), written as 0xFFFFFFFF. Written by hand: PyAV's wav muxer needs a
    seekable output to fill in the sizes, which a stream does not have."""
    if data_bytes is None:
        riff = data = 0xFFFFFFFF
    else:
        riff, data = 36 + data_bytes, data_bytes
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", riff, b"WAVE", b"fmt ", 16, 1, 1, rate,
                       rate * 2, 2, 16, b"data", data)


def pcm16(samples: np.ndarray) -> bytes:
    """float32 samples in [-1, 1] -> 16-bit little-endian PCM bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def decode_audio(data: bytes, rate: int, max_seconds: float) -> np.ndarray:
    """Any container/codec PyAV reads -> float32 mono at `rate` (libswresample).
    ValueError naming the problem for undecodable or over-long input: a file whose
    header declares more than ``max_seconds`` is refused before anything is decoded, and
    decoding stops at the limit whatever a header said."""
    import av

    out: list[np.ndarray] = []
    limit, held = int(max_seconds * rate), 0
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise ValueError("the input has no audio stream")
            stream = container.streams.audio[0]
            declared = max(stream_seconds(container, stream), wav_seconds(data))
            if declared > max_seconds:
                raise ValueError(f"the audio declares {declared:.0f} s; at most "
                                 f"{max_seconds:g} s are accepted")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for piece in resampler.resample(frame):
                    out.append(piece.to_ndarray().reshape(-1))
                    held += len(out[-1])
                if held > limit:
                    raise ValueError(f"the audio is longer than {max_seconds:g} s")
            out += [p.to_ndarray().reshape(-1) for p in resampler.resample(None)]
    except av.FFmpegError as e:
        raise ValueError(f"the audio cannot be decoded ({e})") from None
    if not out or not sum(len(o) for o in out):
        raise ValueError("the audio holds no samples")
    return np.concatenate(out).astype(np.float32, copy=False)


def stream_seconds(container: Any, stream: Any) -> float:
    """A PyAV stream's declared duration in seconds (the container's when the stream has
    none; 0 when neither is known, as for a still image or a streamed FLAC)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return (container.duration or 0) / 1e6


_UNKNOWN_WAV_SIZES = (0, 0xFFFFFFFF)  # what streaming writers put in (wav_header(.., None))


def wav_seconds(data: bytes) -> float:
    """What a RIFF/WAVE header's data chunk declares, in seconds (0 for other files and
    for a streamed WAV's "unknown length"). FFmpeg caps a WAV's duration at the bytes it
    holds, so a small file declaring hours is caught here, not by its stream duration."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return 0.0
    at, byte_rate = 12, 0
    for _ in range(32):  # a WAV has a few chunks before its data; a loop bound all the same
        if at + 8 > len(data):
            return 0.0
        chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and at + 16 <= len(data):
            byte_rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            known = size not in _UNKNOWN_WAV_SIZES and byte_rate > 0
            return size / byte_rate if known else 0.0
        at += 8 + size + (size & 1)
    return 0.0


class PcmResampler:
    """16-bit mono PCM at one rate -> at another, chunk by chunk (a realtime client's
    24 kHz microphone stream -> the 16 kHz a recognizer and a VAD take). libswresample
    keeps its filter state between chunks, so the pieces join without clicks."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        import av

        self.in_rate, self.out_rate = in_rate, out_rate
        self._resampler = (None if in_rate == out_rate else
                           av.AudioResampler(format="s16", layout="mono", rate=out_rate))

    def feed(self, pcm: bytes) -> bytes:
        """ValueError for an odd number of bytes (not 16-bit samples)."""
        if len(pcm) % 2:
            raise ValueError(f"16-bit PCM has an even number of bytes, got {len(pcm)}")
        if self._resampler is None or not pcm:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        return self._resample(_frame(samples, self.in_rate))

    def flush(self) -> bytes:
        return b"" if self._resampler is None else self._resample(None)

    def _resample(self, frame: Any) -> bytes:
        return b"".join(f.to_ndarray().astype("<i2").tobytes()
                        for f in self._resampler.resample(frame))
