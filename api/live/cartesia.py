"""Cartesia's TTS WebSocket (`/tts/websocket`), for the voice-agent frameworks' Cartesia plugins pointed at
this server (docs/api.md#voice-agents).

Each context is one utterance of the live session underneath (api/live/session.py), spoken in the order the
contexts started. The client sends `{"context_id", "transcript", "continue", "voice", "output_format",
"add_timestamps", ...}` (`continue: false` ends the context's text), `{"context_id", "cancel": true}`
(barge-in: what is queued is dropped at once), and `flush`; the server answers with `chunk` messages
(base64 audio), `timestamps` (the words and their start and end in seconds from the context's start) and
`done` once a context's audio is all sent. POST `/tts/bytes` speaks one transcript.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from api.audio.telephony import RawEncoding
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError, kind_of
from api.live.common import invalid_parameters, json_message, speech_request
from api.live.contexts import Context, ContextProtocol
from api.live.protocol import SessionLink, Utterance, error_text
from api.live.transport import Frame, Transport
from api.protocol import MAX_SPEED, MIN_SPEED, InputTextAppend, InputTextFlush, LiveSession
from api.speech.captions import WordTime
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService

# Cartesia's voices are UUIDs: they stand for the server's default voice; a voice this server knows picks it.
CARTESIA_VOICE_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
ENCODINGS = {
    "pcm_s16le": RawEncoding.LINEAR16,
    "pcm_f32le": RawEncoding.FLOAT32,
    "pcm_mulaw": RawEncoding.MULAW,
    "pcm_alaw": RawEncoding.ALAW,
}
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
G711_RATES = (8000, 16000)


class Voice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: Literal["id"] = "id"
    id: str = Field(..., min_length=1)


class CartesiaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    container: Literal["raw", "wav"] = "raw"
    encoding: Literal["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"] = "pcm_s16le"
    sample_rate: int = 24000


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)


class ContextStart(BaseModel):
    """What a context's first message sets (the rest of Cartesia's fields are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    voice: Voice
    output_format: CartesiaFormat = Field(default_factory=CartesiaFormat)
    add_timestamps: StrictBool = False
    generation_config: GenerationConfig = Field(default_factory=GenerationConfig)


def voice_of(voice_id: str) -> str | None:
    return None if CARTESIA_VOICE_ID.fullmatch(voice_id) else voice_id


class CartesiaProtocol(ContextProtocol):
    """Cartesia's TTS WebSocket over a live session (see the module docstring)."""

    def __init__(self, speech: SpeechService) -> None:
        super().__init__()
        self.speech = speech

    def session(self) -> LiveSession:
        return LiveSession(response_format="pcm", return_timestamps=True)

    def events(self, frame: Frame) -> list[BaseModel]:
        body = json_message(frame)
        context_id = body.get("context_id")
        if not isinstance(context_id, str) or not context_id:
            raise InvalidRequestError(
                "Every message needs a context_id.", param="context_id", code="invalid_event"
            )
        if body.get("cancel"):
            return self.abandon() if self.find(context_id) is not None else []
        events: list[BaseModel] = []
        context = self.current(context_id)
        if context is None:
            if self.find(context_id) is not None:
                ended = f"Context {context_id!r} has ended: its text cannot go on."
                raise InvalidRequestError(ended, param="context_id", code="context_closed")
            events += self._start(context_id, body)
            context = self.pending[-1]
        transcript = body.get("transcript", "")
        if not isinstance(transcript, str):
            raise InvalidRequestError(
                "transcript must be a string.", param="transcript", code="invalid_event"
            )
        if transcript.strip():
            events.append(InputTextAppend(type="input_text.append", text=transcript))
        if body.get("flush"):
            events.append(InputTextFlush(type="input_text.flush"))
        if not body.get("continue", False):
            events += self.close(context)
        return events

    def _start(self, context_id: str, body: Mapping[str, Any]) -> list[BaseModel]:
        try:
            start = ContextStart.model_validate(body)
        except ValidationError as exc:
            raise invalid_parameters(exc) from None
        encoding = ENCODINGS[start.output_format.encoding]
        rates = G711_RATES if encoding in (RawEncoding.MULAW, RawEncoding.ALAW) else SAMPLE_RATES
        if start.output_format.sample_rate not in rates:
            message = f"sample_rate {start.output_format.sample_rate} is not offered: one of {rates}."
            raise InvalidRequestError(message, param="output_format.sample_rate", code="invalid_sample_rate")
        voice = voice_of(start.voice.id)
        self.speech.prepare(speech_request(input="-", voice=voice, speed=start.generation_config.speed))
        options = {
            "voice": voice,
            "encoding": encoding,
            "rate": start.output_format.sample_rate,
            "timestamps": start.add_timestamps,
        }
        return self.open(context_id, options)

    def encoder(self, speech: SpeechService, config: LiveSession) -> OffLoopEncoder:
        context = self.pending[0] if self.pending else None
        options = context.options if context is not None else {}
        return speech.raw_encoder(options.get("encoding", RawEncoding.LINEAR16), options.get("rate", 24000))

    async def audio(
        self, session: SessionLink, utterance: Utterance, data: bytes, words: list[WordTime], last: bool
    ) -> None:
        context = self.context_of(utterance)
        if words and context.options.get("timestamps"):
            stamps = {
                "words": [word.word for word in words],
                "start": [round(word.start_time, 3) for word in words],
                "end": [round(word.end_time, 3) for word in words],
            }
            await session.send_json(
                {
                    "type": "timestamps",
                    "context_id": context.id,
                    "status_code": 206,
                    "done": False,
                    "word_timestamps": stamps,
                }
            )
        if data:
            chunk = base64.b64encode(data).decode("ascii")
            await session.send_json(
                {"type": "chunk", "context_id": context.id, "status_code": 206, "done": False, "data": chunk}
            )

    async def final(self, session: SessionLink, context: Context, *, abandoned: bool) -> None:
        if abandoned:
            return  # a cancelled context gets nothing more, as from Cartesia
        await session.send_json({"type": "done", "context_id": context.id, "status_code": 200, "done": True})

    async def error(self, session: SessionLink, exc: APIError) -> None:
        await session.send_json(error_message(exc))

    async def refuse(self, transport: Transport, exc: ServiceUnavailableError) -> None:
        await transport.send_json(error_message(exc))


def error_message(exc: APIError, context_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "error",
        "context_id": context_id,
        "status_code": kind_of(exc).status,
        "done": True,
        "error": error_text(exc),
        "code": exc.code,
    }


class BytesRequest(ContextStart):
    """POST /tts/bytes: one transcript, the audio back (raw, or wav for pcm_s16le)."""

    transcript: str = Field(..., min_length=1)
    output_format: CartesiaFormat = Field(default_factory=CartesiaFormat)


def bytes_format(request: BytesRequest) -> tuple[RawEncoding, int]:
    encoding = ENCODINGS[request.output_format.encoding]
    rates = G711_RATES if encoding in (RawEncoding.MULAW, RawEncoding.ALAW) else SAMPLE_RATES
    if request.output_format.sample_rate not in rates:
        message = f"sample_rate {request.output_format.sample_rate} is not offered: one of {rates}."
        raise InvalidRequestError(message, param="output_format.sample_rate", code="invalid_sample_rate")
    return encoding, request.output_format.sample_rate
