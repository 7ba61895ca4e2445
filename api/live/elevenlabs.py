"""ElevenLabs' text-to-speech: the WebSockets `/v1/text-to-speech/{voice_id}/multi-stream-input` (contexts on
one socket) and `stream-input` (one stream), and the POSTs `/v1/text-to-speech/{voice_id}` and `.../stream`,
for the voice-agent frameworks' ElevenLabs plugins pointed at this server (docs/api.md#voice-agents).

Each context is one utterance of the live session underneath (api/live/session.py), spoken in the order the
contexts started. The client sends `{"text", "context_id"}` (a text of one space opens a context, an empty
one keeps it alive), `flush` to speak what was sent now, `close_context` once the context has no more text
(its audio is finished, then `isFinal`), and `close_socket`. The server answers with `{"audio" (base64),
"alignment", "normalizedAlignment", "isFinal", "contextId"}`. The character timings of each message count
from that message's first character, as ElevenLabs' do.

Barge-in: a voice agent that is interrupted closes the interrupted context and opens the next one. When text
arrives for a new context while an earlier, closed context still has audio to make, that context was
abandoned: what is queued of it is dropped at once (as the live socket's clear does) and it gets its
`isFinal`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.audio.encoder import AudioEncoder, LameEncoder, create_encoder
from api.audio.formats import AudioFormat
from api.audio.telephony import RawEncoder, RawEncoding, ResampledEncoder
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError, kind_of
from api.live.common import invalid_parameters, json_message
from api.live.contexts import Context, ContextProtocol
from api.live.protocol import CloseSession, SessionLink, Utterance, error_text
from api.live.transport import NORMAL_CLOSURE, Frame, Transport
from api.protocol import (
    MAX_SPEED,
    MIN_SPEED,
    InputTextAppend,
    InputTextFlush,
    LiveSession,
)
from api.speech.captions import WordTime
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService

# ElevenLabs' voice ids are 20 letters and digits (21m00Tcm4TlvDq8ikWAM): they stand for the server's default
# voice. Any voice this server knows (af_heart, an OpenAI name, a mix) picks that one.
ELEVENLABS_VOICE_ID = re.compile(r"[A-Za-z0-9]{20}")
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
MP3_FORMATS = {(22050, 32), (44100, 32), (44100, 64), (44100, 96), (44100, 128), (44100, 192)}
MEDIA_TYPES = {"pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic", "mp3": "audio/mpeg"}


@dataclass(frozen=True)
class OutputFormat:
    """ElevenLabs' `output_format`: codec_rate[_kbps]."""

    codec: str
    rate: int
    kbps: int | None = None

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.codec]

    def encoder(self, source_rate: int) -> AudioEncoder:
        if self.codec == "pcm":
            return RawEncoder(RawEncoding.LINEAR16, self.rate, source_rate)
        if self.codec in ("ulaw", "alaw"):
            return RawEncoder(
                RawEncoding.MULAW if self.codec == "ulaw" else RawEncoding.ALAW, self.rate, source_rate
            )
        assert self.kbps is not None
        if self.rate == source_rate:
            return create_encoder(AudioFormat.MP3, source_rate, streaming=True, mp3_kbps=self.kbps)
        return ResampledEncoder(LameEncoder(self.rate, kbps=self.kbps, quality=7), self.rate, source_rate)


def output_format(name: str) -> OutputFormat:
    """`pcm_16000`, `ulaw_8000`, `mp3_44100_128`, ...; InvalidRequestError for what is not offered."""
    parts = name.split("_")
    try:
        codec, rate, kbps = parts[0], int(parts[1]), (int(parts[2]) if len(parts) == 3 else None)
    except (IndexError, ValueError):
        codec, rate, kbps = "", 0, None
    offered = (
        (codec == "pcm" and kbps is None and rate in PCM_RATES)
        or (codec in ("ulaw", "alaw") and kbps is None and rate == 8000)
        or (codec == "mp3" and (rate, kbps) in MP3_FORMATS)
    )
    if not offered or len(parts) > 3:
        message = (
            f"output_format {name!r} is not offered: pcm_{{{','.join(map(str, PCM_RATES))}}}, ulaw_8000, "
            "alaw_8000, mp3_22050_32, mp3_44100_{32,64,96,128,192}."
        )
        raise InvalidRequestError(message, param="output_format", code="invalid_output_format")
    return OutputFormat(codec, rate, kbps)


def voice_of(voice_id: str) -> str | None:
    return None if ELEVENLABS_VOICE_ID.fullmatch(voice_id) else voice_id


class StreamParams(BaseModel):
    """The query of the WebSockets and POSTs (ElevenLabs' names); what this server has no use for is
    ignored (model_id, enable_logging, inactivity_timeout, auto_mode, sync_alignment, ...)."""

    model_config = ConfigDict(extra="ignore")

    output_format: str = DEFAULT_OUTPUT_FORMAT


def stream_params(query: Mapping[str, str], default_format: str = DEFAULT_OUTPUT_FORMAT) -> OutputFormat:
    try:
        params = StreamParams.model_validate({"output_format": default_format, **dict(query)})
    except ValidationError as exc:
        raise invalid_parameters(exc) from None
    return output_format(params.output_format)


