"""What a live client's messages mean and how a session's results go back to it: `LiveProtocol`, the
server's own protocol (docs/api.md#live-text), which each vendor's (api/live/deepgram.py, elevenlabs.py,
cartesia.py, wyoming.py, and contexts.py beneath the last two) overrides where it differs. The session
(api/live/session.py) calls a protocol with the `Utterance` it is speaking and, as a `SessionLink`, itself:
a protocol sends through it and never synthesizes, queues or admits anything itself.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, TypeAdapter, ValidationError

from api.audio.formats import AudioFormat
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError, kind_of
from api.live.transport import Frame, Transport, live_subprotocol
from api.protocol import (
    ErrorDetail,
    ErrorEvent,
    InputTextAppend,
    InputTextClear,
    InputTextCleared,
    InputTextDone,
    InputTextFlush,
    LiveClientEvent,
    LiveSession,
    SessionUpdate,
    SessionUpdated,
    SpeechAudioDelta,
    SpeechAudioDone,
    Usage,
    WordTimestamp,
)
from api.speech.admission import AdmissionController
from api.speech.captions import WordTime
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService

CLIENT_EVENTS: TypeAdapter[LiveClientEvent] = TypeAdapter(LiveClientEvent)
# Where a validation error is, less the event's type that pydantic puts first.
EVENT_TYPES = frozenset(
    model.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
    for model in (SessionUpdate, InputTextAppend, InputTextFlush, InputTextClear, InputTextDone)
)


@dataclass(eq=False)
class Utterance:
    """The text from a session's first append to its input_text.done (or clear), and the audio made of it
    so far: one encoder, one admission slot, its timings counted from its first sample."""

    number: int
    config: LiveSession
    encoder: OffLoopEncoder | None = None
    admitted_at: float | None = None
    refused: bool = False
    phrases: int = 0
    samples_out: int = 0
    usage: Usage = field(default_factory=Usage)
    words: list[WordTime] = field(default_factory=list)  # timings complete, waiting for audio to go with
    completed_at: float | None = None  # when its first phrase was complete
    sent_audio: bool = False

    def close(self, admission: AdmissionController) -> None:
        if self.admitted_at is not None:
            admission.release(self.admitted_at)
            self.admitted_at = None
        if self.encoder is not None:
            self.encoder.close()
            self.encoder = None


class SessionLink(Protocol):
    """What a protocol may do with the session it serves (api/live/session.py's `Session`): send to the
    client and close the connection."""

    async def send_event(self, event: BaseModel) -> None: ...

    async def send_json(self, body: Mapping[str, Any]) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class CloseSession(BaseModel):
    """A vendor protocol's "close now" (Deepgram's Close): what is queued is dropped, the socket closes."""


class ProtocolRequest(BaseModel):
    """A vendor protocol's own request, which the protocol answers itself in order with the session's other
    events (Wyoming's describe and ping): `LiveProtocol.answer`."""


class LiveProtocol:
    """What a live client's messages mean and how a session's results go back to it. This class is the
    server's own protocol (docs/api.md#live-text); a vendor's (api/live/) overrides what differs. The
    session calls it; it never synthesizes, queues or admits anything itself."""

    def subprotocol(self, offered: Sequence[str]) -> str | None:
        """The subprotocol to accept the connection with, of those the client offered."""
        return live_subprotocol(offered)

    def session(self) -> LiveSession:
        """The session's settings before any update (a vendor's come from the URL)."""
        return LiveSession()

    async def opened(self, session: SessionLink) -> None:
        """Once the socket is accepted, before the first message."""

    def events(self, frame: Frame) -> list[BaseModel]:
        """The session events one client message stands for; InvalidRequestError when it stands for none."""
        if frame.text is None:
            raise InvalidRequestError("Send events as JSON text frames.", code="invalid_event")
        try:
            return [CLIENT_EVENTS.validate_json(frame.text)]
        except ValidationError as exc:
            raise _invalid_event(exc) from None

    def encoder(self, speech: SpeechService, config: LiveSession) -> OffLoopEncoder:
        return speech.encoder(AudioFormat(config.response_format))

    async def audio(
        self, session: SessionLink, utterance: Utterance, data: bytes, words: list[WordTime], last: bool
    ) -> None:
        """A piece of an utterance's audio and the words it completes (both may be empty when `last`)."""
        timestamps = None
        if utterance.config.return_timestamps:
            timestamps = [WordTimestamp(**vars(word)) for word in words]
        audio = base64.b64encode(data).decode("ascii")
        await session.send_event(SpeechAudioDelta(audio=audio, timestamps=timestamps))

    async def done(self, session: SessionLink, utterance: Utterance) -> None:
        """All of an utterance's audio has been sent."""
        await session.send_event(SpeechAudioDone(usage=utterance.usage))

    async def cleared(self, session: SessionLink) -> None:
        await session.send_event(InputTextCleared())

    async def updated(self, session: SessionLink, config: LiveSession) -> None:
        await session.send_event(SessionUpdated(session=config))

    async def error(self, session: SessionLink, exc: APIError) -> None:
        await session.send_event(_error_event(exc))

    async def answer(self, session: SessionLink, request: ProtocolRequest) -> None:
        """A protocol's own request (the server's protocol has none)."""
        raise AssertionError(f"no answer for {request!r}")

    async def refuse(self, transport: Transport, exc: ServiceUnavailableError) -> None:
        """Tells a client whose session is refused why, before the connection closes with 1013."""
        await transport.send_text(_error_event(exc).model_dump_json())


def error_text(exc: APIError) -> str:
    """An error's message for a socket's client, which has no Retry-After header: the wait is in the text."""
    message = exc.message
    if isinstance(exc, ServiceUnavailableError) and "retry" not in message.lower():
        message += f" Retry after {exc.retry_after} s."
    return message


def _error_event(exc: APIError) -> ErrorEvent:
    detail = ErrorDetail(message=error_text(exc), type=kind_of(exc).type, param=exc.param, code=exc.code)
    return ErrorEvent(error=detail)


def _invalid_event(exc: ValidationError) -> InvalidRequestError:
    first = exc.errors()[0]
    loc = first["loc"][1:] if first["loc"][:1] and first["loc"][0] in EVENT_TYPES else first["loc"]
    where = ".".join(str(part) for part in loc)
    message = f"Invalid event: {first['msg']}" + (f" (at {where})." if where else ".")
    return InvalidRequestError(message, param=where or None, code="invalid_event")
