"""Encoders that turn float32 mono samples into the bytes of one audio file, piece by piece."""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal, cast

import av
import lameenc
import numpy as np
from av.audio.stream import AudioStream

from api.audio.formats import AudioFormat

if TYPE_CHECKING:
    from av.container.core import Chapter as AVChapter

INT16_SCALE = 32767
WAV_UNKNOWN_SIZE = 0xFFFFFFFF  # what streaming writers put in the RIFF and data sizes
_WAV_HEADER = struct.Struct("<4sI4s4sIHHIIHH4sI")
_WAV_FMT_CHUNK_SIZE = 16
_WAV_FORMAT_PCM = 1
_BYTES_PER_SAMPLE = 2
# mp3's constant bit rate (kbit/s) and LAME's quality (-q, 0 slowest to 9 fastest). Left to itself LAME
# makes 32 kbit/s at -q 3 for 24 kHz mono: low-passed, 4.0 dB (log-mel) from real speech. 96 at -q 7 is
# 0.6 dB from it (0.04 more than -q 3) for about half the CPU of -q 3 (docs/api.md, "MP3 settings").
DEFAULT_MP3_KBPS = 96
DEFAULT_MP3_QUALITY = 7
# The valid range of LAME's -q.
MP3_QUALITIES = range(10)
# By default the Ogg muxer closes a page only after a second or more of Opus, which a stream must wait for.
_OGG_PAGE_DURATION_US = 100_000


