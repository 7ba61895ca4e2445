"""Raw audio at the sample rates and encodings voice-agent protocols ask for (Deepgram's `encoding` and
`sample_rate`, ElevenLabs' `output_format`): 16-bit PCM, G.711 μ-law or A-law, resampled from the model's
24 kHz with libswresample's windowed-sinc filter (PyAV), never by dropping samples.

One `RawEncoder` serves one stream: the resampler keeps its filter's state between pieces, so pieces join
without clicks, and `finish` drains what the filter still holds."""

from __future__ import annotations

from enum import Enum
from fractions import Fraction
from typing import Any

import av
import numpy as np

from api.audio.encoder import AudioEncoder, to_int16


class RawEncoding(str, Enum):
    LINEAR16 = "linear16"  # signed 16-bit little-endian PCM
    FLOAT32 = "float32"  # 32-bit float little-endian PCM (Cartesia's pcm_f32le)
    MULAW = "mulaw"  # G.711 μ-law, 8 bits a sample
    ALAW = "alaw"  # G.711 A-law


_G711_CODECS = {RawEncoding.MULAW: "pcm_mulaw", RawEncoding.ALAW: "pcm_alaw"}


class RawEncoder(AudioEncoder):
    """Float32 mono at `source_rate` in, headerless `encoding` at `rate` out."""

    def __init__(self, encoding: RawEncoding, rate: int, source_rate: int) -> None:
        super().__init__()
        self._encoding = encoding
        self._rate = rate
        self._source_rate = source_rate
        self._float = encoding is RawEncoding.FLOAT32
        sample_format = "flt" if self._float else "s16"
        self._resampler = (
            av.AudioResampler(format=sample_format, layout="mono", rate=rate) if rate != source_rate else None
        )
        self._codec: av.AudioCodecContext | None = None
        if encoding in _G711_CODECS:
            codec = av.CodecContext.create(_G711_CODECS[encoding], "w")
            assert isinstance(codec, av.AudioCodecContext)
            codec.sample_rate = rate
            codec.layout = "mono"
            codec.format = "s16"
            codec.time_base = Fraction(1, rate)
            codec.open()
            self._codec = codec
        self._pts = 0

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        if len(samples) == 0:
            return b""
        if self._float:
            converted = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
            frame = av.AudioFrame.from_ndarray(converted[np.newaxis, :], format="flt", layout="mono")
        else:
            frame = av.AudioFrame.from_ndarray(to_int16(samples)[np.newaxis, :], format="s16", layout="mono")
        frame.sample_rate = self._source_rate
        frame.time_base = Fraction(1, self._source_rate)
        frame.pts = self._pts
        self._pts += frame.samples
        return self._out(self._resampler.resample(frame) if self._resampler is not None else [frame])

    def _finish(self) -> bytes:
        data = self._out(self._resampler.resample(None)) if self._resampler is not None else b""
        if self._codec is not None:
            data += b"".join(bytes(packet) for packet in self._codec.encode(None))
        return data

    def _out(self, frames: list[av.AudioFrame]) -> bytes:
        if self._codec is None:
            dtype = "<f4" if self._float else "<i2"
            return b"".join(frame.to_ndarray().astype(dtype).tobytes() for frame in frames)
        return b"".join(bytes(packet) for frame in frames for packet in self._codec.encode(frame))


class ResampledEncoder(AudioEncoder):
    """Another encoder fed at `rate` (ElevenLabs' mp3_44100_128, say): the model's samples resampled with the
    same filter, as float, then handed on."""

    def __init__(self, inner: AudioEncoder, rate: int, source_rate: int) -> None:
        super().__init__()
        self._inner = inner
        self._source_rate = source_rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        self._pts = 0

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        if len(samples) == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(
            np.asarray(samples, dtype=np.float32)[np.newaxis, :], format="flt", layout="mono"
        )
        frame.sample_rate = self._source_rate
        frame.time_base = Fraction(1, self._source_rate)
        frame.pts = self._pts
        self._pts += frame.samples
        return self._inner.encode(self._floats(self._resampler.resample(frame)))

    def _finish(self) -> bytes:
        tail = self._floats(self._resampler.resample(None))
        return (self._inner.encode(tail) if len(tail) else b"") + self._inner.finish()

    def _discard(self) -> None:
        self._inner.close()

    @staticmethod
    def _floats(frames: list[av.AudioFrame]) -> np.ndarray[Any, Any]:
        if not frames:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames]).astype(np.float32)
