"""The Wyoming protocol's text-to-speech service (Home Assistant's voice assistants), over TCP beside the
HTTP port when KOKORO_WYOMING is on (docs/api.md#home-assistant).

A client sends `describe` (answered with `info`: one TTS program and every voice this server has, with
its locale), `synthesize` (a whole text: answered `audio-start`, `audio-chunk`s as the audio is made,
`audio-stop`), or a stream: `synthesize-start`, `synthesize-chunk`s as an LLM writes the text, and
`synthesize-stop`, answered with audio phrase by phrase as each is ready and `synthesize-stopped` at the
end. Each synthesize (or stream) is one utterance of the live session underneath (api/live/session.py), which
does the splitting, admission, synthesis and limits, as for the WebSocket protocols; the connection is the
session's transport (`WyomingTransport`), as a WebSocket is theirs.

Events are read with bounds (the header line, the data and the payload each have a limit) so that a bad
client gets an `error` event and its connection closed, never a worker stuck on it. The protocol has no
authentication: the service listens on loopback unless KOKORO_WYOMING_HOST says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, write_event
from wyoming.info import Attribution, Describe, Info, SelectProgram, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from api import __version__
from api.audio.telephony import RawEncoding
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError
from api.live.protocol import LiveProtocol, ProtocolRequest, SessionLink, Utterance, error_text
from api.live.session import LiveService
from api.live.transport import Frame, Transport
from api.protocol import InputTextAppend, InputTextDone, InputTextFlush, LiveSession, SessionUpdate
from api.settings import Settings
from api.speech.captions import WordTime
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService
from api.text.live_split import ends_sentence

logger = logging.getLogger(__name__)

# The locale each voice's first letter stands for (af_heart is American English, not Afrikaans).
LOCALES = {
    "a": "en-US",
    "b": "en-GB",
    "j": "ja",
    "z": "zh",
    "e": "es",
    "f": "fr",
    "h": "hi",
    "i": "it",
    "p": "pt-BR",
}
# The longest header line read (asyncio's StreamReader limit): more is a client to close.
MAX_HEADER_BYTES = 64 * 1024
# The largest payload a TTS client has a reason to send (none do; an audio chunk would be small).
MAX_PAYLOAD_BYTES = 1024 * 1024
# Audio goes out in chunks of this many samples (about 85 ms at 24 kHz), as Wyoming's own servers send it.
CHUNK_SAMPLES = 2048
PROGRAM = "kokoro"  # the one TTS program in `info`
# How much of a stream's text is kept to see whether a chunk ends a sentence.
TAIL_CHARS = 64
ATTRIBUTION = Attribution(name="hexgrad", url="https://huggingface.co/hexgrad/Kokoro-82M")
# A connection closed by the server reads (and drops) what its client still sends for this long after its
# last event, so that unread bytes never turn the close into a reset that takes that last event with it.
LINGER_S = 2.0


class WyomingRequest(ProtocolRequest):
    """A request the protocol answers itself: describe (info) or ping (pong)."""

    kind: str
    text: str | None = None


class BrokenStream(Exception):
    """The client's bytes no longer frame events (a header over the limit, a payload length that lies):
    the connection is told why and closed."""


class WyomingTransport:
    """A `Transport` over one client's TCP connection: each event it reads is a frame whose text is the
    event as JSON (its header's `type` and its data) and whose data is its payload; what it sends is written
    as is (`encoded` events). A line that is no event is an InvalidRequestError, and the next line is read
    as an event again; bytes that no longer frame events (a broken stream) are one too, and end the
    connection."""

    subprotocols: Sequence[str] = ()

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_data_bytes: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_data_bytes = max_data_bytes
        self._broken: str | None = None

    async def accept(self, subprotocol: str | None) -> None:
        """Nothing to accept: the connection is open."""

    async def receive(self) -> Frame | None:
        if self._broken is not None:
            return None
        try:
            return await self._read()
        except BrokenStream as exc:
            self._broken = str(exc)
            raise InvalidRequestError(str(exc), code="invalid_event") from None
        except ValueError as exc:  # the line was read whole: the next one is an event again
            raise InvalidRequestError(str(exc), code="invalid_event") from None
        except (EOFError, asyncio.IncompleteReadError, ConnectionError):
            return None

    async def _read(self) -> Frame:
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise BrokenStream(f"An event's header line may be {MAX_HEADER_BYTES} bytes at most.") from None
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise BrokenStream("The connection ended inside an event.") from None
            raise EOFError from None
        header = _json_object(line, "header")
        data_length = _length(header, "data_length", self.max_data_bytes)
        payload_length = _length(header, "payload_length", MAX_PAYLOAD_BYTES)
        # The event's bytes are read whole before its fields are judged, so that the next event is read
        # from its own first byte even where this one is refused.
        try:  # cancelled midway (the session's idle rule), the stream is out of step: close it then
            extra = await self.reader.readexactly(data_length) if data_length else None
            payload = await self.reader.readexactly(payload_length) if payload_length else None
        except asyncio.CancelledError:
            self._broken = "cancelled inside an event"
            raise
        kind = header.get("type")
        data = header.get("data") or {}
        if extra is not None:
            extra_data = _json_object(extra, "data", fatal=True)
            if isinstance(data, dict):
                data.update(extra_data)
        if not isinstance(kind, str):
            raise ValueError("An event needs a `type` string.")
        if not isinstance(data, dict):
            raise ValueError("An event's `data` must be a JSON object.")
        return Frame(text=json.dumps({"type": kind, "data": data}), data=payload)

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_text(self, text: str) -> None:
        """A TCP stream has no frames: a text goes out as its UTF-8 bytes."""
        await self.send_bytes(text.encode())

    async def send_json(self, body: Mapping[str, Any]) -> None:
        await self.send_text(json.dumps(body))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Closes the connection in order (a TCP stream has no close code): the last events sent, then the
        end of the stream, then what the client still sends read and dropped until it closes its side, for
        LINGER_S at most. A socket closed with unread bytes in it is reset, and a reset can reach the client
        before the events it had not read yet (a refusal's error, the answer to a bad event), which are then
        lost to it."""
        writer = self.writer
        if writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, OSError, TimeoutError, asyncio.TimeoutError):
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            await asyncio.wait_for(self._drop_input(), LINGER_S)  # asyncio.timeout is 3.11's
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()

    async def _drop_input(self) -> None:
        while await self.reader.read(65536):
            pass


