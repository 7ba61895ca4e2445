"""A finished book's file: its audio so far (int16 in audio.pcm) encoded once, with chapter markers a
player shows (MP4 chapters in m4b/m4a, ID3 CHAP/CTOC frames in mp3, Vorbis-comment chapters in opus and
flac; wav has none) and the book's title. Written beside and renamed into place, so a crash or a full
disk never leaves a partial file under the finished name."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import mutagen.flac
import numpy as np

from api.audio.encoder import CODEC_SPECS, INT16_SCALE, Chapter, CodecSpec, PyAVEncoder, mp3_spec
from api.audio.formats import AudioFormat, BookFormat

# Audio read and encoded at a time: 30 s at 24 kHz.
BLOCK_SAMPLES = 30 * 24_000
# AAC's bit rate for books: speech at 24 kHz mono; about 29 MB an hour.
BOOK_AAC_BIT_RATE = 64_000


_MP4 = CodecSpec(
    "ipod",
    "aac",
    "flt",
    bit_rate=BOOK_AAC_BIT_RATE,
    codec_options={"aac_coder": "fast"},
    file_options={"movflags": "+faststart"},  # the index first: a player seeks before it has the whole file
)
_WAV = CodecSpec("wav", "pcm_s16le", "s16", needs_audio=False, file_options={"rf64": "auto"})


def book_spec(fmt: BookFormat, *, mp3_kbps: int, mp3_quality: int) -> CodecSpec:
    if fmt in (BookFormat.M4B, BookFormat.M4A):
        return _MP4
    if fmt is BookFormat.MP3:
        return mp3_spec(mp3_kbps, mp3_quality)
    if fmt is BookFormat.WAV:
        return _WAV
    return CODEC_SPECS[AudioFormat(fmt.value)]


def assemble(
    pcm: Path,
    output: Path,
    spec: CodecSpec,
    *,
    sample_rate: int,
    title: str,
    chapters: Sequence[Chapter],
) -> int:
    """Encode `pcm` (int16 mono at `sample_rate`) into `output` with `chapters`; returns its size."""
    partial = output.with_name(output.name + ".partial")
    metadata = {"title": title, "album": title, "genre": "Audiobook"}
    encoder = PyAVEncoder(
        spec, sample_rate, streaming=False, path=str(partial), chapters=chapters, metadata=metadata
    )
    try:
        with open(pcm, "rb") as audio:
            while block := audio.read(BLOCK_SAMPLES * 2):
                encoder.encode(np.frombuffer(block, dtype="<i2").astype(np.float32) / INT16_SCALE)
        encoder.finish()
        if spec.container == "flac":
            _flac_chapters(partial, chapters, sample_rate)
    except BaseException:
        encoder.close()
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, output)
    return output.stat().st_size


def _flac_chapters(path: Path, chapters: Sequence[Chapter], sample_rate: int) -> None:
    """Chapters as Vorbis comments (CHAPTER001=HH:MM:SS.mmm, CHAPTER001NAME=title), which ffmpeg's FLAC
    muxer does not write and players (and ffmpeg's demuxer) read."""
    tags = mutagen.flac.FLAC(path)  # type: ignore[no-untyped-call]
    for number, chapter in enumerate(chapters, start=1):
        tags[f"CHAPTER{number:03d}"] = _clock(chapter.start / sample_rate)
        tags[f"CHAPTER{number:03d}NAME"] = chapter.title
    tags.save()


def _clock(seconds: float) -> str:
    milliseconds = round(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}"
