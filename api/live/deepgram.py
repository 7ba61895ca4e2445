"""Deepgram's streaming speech (Aura): `/v1/speak` as a WebSocket and as POST, for the voice-agent
frameworks' Deepgram plugins pointed at this server (docs/api.md#voice-agents).

Over the socket the client sends `{"type": "Speak", "text"}`, `Flush` (speak what was sent; answered with
`Flushed` once its audio is out), `Clear` (barge-in; answered with `Cleared`) and `Close` (close now, as
Deepgram's own server does: what is queued is dropped); the server sends
the audio as binary frames in the URL's `encoding` at its `sample_rate`, a `Metadata` message at the start,
and `Warning` or `Error` messages. Each Flush ends one utterance of the live session underneath
(api/live/session.py), which does the splitting, admission, synthesis and barge-in.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.audio.telephony import RawEncoding
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError
from api.live.common import invalid_parameters, json_message
from api.live.protocol import CloseSession, LiveProtocol, SessionLink, Utterance, error_text
from api.live.transport import Frame, Transport
from api.protocol import MAX_SPEED, MIN_SPEED, InputTextAppend, InputTextClear, InputTextDone, LiveSession
from api.speech.captions import WordTime
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService

# Deepgram's own voices are models named aura-<voice>-<language> (aura-2-thalia-en, ...): they stand for
# the server's default voice. Any voice this server knows (af_heart, an OpenAI name, a mix) picks that one.
DEEPGRAM_MODEL_PREFIX = "aura"
# The rates Deepgram offers per encoding; 22050 and 44100 too, as ElevenLabs' clients ask for them.
SAMPLE_RATES: dict[RawEncoding, tuple[int, ...]] = {
    RawEncoding.LINEAR16: (8000, 16000, 22050, 24000, 32000, 44100, 48000),
    RawEncoding.MULAW: (8000, 16000),
    RawEncoding.ALAW: (8000, 16000),
}
DEFAULT_RATES = {RawEncoding.LINEAR16: 24000, RawEncoding.MULAW: 8000, RawEncoding.ALAW: 8000}
MEDIA_TYPES = {
    RawEncoding.LINEAR16: "audio/pcm",
    RawEncoding.MULAW: "audio/basic",
    RawEncoding.ALAW: "audio/x-alaw-basic",
}


class SpeakParams(BaseModel):
    """The query of `/v1/speak` (Deepgram's names); parameters this server has no use for are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field("aura-2-thalia-en", description="A Deepgram model (the default voice) or a voice.")
    encoding: RawEncoding = RawEncoding.LINEAR16
    sample_rate: int | None = None
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    container: Literal["none", "wav"] = "none"

    @property
    def rate(self) -> int:
        return self.sample_rate or DEFAULT_RATES[self.encoding]

    @property
    def voice(self) -> str | None:
        return None if self.model.startswith(DEEPGRAM_MODEL_PREFIX) else self.model


def speak_params(query: Mapping[str, str]) -> SpeakParams:
    """The query, validated; InvalidRequestError names what is wrong."""
    try:
        params = SpeakParams.model_validate(dict(query))
    except ValidationError as exc:
        raise invalid_parameters(exc) from None
    if params.rate not in SAMPLE_RATES[params.encoding]:
        rates = ", ".join(str(rate) for rate in SAMPLE_RATES[params.encoding])
        message = f"sample_rate {params.rate} is not offered for {params.encoding.value}: one of {rates}."
        raise InvalidRequestError(message, param="sample_rate", code="invalid_sample_rate")
    if params.container == "wav" and params.encoding is not RawEncoding.LINEAR16:
        raise InvalidRequestError(
            "container=wav is offered for linear16 only.", param="container", code="invalid_container"
        )
    return params


class DeepgramProtocol(LiveProtocol):
    """Deepgram's TTS WebSocket over a live session: Speak appends, Flush ends an utterance (Flushed when
    its audio is out), Clear is barge-in, Close closes at once."""

    def __init__(self, params: SpeakParams) -> None:
        self.params = params
        self.request_id = str(uuid.uuid4())
        self.flushes = 0  # Flush messages received: the sequence_id of the next Flushed
        self.flushed = 0

    def subprotocol(self, offered: Sequence[str]) -> str | None:
        return None

    def session(self) -> LiveSession:
        return LiveSession(voice=self.params.voice, speed=self.params.speed, response_format="pcm")

    async def opened(self, session: SessionLink) -> None:
        metadata = {
            "type": "Metadata",
            "request_id": self.request_id,
            "model_name": self.params.model,
            "model_version": "kokoro-82m",
            "model_uuid": self.request_id,
        }
        await session.send_json(metadata)

    def events(self, frame: Frame) -> list[BaseModel]:
        body = json_message(frame)
        kind = body.get("type")
        if kind == "Speak":
            text = body.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError("Speak needs a text string.", param="text", code="invalid_event")
            return [InputTextAppend(type="input_text.append", text=text)]
        if kind == "Flush":
            self.flushes += 1
            return [InputTextDone(type="input_text.done")]
        if kind == "Clear":
            return [InputTextClear(type="input_text.clear")]
        if kind == "Close":
            return [CloseSession()]
        raise InvalidRequestError(
            f"Unknown message type {kind!r}: Speak, Flush, Clear or Close.",
            param="type",
            code="invalid_event",
        )

    def encoder(self, speech: SpeechService, config: LiveSession) -> OffLoopEncoder:
        return speech.raw_encoder(self.params.encoding, self.params.rate)

    async def audio(
        self, session: SessionLink, utterance: Utterance, data: bytes, words: list[WordTime], last: bool
    ) -> None:
        if data:
            await session.send_bytes(data)

    async def done(self, session: SessionLink, utterance: Utterance) -> None:
        await session.send_json({"type": "Flushed", "sequence_id": self.flushed})
        self.flushed += 1

    async def cleared(self, session: SessionLink) -> None:
        # The flushes the clear dropped get no Flushed: the client has stopped waiting for them.
        self.flushed = self.flushes
        await session.send_json({"type": "Cleared", "sequence_id": max(self.flushes - 1, 0)})

    async def updated(self, session: SessionLink, config: LiveSession) -> None:
        raise AssertionError("Deepgram's protocol has no session update")

    async def error(self, session: SessionLink, exc: APIError) -> None:
        await session.send_json(warning(exc))

    async def refuse(self, transport: Transport, exc: ServiceUnavailableError) -> None:
        await transport.send_json(warning(exc, kind="Error"))


def warning(exc: APIError, kind: str = "Warning") -> dict[str, Any]:
    """Deepgram's Warning (or Error) message for an error of the session."""
    description = error_text(exc)
    return {"type": kind, "description": description, "code": exc.code, "warn_msg": description}