def _length(header: Mapping[str, Any], key: str, limit: int) -> int:
    value = header.get(key) or 0
    if not isinstance(value, int) or value < 0:
        raise BrokenStream(f"`{key}` must be a whole number of bytes.")
    if value > limit:
        raise BrokenStream(f"`{key}` is {value} bytes; at most {limit} are taken.")
    return value


def _json_object(text: bytes, what: str, fatal: bool = False) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        message = f"An event's {what} must be a JSON object."
        raise BrokenStream(message) if fatal else ValueError(message)
    return value


def encoded(event: Event) -> bytes:
    """An event as the protocol frames it on the wire (header line, data, payload)."""
    frames = io.BytesIO()
    write_event(event, frames)
    return frames.getvalue()


def voice_locale(name: str) -> str | None:
    """A Kokoro voice name's locale (af_heart: en-US); None for a name outside the scheme."""
    if len(name) > 2 and name[2] == "_":
        return LOCALES.get(name[0])
    return None


class WyomingProtocol(LiveProtocol):
    """Wyoming's TTS events over a live session: a `synthesize` is one utterance, a stream another."""

    def __init__(self, speech: SpeechService, settings: Settings, voices: Callable[[], list[str]]) -> None:
        self.speech = speech
        self.settings = settings
        self.voices = voices
        self.rate = settings.wyoming_sample_rate
        self.streaming = False
        self._tail = ""  # the stream's last characters, to see where a sentence ends
        self._ends: deque[bool] = deque()  # per utterance ended, in order: whether it was a stream
        self._started: set[int] = set()  # utterances whose audio-start is sent

    def subprotocol(self, offered: Sequence[str]) -> str | None:
        return None

    def session(self) -> LiveSession:
        return LiveSession(response_format="pcm")

    def events(self, frame: Frame) -> list[BaseModel]:
        event = _event(frame)
        try:
            return self._events(event)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"Invalid {event.type} event: {exc}.", code="invalid_event") from None

    def _events(self, event: Event) -> list[BaseModel]:
        if Describe.is_type(event.type):
            return [WyomingRequest(kind="describe")]
        if SelectProgram.is_type(event.type):  # sent by newer clients after connecting
            name = SelectProgram.from_event(event).name
            if name != PROGRAM:
                raise InvalidRequestError(
                    f"No program {name!r}: this server's TTS program is {PROGRAM!r}.",
                    param="name",
                    code="program_not_found",
                )
            return []
        if Ping.is_type(event.type):
            return [WyomingRequest(kind="ping", text=Ping.from_event(event).text)]
        if Synthesize.is_type(event.type):
            if self.streaming:  # sent inside a stream for older servers, with the stream's whole text
                return []
            synthesize = Synthesize.from_event(event)
            voice = self._voice(synthesize.voice)
            self._check_text(synthesize.text)
            self._ends.append(False)
            return [self._update(voice), _append(synthesize.text), InputTextDone(type="input_text.done")]
        if SynthesizeStart.is_type(event.type):
            voice = self._voice(SynthesizeStart.from_event(event).voice)
            self.streaming = True
            self._tail = ""
            return [self._update(voice)]
        if SynthesizeChunk.is_type(event.type):
            if not self.streaming:
                raise InvalidRequestError(
                    "synthesize-chunk comes after synthesize-start.", code="invalid_event"
                )
            text = SynthesizeChunk.from_event(event).text
            self._tail = (self._tail + text)[-TAIL_CHARS:]
            if ends_sentence(self._tail):  # a whole sentence: spoken now, not once the next word shows
                return [_append(text), InputTextFlush(type="input_text.flush")]
            return [_append(text)]
        if SynthesizeStop.is_type(event.type):
            if not self.streaming:
                raise InvalidRequestError(
                    "synthesize-stop comes after synthesize-start.", code="invalid_event"
                )
            self.streaming = False
            self._ends.append(True)
            return [InputTextDone(type="input_text.done")]
        raise InvalidRequestError(
            f"Unknown event {event.type!r}: describe, synthesize, synthesize-start, synthesize-chunk, "
            "synthesize-stop, select-program or ping.",
            code="invalid_event",
        )

    def _voice(self, voice: Any) -> str | None:
        """The voice a synthesize asks for: by name, by language (the default voice if it speaks it, else
        the first that does), or the default (None); InvalidRequestError for one this server has not."""
        if voice is None:
            return None
        if voice.name:
            try:
                self.speech.check_voice(voice.name, None)
            except APIError as exc:
                raise InvalidRequestError(exc.message, param="voice", code="voice_not_found") from None
            return str(voice.name)
        if voice.language:
            wanted = voice.language.replace("_", "-").lower()
            names = [self.settings.default_voice, *self.voices()]
            for exact in (True, False):
                for name in names:
                    locale = (voice_locale(name) or "").lower()
                    if locale and (
                        locale == wanted if exact else locale.split("-")[0] == wanted.split("-")[0]
                    ):
                        return name
            raise InvalidRequestError(
                f"No voice speaks {voice.language}.", param="voice.language", code="voice_not_found"
            )
        return None

    def _check_text(self, text: str) -> None:
        limit = self.settings.max_input_chars
        if len(text) > limit:
            raise InvalidRequestError(
                f"The text is {len(text)} characters; at most {limit} are taken.",
                param="text",
                code="input_too_long",
            )

    def _update(self, voice: str | None) -> SessionUpdate:
        return SessionUpdate(type="session.update", session=LiveSession(voice=voice, response_format="pcm"))

    def info(self) -> Info:
        voices = [
            TtsVoice(
                name=name,
                attribution=ATTRIBUTION,
                installed=True,
                description=name,
                version=None,
                languages=[locale] if (locale := voice_locale(name)) else [],
            )
            for name in self.voices()
        ]
        program = TtsProgram(
            name=PROGRAM,
            attribution=ATTRIBUTION,
            installed=True,
            description="Kokoro-82M (kokoro-openai-server)",
            version=__version__,
            voices=voices,
            supports_synthesize_streaming=True,
        )
        return Info(tts=[program])

    async def answer(self, session: SessionLink, request: ProtocolRequest) -> None:
        assert isinstance(request, WyomingRequest)
        reply = self.info().event() if request.kind == "describe" else Pong(text=request.text).event()
        await send(session, reply)

    def encoder(self, speech: SpeechService, config: LiveSession) -> OffLoopEncoder:
        return speech.raw_encoder(RawEncoding.LINEAR16, self.rate)

    async def audio(
        self, session: SessionLink, utterance: Utterance, data: bytes, words: list[WordTime], last: bool
    ) -> None:
        if not data:
            return
        await self._start(session, utterance)
        step = 2 * CHUNK_SAMPLES
        for at in range(0, len(data), step):
            chunk = AudioChunk(rate=self.rate, width=2, channels=1, audio=data[at : at + step])
            await send(session, chunk.event())

    async def _start(self, session: SessionLink, utterance: Utterance) -> None:
        if utterance.number not in self._started:
            self._started.add(utterance.number)
            await send(session, AudioStart(rate=self.rate, width=2, channels=1).event())

    async def done(self, session: SessionLink, utterance: Utterance) -> None:
        await self._start(session, utterance)  # an utterance with no audio is still one
        self._started.discard(utterance.number)
        await send(session, AudioStop().event())
        if self._ends and self._ends.popleft():
            await send(session, SynthesizeStopped().event())

    async def cleared(self, session: SessionLink) -> None:
        raise AssertionError("Wyoming has no clear")

    async def updated(self, session: SessionLink, config: LiveSession) -> None:
        """The voice is set for the next utterance: nothing to tell the client."""

    async def error(self, session: SessionLink, exc: APIError) -> None:
        await send(session, Error(text=error_text(exc), code=exc.code).event())

    async def refuse(self, transport: Transport, exc: ServiceUnavailableError) -> None:
        await transport.send_bytes(encoded(Error(text=error_text(exc), code=exc.code).event()))


