"""The response formats of the speech endpoint and the content type each is served with."""

from __future__ import annotations

from enum import Enum


class AudioFormat(str, Enum):
    """The `response_format` values of OpenAI's speech endpoint."""

    MP3 = "mp3"
    OPUS = "opus"
    AAC = "aac"
    FLAC = "flac"
    WAV = "wav"
    PCM = "pcm"


CONTENT_TYPES: dict[AudioFormat, str] = {
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg",  # Opus packets in an Ogg container
    AudioFormat.AAC: "audio/aac",  # raw AAC in ADTS frames
    AudioFormat.FLAC: "audio/flac",
    AudioFormat.WAV: "audio/wav",
    AudioFormat.PCM: "audio/pcm",
}


class BookFormat(str, Enum):
    """The formats a book job (POST /v1/audio/jobs) makes: whole files with chapter markers."""

    M4B = "m4b"
    M4A = "m4a"
    MP3 = "mp3"
    OPUS = "opus"
    FLAC = "flac"
    WAV = "wav"


BOOK_CONTENT_TYPES: dict[BookFormat, str] = {
    BookFormat.M4B: "audio/mp4",
    BookFormat.M4A: "audio/mp4",
    BookFormat.MP3: "audio/mpeg",
    BookFormat.OPUS: "audio/ogg",
    BookFormat.FLAC: "audio/flac",
    BookFormat.WAV: "audio/wav",
}
