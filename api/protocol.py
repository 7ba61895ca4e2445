"""OpenAI's /v1/audio/speech request and the response shapes of the other endpoints."""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from api.audio.formats import AudioFormat, BookFormat
from api.engine.voice_files import VOICE_GENDERS
from api.text.normalize import NormalizationOptions
from api.text.phonemize import LANGUAGES

MODEL_IDS = ("kokoro", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# OpenAI's dated snapshots of its TTS models: gpt-4o-mini-tts-2025-03-20, gpt-4o-mini-tts-2025-12-15,
# tts-1-1106, tts-1-hd-1106 (and any later date).
SNAPSHOT = re.compile(r"(?P<model>tts-1|tts-1-hd|gpt-4o-mini-tts)-(?P<date>\d{4}-\d{2}-\d{2}|1106)")
MODEL_CREATED = 1_736_000_000  # Kokoro-82M v1.0's release, January 2025
MODEL_OWNER = "kokoro-openai-server"

# OpenAI's voice names -> the Kokoro voice that stands in for each.
OPENAI_VOICES: dict[str, str] = {
    "alloy": "af_alloy",
    "ash": "am_adam",
    "ballad": "bm_george",
    "coral": "af_heart",
    "echo": "am_echo",
    "fable": "bm_fable",
    "nova": "af_nova",
    "onyx": "am_onyx",
    "sage": "af_sarah",
    "shimmer": "af_bella",
    "verse": "am_michael",
    # OpenAI's newer voices, made for gpt-4o-mini-tts; two Kokoro voices rated above most (C+).
    "marin": "af_kore",
    "cedar": "am_fenrir",
}


def model_id(name: str) -> str:
    """The model id a name stands for: itself, or the model of a dated OpenAI snapshot name."""
    match = SNAPSHOT.fullmatch(name)
    return match["model"] if match is not None and _is_date(match["date"]) else name


def _is_date(text: str) -> bool:
    try:
        return text == "1106" or bool(datetime.date.fromisoformat(text))
    except ValueError:
        return False


class VoiceRef(BaseModel):
    """OpenAI's object form of `voice` (its custom voices): the id is looked up like a voice name."""

    id: str = Field(..., min_length=1, description="A voice, an OpenAI voice name, or a mix.")


def _voice_name(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if set(value) != {"id"} or not isinstance(value["id"], str) or not value["id"]:
        raise ValueError('a voice object is {"id": "<voice name>"}')
    return value["id"]


def _model_name(value: Any) -> Any:
    return model_id(value) if isinstance(value, str) else value


# `voice` is a name or OpenAI's {"id": ...}; the service sees the name either way.
VoiceName = Annotated[str | None, BeforeValidator(_voice_name, json_schema_input_type=str | VoiceRef | None)]
ModelName = Annotated[str, BeforeValidator(_model_name)]


MIN_SPEED, MAX_SPEED = 0.25, 4.0
InputFormat = Literal["auto", "text", "ssml"]


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech: OpenAI's fields plus `stream` and `lang_code` (Kokoro-FastAPI's extensions)."""

    model: ModelName = Field(
        "kokoro",
        description="One of " + ", ".join(MODEL_IDS) + ", or a dated snapshot name like "
        "gpt-4o-mini-tts-2025-03-20 (read as its model).",
    )
    input: str = Field(..., min_length=1, description="The text to speak.")
    voice: VoiceName = Field(
        None,
        description="A voice, an OpenAI voice name, or a mix like af_bella(2)+af_sky(1); or OpenAI's "
        'object form {"id": "<any of those>"}.',
    )
    response_format: AudioFormat = Field(AudioFormat.MP3, description="Audio format of the response.")
    speed: float = Field(
        1.0, ge=MIN_SPEED, le=MAX_SPEED, strict=True, description="Speaking speed, 0.25 to 4.0."
    )
    instructions: str | None = Field(None, description="Accepted for compatibility; Kokoro ignores it.")
    stream_format: Literal["audio", "sse"] = Field("audio", description="Raw audio or server-sent events.")
    stream: bool = Field(
        True, strict=True, description="Chunked body as audio is made (true) or one complete body."
    )
    lang_code: str | None = Field(
        None, description="G2P language (a, b, e, f, h, i, j, p, z); defaults to the voice's first letter."
    )
    normalization_options: NormalizationOptions = Field(
        default_factory=NormalizationOptions,
        description="Which text normalization rules apply (Kokoro-FastAPI's names); all on by default.",
    )
    input_format: InputFormat = Field(
        "auto",
        description="'text', 'ssml', or 'auto': SSML when the input starts with <speak> (and the server "
        "allows SSML), else text with inline [voice:NAME] and [pause:1s] tags.",
    )
    volume_multiplier: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="Gain applied to the audio (clipped at full scale); Kokoro-FastAPI's.",
    )
    return_timestamps: bool = Field(
        False,
        strict=True,
        description="With stream_format 'sse': each speech.audio.delta event also carries `timestamps`, the "
        "words (as written in `input`) whose audio it completes, with start_time and end_time in seconds.",
    )


class WordTimestamp(BaseModel):
    """A word of the input (punctuation attached; several words where they were read as one, like a
    date) and when it is spoken in the audio sent, in seconds."""

    word: str
    start_time: float
    end_time: float


class CaptionedSpeechRequest(SpeechRequest):
    """POST /dev/captioned_speech: Kokoro-FastAPI's request (its defaults: streamed, with timestamps)."""

    stream: bool = Field(
        True, strict=True, description="One JSON line per audio piece (true) or one JSON object."
    )
    return_timestamps: bool = Field(
        True, strict=True, description="Word timestamps in the response (else null)."
    )
    return_download_link: bool = Field(
        False, strict=True, description="Not supported: true is answered with a 400."
    )
    subtitle_format: Literal["srt", "vtt"] | None = Field(
        None,
        description="Also return subtitles for the whole text: a `subtitles` field in the JSON object, or "
        "a last JSON line (empty audio) when streamed.",
    )


class CaptionedSpeechResponse(BaseModel):
    """Kokoro-FastAPI's response: base64 audio, its content type, the words it contains."""

    audio: str
    audio_format: str
    timestamps: list[WordTimestamp] | None
    subtitles: str | None = None


class PhonemeRequest(BaseModel):
    """POST /dev/phonemize (Kokoro-FastAPI's shape)."""

    text: str = Field(
        ..., min_length=1, description="Text to phonemize (normalized first, lexicon included)."
    )
    language: str = Field("a", description="G2P language code (a, b, e, f, h, i, p).")


class PhonemeResponse(BaseModel):
    phonemes: str
    tokens: list[int]


class PhonemesRequest(BaseModel):
    """POST /dev/generate_from_phonemes: Kokoro-FastAPI's phonemes and voice, plus our format fields."""

    phonemes: str = Field(
        ..., min_length=1, description="Phonemes in Kokoro's alphabet, words separated by spaces."
    )
    voice: VoiceName = Field(
        None, description='A voice, an OpenAI voice name, or a mix; or {"id": "<any of those>"}.'
    )
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, strict=True, description="Speaking speed.")
    response_format: AudioFormat = Field(AudioFormat.WAV, description="Audio format of the response.")
    stream: bool = Field(True, strict=True, description="Chunked body as audio is made, or one body.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = MODEL_CREATED
    owned_by: str = MODEL_OWNER


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AudioModel(BaseModel):
    id: str
    name: str


class AudioModelList(BaseModel):
    """GET /v1/audio/models, in the shape Open WebUI reads (`{"models": [{"id", "name"}]}`)."""

    models: list[AudioModel]


class Voice(BaseModel):
    """A voice, with the language and gender its name says (null for a name outside Kokoro's scheme)."""

    id: str
    name: str
    lang_code: str | None = None
    language: str | None = None
    gender: str | None = None

    @classmethod
    def named(cls, name: str) -> Voice:
        if len(name) > 2 and name[2] == "_" and name[0] in LANGUAGES and name[1] in VOICE_GENDERS:
            return cls(
                id=name,
                name=name,
                lang_code=name[0],
                language=LANGUAGES[name[0]],
                gender=VOICE_GENDERS[name[1]],
            )
        return cls(id=name, name=name)


class VoiceList(BaseModel):
    voices: list[Voice]


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class SpeechAudioDelta(BaseModel):
    """Server-sent event: a piece of the audio in `response_format`, base64, and with `return_timestamps`
    the words (as written in `input`) whose audio it completes."""

    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str
    timestamps: list[WordTimestamp] | None = None


class SpeechAudioDone(BaseModel):
    """Server-sent event: the last one of a response, with its usage."""

    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: Usage


# What `data:` of each server-sent event of /v1/audio/speech holds (OpenAI's `stream_format: "sse"`).
SpeechStreamEvent = Annotated[SpeechAudioDelta | SpeechAudioDone, Field(discriminator="type")]


# --- the live WebSocket (/v1/audio/speech/live): text in as it is written, audio out as it is made ------

LiveFormat = Literal["pcm", "mp3", "opus", "wav"]


class _ClientEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LiveSession(_ClientEvent):
    """How a live session speaks; `session.update` changes any of it between utterances."""

    model: ModelName = Field("kokoro", description="One of " + ", ".join(MODEL_IDS) + ".")
    voice: VoiceName = Field(
        None, description="A voice, an OpenAI voice name, or a mix (default: the server's)."
    )
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, description="Speaking speed, 0.25 to 4.0.")
    response_format: LiveFormat = Field("pcm", description="pcm (24 kHz s16le mono), mp3, opus or wav.")
    lang_code: str | None = Field(None, description="G2P language; defaults to the voice's first letter.")
    return_timestamps: bool = Field(
        False, description="Each speech.audio.delta carries the words (as sent) whose audio it completes."
    )


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"]
    session: LiveSession