def to_int16(samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Clip to [-1, 1], scale by 32767 and round to nearest: the one conversion behind pcm, wav and flac."""
    return np.round(_clip(samples) * INT16_SCALE).astype("<i2")


def _clip(samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"expected 1-D mono samples, got shape {array.shape}")
    return np.clip(array, -1.0, 1.0)


class AudioEncoder(ABC):
    """Encodes one response: `encode` returns the bytes that became ready, `finish` the rest.

    The concatenation of everything returned, once `finish` has been called, is a complete file.
    One encoder serves one request from one thread at a time.
    """

    def __init__(self) -> None:
        self._finished = False

    def encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        if self._finished:
            raise RuntimeError("encode() after finish()")
        return self._encode(samples)

    def finish(self) -> bytes:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._finish()

    def close(self) -> None:
        """Release an encoder abandoned before `finish` (the client left); its output is dropped."""
        if not self._finished:
            self._finished = True
            self._discard()

    def _discard(self) -> None:
        return None

    @abstractmethod
    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes: ...

    @abstractmethod
    def _finish(self) -> bytes: ...


class PcmEncoder(AudioEncoder):
    """Raw signed 16-bit little-endian samples, nothing else."""

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        return to_int16(samples).tobytes()

    def _finish(self) -> bytes:
        return b""


def wav_header(sample_rate: int, data_size: int) -> bytes:
    """The 44-byte RIFF/WAVE header of 16-bit mono PCM; `WAV_UNKNOWN_SIZE` marks a stream."""
    riff_size = WAV_UNKNOWN_SIZE if data_size == WAV_UNKNOWN_SIZE else 36 + data_size
    return _WAV_HEADER.pack(
        b"RIFF", riff_size, b"WAVE",
        b"fmt ", _WAV_FMT_CHUNK_SIZE, _WAV_FORMAT_PCM, 1, sample_rate,
        sample_rate * _BYTES_PER_SAMPLE, _BYTES_PER_SAMPLE, 8 * _BYTES_PER_SAMPLE,
        b"data", data_size,
    )  # fmt: skip


class WavEncoder(AudioEncoder):
    """16-bit mono WAV: streamed with unknown sizes, or buffered and returned whole with exact ones."""

    def __init__(self, sample_rate: int, *, streaming: bool) -> None:
        super().__init__()
        self._sample_rate = sample_rate
        self._streaming = streaming
        self._header_sent = False
        self._buffered: list[bytes] = []

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        data = to_int16(samples).tobytes()
        if not self._streaming:
            self._buffered.append(data)
            return b""
        return self._stream_header() + data

    def _finish(self) -> bytes:
        if self._streaming:
            return self._stream_header()
        data = b"".join(self._buffered)
        self._buffered.clear()
        return wav_header(self._sample_rate, len(data)) + data

    def _stream_header(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return wav_header(self._sample_rate, WAV_UNKNOWN_SIZE)


class _ByteSink:
    """A write-only output; with no `seek`/`tell`, PyAV marks it unseekable, so muxers never seek back."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def drain(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


@dataclass(frozen=True)
class CodecSpec:
    """How one format is made with PyAV: the container, the codec and the options given to each."""

    container: str
    codec: Literal["libmp3lame", "libopus", "aac", "flac", "pcm_s16le"]
    sample_format: str  # "flt" for lossy codecs, "s16" (from `to_int16`) for flac
    bit_rate: int | None = None
    # mp3, adts and Ogg Opus streams without a single audio packet cannot be opened by ffmpeg.
    needs_audio: bool = True
    streaming_options: Mapping[str, str] = field(default_factory=dict)
    codec_options: Mapping[str, str] = field(default_factory=dict)
    file_options: Mapping[str, str] = field(default_factory=dict)  # the container's, writing a whole file


@dataclass(frozen=True)
class Chapter:
    """A chapter marker of a whole file: its title and [start, end) in samples."""

    title: str
    start: int
    end: int


def _chapter(index: int, chapter: Chapter, sample_rate: int) -> AVChapter:
    return {
        "id": index + 1,
        "start": chapter.start,
        "end": chapter.end,
        # a Fraction to av 18's stubs, an AVRational to av 19's (Python 3.12+); both take any rational
        "time_base": cast(Any, Fraction(1, sample_rate)),
        "metadata": {"title": chapter.title},
    }


CODEC_SPECS: dict[AudioFormat, CodecSpec] = {
    AudioFormat.MP3: CodecSpec(
        "mp3",
        "libmp3lame",
        "flt",
        bit_rate=1000 * DEFAULT_MP3_KBPS,
        codec_options={"compression_level": str(DEFAULT_MP3_QUALITY)},
    ),
    AudioFormat.OPUS: CodecSpec(
        "ogg",
        "libopus",
        "flt",
        bit_rate=64_000,  # libopus's own default, set so it does not warn about choosing one
        streaming_options={"page_duration": str(_OGG_PAGE_DURATION_US)},
    ),
    # ffmpeg's "fast" AAC coder: 4.2x less CPU than its default (twoloop) on speech, and no further from
    # the source (log-mel distance 0.73 dB against 0.78; docs/journal/gpu.md, entry 8).
    AudioFormat.AAC: CodecSpec("adts", "aac", "flt", codec_options={"aac_coder": "fast"}),
    AudioFormat.FLAC: CodecSpec("flac", "flac", "s16", needs_audio=False),
}


class PyAVEncoder(AudioEncoder):
    """One PyAV encoder and muxer; streaming writes to an unseekable sink and hands out what it wrote.

    Without streaming the output is seekable, so the muxer can go back and fill in totals (FLAC
    STREAMINFO, the mp3 Xing/LAME frame with its gapless delay and padding) and `finish` returns it all.
    """

    def __init__(
        self,
        spec: CodecSpec,
        sample_rate: int,
        *,
        streaming: bool,
        path: str | None = None,
        chapters: Sequence[Chapter] = (),
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """`path`: write the file there (`finish` then returns nothing), with `chapters` (in samples) and
        `metadata` (title, ...) where the container keeps them."""
        super().__init__()
        self._spec = spec
        self._sample_rate = sample_rate
        self._time_base = Fraction(1, sample_rate)
        self._sink = _ByteSink() if streaming else None
        self._file = io.BytesIO()
        options = dict(spec.streaming_options) if streaming else dict(spec.file_options)
        output = self._sink if self._sink is not None else path or self._file
        self._container = av.open(output, mode="w", format=spec.container, container_options=options)
        self._container.metadata.update(metadata or {})
        if chapters:
            self._container.set_chapters(
                [_chapter(index, chapter, sample_rate) for index, chapter in enumerate(chapters)]
            )
        self._to_file = path is not None
        stream = self._container.add_stream(
            spec.codec, rate=sample_rate, layout="mono", options=dict(spec.codec_options)
        )
        # older PyAV's stubs (Python 3.10 gets one) type a stream of a codec by name as any kind of stream
        assert isinstance(stream, AudioStream)
        self._stream = stream
        if spec.bit_rate is not None:
            self._stream.bit_rate = spec.bit_rate
        self._samples_sent = 0

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        if len(samples) > 0:
            self._send(self._frame(samples))
        return self._sink.drain() if self._sink is not None else b""

    def _finish(self) -> bytes:
        if self._samples_sent == 0 and self._spec.needs_audio:
            self._send(self._frame(np.zeros(1, dtype=np.float32)))
        self._container.start_encoding()  # writes the header even when no packet was muxed
        self._send(None)
        self._container.close()
        if self._to_file:
            return b""
        return self._sink.drain() if self._sink is not None else self._file.getvalue()

    def _discard(self) -> None:
        # Flushing first keeps ffmpeg from warning about frames left in the encoder's queue.
        self._send(None)
        self._container.close()

    def _frame(self, samples: np.ndarray[Any, Any]) -> av.AudioFrame:
        converted = to_int16(samples) if self._spec.sample_format == "s16" else _clip(samples)
        frame = av.AudioFrame.from_ndarray(
            converted[np.newaxis, :], format=self._spec.sample_format, layout="mono"
        )
        frame.sample_rate = self._sample_rate
        frame.time_base = self._time_base
        frame.pts = self._samples_sent
        self._samples_sent += frame.samples
        return frame

    def _send(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)


class LameEncoder(AudioEncoder):
    """Streamed mp3: LAME's frames from lameenc, with no container and no Xing/LAME frame (a stream
    cannot go back to fill one in, so PyAV's streamed mp3 has none either).

    lameenc runs the same LAME settings at about 3x less CPU per audio second than libmp3lame through
    PyAV, at the same distance from the source, and releases the GIL while it encodes (docs/api.md, "MP3
    settings"). It takes 16-bit samples, made by `to_int16` as for pcm, wav and flac.
    """

    def __init__(self, sample_rate: int, *, kbps: int, quality: int) -> None:
        super().__init__()
        check_mp3_quality(quality)
        self._lame = lameenc.Encoder()
        self._lame.set_in_sample_rate(sample_rate)
        self._lame.set_channels(1)
        self._lame.set_bit_rate(kbps)
        self._lame.set_quality(quality)
        self._samples_sent = 0

    def _encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        if len(samples) == 0:
            return b""
        self._samples_sent += len(samples)
        return bytes(self._lame.encode(to_int16(samples).tobytes()))

    def _finish(self) -> bytes:
        # As for PyAV's mp3: a stream without a frame of audio cannot be opened, so one silent sample.
        head = b"" if self._samples_sent else self._encode(np.zeros(1, dtype=np.float32))
        return head + bytes(self._lame.flush())


def create_encoder(
    fmt: AudioFormat,
    sample_rate: int,
    *,
    streaming: bool,
    mp3_kbps: int = DEFAULT_MP3_KBPS,
    mp3_quality: int = DEFAULT_MP3_QUALITY,
) -> AudioEncoder:
    """The encoder for one response in `fmt`; `streaming` chooses incremental output over a seekable file.

    Streamed mp3 comes from lameenc; a whole mp3 file from PyAV, whose muxer writes the Xing/LAME frame
    that tells players to trim LAME's start delay and end padding (lameenc cannot make one).
    """
    if fmt is AudioFormat.PCM:
        return PcmEncoder()
    if fmt is AudioFormat.WAV:
        return WavEncoder(sample_rate, streaming=streaming)
    if fmt is AudioFormat.MP3 and streaming:
        return LameEncoder(sample_rate, kbps=mp3_kbps, quality=mp3_quality)
    if fmt is AudioFormat.MP3:
        return PyAVEncoder(mp3_spec(mp3_kbps, mp3_quality), sample_rate, streaming=streaming)
    return PyAVEncoder(CODEC_SPECS[fmt], sample_rate, streaming=streaming)


def check_mp3_quality(quality: int) -> None:
    if quality not in MP3_QUALITIES:
        raise ValueError(f"LAME's quality runs from 0 to 9, got {quality}")


def mp3_spec(kbps: int, quality: int) -> CodecSpec:
    """mp3 at a constant `kbps` (LAME takes the nearest rate its MPEG version has) and LAME's -q `quality`."""
    check_mp3_quality(quality)
    options = {"compression_level": str(quality)}
    return replace(CODEC_SPECS[AudioFormat.MP3], bit_rate=1000 * kbps, codec_options=options)
