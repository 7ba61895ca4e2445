"""Live speech over one WebSocket (/v1/audio/speech/live): text in as an LLM writes it, audio out as it is
made, in the events of the SSE stream (docs/api.md#live-text).

The session's reader takes the client's events and cuts the text into phrases (api/text/live_split.py);
its speaker task synthesizes each phrase through the SpeechService (phrases already waiting are spoken as
one) and sends the audio, one encoder per utterance. A clear cancels the speaker: the chunks it had
scheduled are cancelled and taken out of the engine's queue at once.

What the client's messages mean and how results go back is the session's `LiveProtocol`
(api/live/protocol.py): the server's own (the events above) or a vendor's (api/live/: Deepgram's,
ElevenLabs', Cartesia's and Wyoming's), each a thin adapter over the same session, splitter, admission,
limits, metrics and barge-in. What carries them is
its `Transport` (api/live/transport.py): a WebSocket (api/live/websocket.py) or Wyoming's TCP stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any

if sys.version_info >= (3, 11):
    from asyncio import timeout as time_limit
else:  # the same context manager, from the backport asyncio's was made from
    from async_timeout import timeout as time_limit

from pydantic import BaseModel

from api.audio.formats import AudioFormat
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError, SynthesisError
from api.live.protocol import CloseSession, LiveProtocol, ProtocolRequest, Utterance
from api.live.transport import (
    INTERNAL_ERROR,
    NORMAL_CLOSURE,
    TRY_AGAIN_LATER,
    Frame,
    Transport,
)
from api.metrics import Metrics
from api.protocol import (
    InputTextAppend,
    InputTextClear,
    InputTextDone,
    InputTextFlush,
    LiveSession,
    SessionUpdate,
    SpeechAudioDelta,
    SpeechRequest,
)
from api.settings import Settings
from api.speech.admission import AdmissionController, Overloaded
from api.speech.job import SpeechJob
from api.speech.planning import utterance_planner
from api.speech.service import SpeechService
from api.text.live_split import PhraseSplitter, SplitRules

logger = logging.getLogger(__name__)

# How long a barge-in waits for the speaker to take its cancellation before cancelling it again.
STOP_POLL_S = 0.1


class LiveService:
    """Admits live sessions (a bounded number per worker; none while the model is not ready or the speech
    requests' waiting line is full) and runs each one. Built once in create_app."""

    def __init__(
        self, settings: Settings, speech: SpeechService, admission: AdmissionController, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.speech = speech
        self.admission = admission
        self.metrics = metrics
        self.rules = SplitRules(
            clause_words=min(settings.live_clause_words, settings.live_max_words),
            max_words=settings.live_max_words,
        )
        self.first_planner = utterance_planner(settings)
        self.sessions = 0

    def refusal(self) -> ServiceUnavailableError | None:
        """Why a new session cannot start now, if it cannot."""
        if self.sessions >= self.settings.live_max_sessions:
            return ServiceUnavailableError(
                f"{self.sessions} live sessions are open, the most this server takes.",
                retry_after=self.admission.retry_after(),
            )
        admission = self.admission
        if admission.inflight >= admission.max_inflight and admission.waiting >= admission.max_waiting:
            return ServiceUnavailableError(
                "The server is overloaded (too many requests waiting).", retry_after=admission.retry_after()
            )
        try:
            self.speech.check_ready()
        except ServiceUnavailableError as exc:
            return exc
        return None

    async def serve(self, transport: Transport, protocol: LiveProtocol | None = None) -> None:
        """Runs one client's session over `transport` in `protocol` (the server's own when None), or tells
        the client why it is refused."""
        protocol = protocol or LiveProtocol()
        refusal = self.refusal()
        if refusal is not None:
            self.metrics.live_sessions_total.labels(outcome="refused").inc()
            await transport.accept(protocol.subprotocol(transport.subprotocols))
            with contextlib.suppress(OSError):
                await protocol.refuse(transport, refusal)
                await transport.close(TRY_AGAIN_LATER, f"retry after {refusal.retry_after} s")
            return
        self.metrics.live_sessions_total.labels(outcome="accepted").inc()
        self.sessions += 1
        self.metrics.live_sessions.set(self.sessions)
        try:
            await Session(self, transport, protocol).run()
        finally:
            self.sessions -= 1
            self.metrics.live_sessions.set(self.sessions)


class _Gone(Exception):
    """The client has gone: nothing more can be sent."""


class Session:
    """One live connection: reads the client's events, cuts its text into phrases, and runs the speaker task
    that turns them into audio events (see the module docstring). It talks to its client only through its
    `Transport` and its `LiveProtocol`."""

    def __init__(self, service: LiveService, transport: Transport, protocol: LiveProtocol) -> None:
        self.service = service
        self.settings = service.settings
        self.transport = transport
        self.protocol = protocol
        self.id = uuid.uuid4().hex[:12]
        self.config = protocol.session()
        self.splitter = PhraseSplitter(service.rules)
        self.utterance: Utterance | None = None  # the one taking text
        self.open: set[Utterance] = set()
        self._waiting: deque[tuple[Utterance, str | None]] = deque()  # phrases, and None for done
        self._wakeup = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._count = 0
        self._text_at = 0.0  # when text last arrived, for the idle rule
        self._idle_spoken = True  # whether the idle rule has had its turn since then
        self._speaker: asyncio.Task[None] | None = None

    async def run(self) -> None:
        await self.transport.accept(self.protocol.subprotocol(self.transport.subprotocols))
        logger.info("live session %s opened (%s)", self.id, type(self.protocol).__name__)
        self._speaker = asyncio.create_task(self._speak_all())
        try:
            await self.protocol.opened(self)
            await self._read()
        except _Gone:
            pass
        finally:
            await self._stop_speaker()
            self._close_all(end="closed")
            logger.info("live session %s closed", self.id)

    # --- the reader ---------------------------------------------------------------------------------------

    async def _read(self) -> None:
        idle_s = self.settings.live_session_idle_s
        last_message = time.monotonic()
        while True:
            now = time.monotonic()
            speak_at = self._text_at + self.settings.live_idle_ms / 1000
            deadline = last_message + idle_s if self._idle_spoken else min(speak_at, last_message + idle_s)
            try:
                frame = await asyncio.wait_for(self.transport.receive(), max(deadline - now, 0.0))
            except InvalidRequestError as exc:  # something arrived that is no frame: the client hears why
                last_message = time.monotonic()
                await self._error(exc)
                continue
            except asyncio.TimeoutError:
                if not self._idle_spoken and time.monotonic() >= speak_at:
                    self._idle_spoken = True
                    self._queue(self.splitter.idle())
                elif self._busy():
                    last_message = time.monotonic()
                elif time.monotonic() >= last_message + idle_s:
                    await self._close_idle(idle_s)
                    return
                continue
            if frame is None:
                return
            last_message = time.monotonic()
            await self._receive(frame)

    async def _receive(self, frame: Frame) -> None:
        try:
            events = self.protocol.events(frame)
        except InvalidRequestError as exc:
            await self._error(exc)
            return
        for event in events:
            await self._dispatch(event)

    async def _dispatch(self, event: BaseModel) -> None:
        if isinstance(event, InputTextAppend):
            await self._append(event.text)
        elif isinstance(event, InputTextFlush):
            self._queue(self.splitter.flush())
        elif isinstance(event, InputTextDone):
            self._queue(self.splitter.flush())
            self._waiting.append((self.utterance or self._start(), None))
            self._wakeup.set()
            self.utterance = None
        elif isinstance(event, InputTextClear):
            await self._clear()
        elif isinstance(event, SessionUpdate):
            await self._update(event)
        elif isinstance(event, CloseSession):
            await self._close_now()
        elif isinstance(event, ProtocolRequest):
            await self.protocol.answer(self, event)

    async def _append(self, text: str) -> None:
        waiting = sum(len(phrase or "") for _, phrase in self._waiting) + len(self.splitter.pending)
        limit = self.settings.live_max_pending_chars
        if waiting + len(text) > limit:
            message = f"{waiting} characters are waiting to be spoken; at most {limit} may wait."
            await self._error(InvalidRequestError(message, param="text", code="input_too_long"))
            return
        if self.utterance is None:
            self.utterance = self._start()
        self._text_at = time.monotonic()
        self._idle_spoken = False
        self._queue(self.splitter.append(text))

    def _start(self) -> Utterance:
        self._count += 1
        utterance = Utterance(self._count, self.config)
        self.open.add(utterance)
        return utterance

    def _queue(self, phrases: list[str]) -> None:
        if not phrases:
            return
        utterance = self.utterance or self._start()
        self.utterance = utterance
        if utterance.completed_at is None:
            utterance.completed_at = time.perf_counter()
        self._waiting.extend((utterance, phrase) for phrase in phrases)
        self._wakeup.set()

    async def _update(self, event: SessionUpdate) -> None:
        if self.utterance is not None:
            await self._error(
                InvalidRequestError(
                    "session.update applies between utterances: send input_text.done or input_text.clear "
                    "first.",
                    param="session",
                    code="utterance_in_progress",
                )
            )
            return
        merged = LiveSession.model_validate(
            {**self.config.model_dump(), **event.session.model_dump(exclude_unset=True)}
        )
        try:
            self.service.speech.prepare(_request(merged, "-"))
        except APIError as exc:
            await self._error(exc)
            return
        self.config = merged
        await self.protocol.updated(self, merged)

    async def _clear(self) -> None:
        """Barge-in: everything not yet sent is dropped, and its chunks leave the engine's queue."""
        dropped = await self._drop_all(end="cleared")
        logger.info("live session %s cleared (%d chunks taken out of the queue)", self.id, dropped)
        self._speaker = asyncio.create_task(self._speak_all())
        await self.protocol.cleared(self)

    async def _close_now(self) -> None:
        await self._drop_all(end="closed")
        await self.close(NORMAL_CLOSURE, "closed by the client")

    async def _drop_all(self, *, end: str) -> int:
        """Stops the speaker and drops every utterance; returns the chunks taken out of the engine's queue."""
        self.splitter.clear()
        await self._stop_speaker()
        self._close_all(end=end)
        return self.service.speech.scheduler.drop_cancelled()

    def _close_all(self, *, end: str) -> None:
        for utterance in self.open:
            utterance.close(self.service.admission)
            self.service.metrics.live_utterances.labels(end=end).inc()
        self.open.clear()
        self._waiting.clear()
        self.utterance = None

    async def _stop_speaker(self) -> None:
        speaker, self._speaker = self._speaker, None
        if speaker is None:
            return
        # Cancelled again until it ends: on Python 3.11 an asyncio.wait_for whose awaitable finishes as the
        # cancellation arrives returns instead of raising it (fixed in 3.12), and the speaker would go on.
        while not speaker.done():
            speaker.cancel()
            await asyncio.wait({speaker}, timeout=STOP_POLL_S)
        with contextlib.suppress(asyncio.CancelledError):
            speaker.result()

    def _busy(self) -> bool:
        return bool(self._waiting) or bool(self.open - ({self.utterance} if self.utterance else set()))

    async def _close_idle(self, idle_s: float) -> None:
        message = f"Nothing was received for {idle_s:g} s: the session is closed."
        await self._error(InvalidRequestError(message, code="session_idle"))
        with contextlib.suppress(OSError):
            await self.transport.close(NORMAL_CLOSURE, "idle")

    # --- the speaker --------------------------------------------------------------------------------------

    async def _speak_all(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._waiting:
                    utterance, phrase = self._waiting.popleft()
                    if phrase is None:
                        await self._finish(utterance)
                    else:
                        await self._speak(utterance, phrase + self._more(utterance))
        except _Gone:
            return
        except Exception:
            logger.exception("live session %s failed", self.id)
            with contextlib.suppress(_Gone, OSError):
                await self.protocol.error(self, SynthesisError("Internal error.", code="internal_error"))
                await self.transport.close(INTERNAL_ERROR, "internal error")

    def _more(self, utterance: Utterance) -> str:
        """The phrases of the same utterance waiting behind this one: spoken together, in fewer chunks."""
        more = []
        while self._waiting and self._waiting[0][0] is utterance and self._waiting[0][1] is not None:
            more.append(self._waiting.popleft()[1])
        return "".join(phrase for phrase in more if phrase)

    async def _speak(self, utterance: Utterance, text: str) -> None:
        if utterance.refused or not text.strip() or not await self._admit(utterance):
            return
        try:
            job = self._job(utterance, text)
        except APIError as exc:
            if exc.code != "empty_input":
                await self._error(exc)
            return
        if utterance.encoder is None:
            utterance.encoder = self.protocol.encoder(self.service.speech, utterance.config)
        try:
            async with aclosing(self.service.speech.samples(job)) as chunks:
                async for samples, words in chunks:
                    utterance.words += words
                    await self._send_audio(utterance, await utterance.encoder.encode(samples))
        except APIError as exc:
            if exc.code != "empty_input":
                await self._error(exc)
        finally:
            utterance.samples_out = job.samples_out
            utterance.usage.input_tokens += job.usage.input_tokens
            utterance.usage.output_tokens = job.usage.output_tokens
            utterance.usage.total_tokens = utterance.usage.input_tokens + utterance.usage.output_tokens

    def _job(self, utterance: Utterance, text: str) -> SpeechJob:
        job = self.service.speech.prepare(_request(utterance.config, text))
        job.request_id = f"{self.id}-{utterance.number}"
        job.samples_out = utterance.samples_out  # the phrase goes on from the utterance's audio so far
        if utterance.phrases == 0:
            job.planner = self.service.first_planner
        utterance.phrases += 1
        return job

    async def _admit(self, utterance: Utterance) -> bool:
        """An utterance takes one of the speech requests' slots while it speaks, as a request does."""
        if utterance.admitted_at is not None:
            return True
        try:
            utterance.admitted_at = await self.service.admission.acquire()
        except Overloaded as exc:
            utterance.refused = True
            self.service.metrics.live_utterances.labels(end="refused").inc()
            message = f"The server is overloaded ({exc.reason}); this utterance is not spoken."
            await self._error(ServiceUnavailableError(message, retry_after=exc.retry_after))
            return False
        return True

    async def _finish(self, utterance: Utterance) -> None:
        if utterance.encoder is not None:
            await self._send_audio(utterance, await utterance.encoder.finish(), last=True)
        utterance.close(self.service.admission)  # its slot is free before the client hears it is done
        self.open.discard(utterance)
        self.service.metrics.live_utterances.labels(end="done").inc()
        await self.protocol.done(self, utterance)

    async def _send_audio(self, utterance: Utterance, data: bytes, *, last: bool = False) -> None:
        """One delta with the audio and the words it completes; words wait for audio unless `last`."""
        if not data and not (last and utterance.words):
            return
        words, utterance.words = utterance.words, []
        await self.protocol.audio(self, utterance, data, words, last)
        if not utterance.sent_audio and data and utterance.completed_at is not None:
            utterance.sent_audio = True
            self.service.metrics.live_first_audio.observe(time.perf_counter() - utterance.completed_at)

    # --- sending ------------------------------------------------------------------------------------------

    async def _error(self, exc: APIError) -> None:
        self.service.metrics.live_errors.labels(code=str(exc.code)).inc()
        await self.protocol.error(self, exc)

    async def send_event(self, event: BaseModel) -> None:
        # A delta without timestamps has none, as in the SSE stream; other events show every field.
        await self.send_text(json.dumps(event.model_dump(exclude_none=isinstance(event, SpeechAudioDelta))))

    async def send_json(self, body: Mapping[str, Any]) -> None:
        await self.send_text(json.dumps(body))

    async def send_text(self, text: str) -> None:
        await self._send_frame(lambda: self.transport.send_text(text))

    async def send_bytes(self, data: bytes) -> None:
        await self._send_frame(lambda: self.transport.send_bytes(data))

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(OSError):
            await self.transport.close(code, reason)

    async def _send_frame(self, sending: Callable[[], Awaitable[None]]) -> None:
        try:
            async with self._send_lock, time_limit(self.settings.send_timeout_s):
                await sending()
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Gone from exc


def _request(config: LiveSession, text: str) -> SpeechRequest:
    return SpeechRequest(
        model=config.model,
        input=text,
        voice=config.voice,
        response_format=AudioFormat(config.response_format),
        speed=float(config.speed),
        lang_code=config.lang_code,
        stream=True,
        stream_format="sse",
        return_timestamps=config.return_timestamps,
        input_format="text",
    )
