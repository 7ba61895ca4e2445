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