class VoiceSettings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)


class SpeechBody(BaseModel):
    """The POSTs' body: ElevenLabs' fields this server reads (the rest are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field(..., min_length=1, description="The text to speak.")
    model_id: str | None = None
    voice_settings: VoiceSettings | None = None


class ElevenLabsProtocol(ContextProtocol):
    """ElevenLabs' stream-input (`multi=False`: one stream, no context ids) and multi-stream-input sockets
    over a live session (see the module docstring)."""

    def __init__(self, voice: str | None, fmt: OutputFormat, *, multi: bool) -> None:
        super().__init__()
        self.voice = voice
        self.format = fmt
        self.multi = multi
        self.ended = False  # stream-input: the empty text that ends the stream was sent

    def session(self) -> LiveSession:
        # The words' timings become the alignment of each audio message.
        return LiveSession(voice=self.voice, response_format="pcm", return_timestamps=True)

    def events(self, frame: Frame) -> list[BaseModel]:
        body = json_message(frame)
        if body.get("close_socket"):
            return [CloseSession()]
        context_id = body.get("context_id") if self.multi else None
        if self.multi and not isinstance(context_id, str):
            context_id = "default"  # ElevenLabs' own default context
        if body.get("close_context"):
            context = self.find(context_id)
            return self.close(context) if context is not None else []
        text = body.get("text")
        if text is None:
            if body.get("flush"):
                return [InputTextFlush(type="input_text.flush")]
            needed = "A message needs text, flush, close_context or close_socket."
            raise InvalidRequestError(needed, code="invalid_event")
        if not isinstance(text, str):
            raise InvalidRequestError("text must be a string.", param="text", code="invalid_event")
        return self._text(context_id, text, bool(body.get("flush")))

    def _text(self, context_id: str | None, text: str, flush: bool) -> list[BaseModel]:
        events: list[BaseModel] = []
        context = self.current(context_id)
        if context is None:
            if text == "":  # a keep-alive for a context not open here: nothing to do
                return []
            # A closed context still speaking when a new one opens: the client has moved on (barge-in).
            if any(pending.closed for pending in self.pending):
                events += self.abandon()
            events += self.open(context_id)
            context = self.pending[-1]
        if text == "" and not self.multi:
            self.ended = True  # stream-input's end of stream: speak the rest, isFinal, close
            return [*events, *self.close(context)]
        if text.strip():
            events.append(InputTextAppend(type="input_text.append", text=text))
        if flush:
            events.append(InputTextFlush(type="input_text.flush"))
        return events

    def encoder(self, speech: SpeechService, config: LiveSession) -> OffLoopEncoder:
        return speech.offloop(self.format.encoder(speech.sample_rate))

    async def audio(
        self, session: SessionLink, utterance: Utterance, data: bytes, words: list[WordTime], last: bool
    ) -> None:
        context = self.context_of(utterance)
        alignment = _alignment(context, words)
        message: dict[str, Any] = {
            "audio": base64.b64encode(data).decode("ascii") if data else None,
            "alignment": alignment,
            "normalizedAlignment": alignment,
            "isFinal": None,
        }
        if context.id is not None:
            message["contextId"] = context.id
        await session.send_json(message)

    async def final(self, session: SessionLink, context: Context, *, abandoned: bool) -> None:
        final: dict[str, Any] = {"isFinal": True}
        if context.id is not None:
            final["contextId"] = context.id
        await session.send_json(final)
        if self.ended and not self.pending:
            await session.close(NORMAL_CLOSURE, "end of stream")

    async def error(self, session: SessionLink, exc: APIError) -> None:
        await session.send_json(error_message(exc))

    async def refuse(self, transport: Transport, exc: ServiceUnavailableError) -> None:
        await transport.send_json(error_message(exc))


def _alignment(context: Context, words: list[WordTime]) -> dict[str, list[Any]] | None:
    """Each word's characters spread over its time, a space between words; times in ms from the end of the
    context's previous alignment (where this message's audio starts, as far as its words tell)."""
    if not words:
        return None
    chars: list[str] = []
    starts: list[int] = []
    durations: list[int] = []
    origin = context.chars_end_ms
    for index, word in enumerate(words):
        start_ms, end_ms = word.start_time * 1000, word.end_time * 1000
        if index or origin:
            chars.append(" ")
            starts.append(round(max(start_ms - origin, 0)))
            durations.append(0)
        step = (end_ms - start_ms) / max(len(word.word), 1)
        for position, char in enumerate(word.word):
            chars.append(char)
            starts.append(round(start_ms + position * step - origin))
            durations.append(round(step))
    context.chars_end_ms = origin + starts[-1] + durations[-1]
    return {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}


def error_message(exc: APIError) -> dict[str, Any]:
    """ElevenLabs' socket error: `error` (a code), `message`; the server's code and message."""
    return {"error": exc.code or kind_of(exc).type, "message": error_text(exc), "code": exc.code}