class InputTextAppend(_ClientEvent):
    type: Literal["input_text.append"]
    text: str


class InputTextFlush(_ClientEvent):
    type: Literal["input_text.flush"]


class InputTextClear(_ClientEvent):
    type: Literal["input_text.clear"]


class InputTextDone(_ClientEvent):
    type: Literal["input_text.done"]


LiveClientEvent = Annotated[
    SessionUpdate | InputTextAppend | InputTextFlush | InputTextClear | InputTextDone,
    Field(discriminator="type"),
]


class SessionUpdated(BaseModel):
    """The session's settings after a `session.update` (all of them, not only those sent)."""

    type: Literal["session.updated"] = "session.updated"
    session: LiveSession


class InputTextCleared(BaseModel):
    """After `input_text.clear`: nothing of the cleared text is sent after this event."""

    type: Literal["input_text.cleared"] = "input_text.cleared"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEvent(BaseModel):
    """Any error, in OpenAI's error shape; the session goes on unless a close frame follows."""

    type: Literal["error"] = "error"
    error: ErrorDetail


LiveServerEvent = Annotated[
    SpeechAudioDelta | SpeechAudioDone | SessionUpdated | InputTextCleared | ErrorEvent,
    Field(discriminator="type"),
]


class BookJobRequest(BaseModel):
    """POST /v1/audio/jobs as JSON: a text or Markdown book to speak in the background (a file comes as
    multipart/form-data with the same fields beside `file`)."""

    input: str = Field(..., min_length=1, description="The book: plain text, or Markdown with input_format.")
    input_format: Literal["text", "markdown"] = Field(
        "text",
        description="'text': one chapter; 'markdown': a chapter per heading (see docs/api.md#books).",
    )
    voice: VoiceName = Field(None, description="A voice or mix, as for /v1/audio/speech.")
    speed: float = Field(
        1.0, ge=MIN_SPEED, le=MAX_SPEED, strict=True, description="Speaking speed, 0.25 to 4.0."
    )
    lang_code: str | None = Field(None, description="The G2P language; default: the voice's.")
    response_format: BookFormat = Field(
        BookFormat.M4B, description="The finished file: m4b/m4a (AAC in MP4), mp3, opus, flac or wav."
    )
    captions: bool = Field(
        False, strict=True, description="Also make word-timed captions (…/captions as SRT or VTT)."
    )
    title: str | None = Field(None, max_length=500, description="The book's title; default: its own.")