async def send(session: SessionLink, event: Event) -> None:
    await session.send_bytes(encoded(event))


def _event(frame: Frame) -> Event:
    """The event a frame of `WyomingTransport` carries."""
    assert frame.text is not None
    header = json.loads(frame.text)
    return Event(header["type"], header["data"], frame.data)


def _append(text: str) -> InputTextAppend:
    return InputTextAppend(type="input_text.append", text=text)


class WyomingServer:
    """The TCP service: each connection a live session with the Wyoming protocol. Built in create_app,
    started and stopped with the app (each worker process listens on the same port: SO_REUSEPORT)."""

    def __init__(self, live: LiveService, voices: Callable[[], list[str]]) -> None:
        self.live = live
        self.speech = live.speech
        self.settings = live.settings
        self.voices = voices
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        settings = self.settings
        self._server = await asyncio.start_server(
            self._connected,
            host=settings.wyoming_host,
            port=settings.wyoming_port,
            reuse_port=True,
            limit=MAX_HEADER_BYTES,
        )
        logger.info("Wyoming TTS on %s:%d (tcp)", settings.wyoming_host, settings.wyoming_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        transport = WyomingTransport(reader, writer, self.settings.live_max_message_bytes)
        try:
            protocol = WyomingProtocol(self.speech, self.settings, self.voices)
            await self.live.serve(transport, protocol)
        except Exception:
            logger.exception("Wyoming connection failed")
        finally:
            self._connections.discard(task)
            await transport.close()