class BookJobProgress(BaseModel):
    chunks_done: int
    chunks_total: int | None = Field(description="Known once the whole book is planned, early in the job.")
    characters_done: int
    characters_total: int
    audio_seconds: float
    fraction: float = Field(description="characters_done / characters_total, 0 to 1.")


class BookJobChapter(BaseModel):
    title: str
    characters: int
    start_time: float | None = Field(
        description="Seconds into the audio; known once its first audio is made."
    )


class BookJobError(BaseModel):
    message: str
    code: str


class BookJob(BaseModel):
    """A book job: its state, progress and chapters; audio_url once done."""

    id: str
    object: Literal["audio.job"] = "audio.job"
    created_at: int
    state: Literal["queued", "running", "done", "failed"]
    title: str
    voice: str
    speed: float
    lang_code: str | None
    response_format: BookFormat
    captions: bool
    progress: BookJobProgress
    eta_seconds: float | None = Field(description="From the rate measured in this run; None until known.")
    chapters: list[BookJobChapter]
    error: BookJobError | None = None
    started_at: int | None = None
    finished_at: int | None = None
    audio_url: str | None = None
    captions_url: str | None = None
    bytes: int | None = Field(None, description="The finished file's size.")


class BookJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BookJob]


class BookJobDeleted(BaseModel):
    id: str
    object: Literal["audio.job"] = "audio.job"
    deleted: bool = True
