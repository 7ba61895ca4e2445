"""The speech service: the one place that joins text processing, the engine and the audio encoder."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from api.audio.encoder import AudioEncoder, create_encoder
from api.audio.formats import AudioFormat
from api.audio.joins import MARGIN_S, shaped_chunk, silence
from api.audio.telephony import RawEncoder, RawEncoding
from api.captions import Captions, Timed, WordTime, chunk_timings
from api.engine.base import SAMPLES_PER_FRAME, ChunkAudio, SynthesisItem
from api.engine.scheduler import (
    BACKGROUND_PRIORITY,
    FIRST_CHUNK_PRIORITY,
    LATER_CHUNK_PRIORITY,
    EngineState,
    QueueFullError,
    Scheduler,
)
from api.engine.voices import VoiceStore, style_for
from api.errors import (
    APIError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
    SynthesisError,
)
from api.protocol import (
    MAX_SPEED,
    MIN_SPEED,
    MODEL_IDS,
    CaptionedSpeechRequest,
    PhonemesRequest,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    Usage,
    WordTimestamp,
)
from api.settings import Settings
from api.text.chunk import ChunkLimits, Word, phoneme_words, phonemes_of
from api.text.lexicon import Lexicon
from api.text.markup import Part, Script, read_script
from api.text.normalize import normalize_tracked
from api.text.phonemize import Phonemizer
from api.text.plan import Planned, PlannedChunk, PlannedPause, Planner, PlanPart
from api.text.tracked import Tracked

logger = logging.getLogger(__name__)

# Chunks submitted ahead of the one being encoded and sent, so the engine never waits on the network.
PREFETCH_CHUNKS = 1


@dataclass
class SpeechJob:
    """A validated request: everything needed to synthesize it, resolved before the first byte."""

    request: SpeechRequest
    request_id: str
    voice_pack: np.ndarray[Any, Any]
    lang_code: str
    script: Script
    # Per voice of the script (None: the request's own): its pack and its G2P language.
    packs: dict[str | None, np.ndarray[Any, Any]] = field(default_factory=dict)
    langs: dict[str | None, str] = field(default_factory=dict)
    phonemes: str | None = None  # given phonemes instead of text (/dev/generate_from_phonemes)
    usage: Usage = field(default_factory=Usage)
    chunks_total: int = 0
    chunks_sent: int = 0
    samples_out: int = 0
    captions: Captions | None = None  # word timings, when the request asks for them
    planner: Planner | None = None  # None: the service's (a live utterance starts with a shorter chunk)
    background: bool = False  # a book job's chunk: runs only where no request's chunk waits


@dataclass(frozen=True)
class Piece:
    """Audio ready to send, and the input's words whose timings it completes."""

    data: bytes
    words: list[WordTime]


def chunk_limits(settings: Settings) -> ChunkLimits:
    return ChunkLimits(
        first_budget=settings.first_chunk_tokens,
        target_min=settings.chunk_min_tokens,
        target_max=settings.chunk_max_tokens,
        hard_max=settings.chunk_hard_max_tokens,
        # A first-chunk cap below the first budget or above the hard max means no more than they do.
        first_max=min(
            max(settings.first_chunk_max_tokens, settings.first_chunk_tokens), settings.chunk_hard_max_tokens
        ),
        tail_min=min(settings.chunk_tail_min_tokens, settings.chunk_min_tokens),
    )


class SpeechService:
    """Turns a speech request into encoded audio: validate, split and phonemize the text, schedule
    chunks on the engine (one ahead), encode each chunk as it arrives. Stops when the consumer stops."""

    def __init__(
        self,
        settings: Settings,
        scheduler: Scheduler,
        voices: VoiceStore,
        phonemizer: Phonemizer,
        lexicon: Lexicon | None = None,
    ) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.voices = voices
        self.phonemizer = phonemizer
        self.lexicon = lexicon
        # misaki's G2P objects are not thread-safe: one thread does all phonemization.
        self._g2p_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g2p")
        self._encode_threads = ThreadPoolExecutor(
            max_workers=max(4, settings.max_inflight), thread_name_prefix="encode"
        )
        limits = chunk_limits(settings)
        self.planner = Planner(
            limits=limits,
            piece_chars=settings.g2p_piece_chars,
            first_piece_chars=settings.first_g2p_piece_chars,
        )
        self.book_planner = Planner(
            limits=dataclasses.replace(limits, first_budget=limits.target_min, first_max=limits.hard_max),
            piece_chars=settings.g2p_piece_chars,
            first_piece_chars=settings.g2p_piece_chars,
        )

    def close(self) -> None:
        self._g2p_thread.shutdown(wait=False, cancel_futures=True)
        self._encode_threads.shutdown(wait=False, cancel_futures=True)

    def prepare(self, request: SpeechRequest) -> SpeechJob:
        """Validate everything that can be validated without synthesis; raises APIError."""
        self.check_ready()
        self._check_input(request.input)
        return self._prepared(request)

    def prepare_chapter(
        self, text: str, *, voice: str, speed: float, lang_code: str | None, captions: bool
    ) -> SpeechJob:
        """A book job's chapter (api/books): spoken at the background priority, every chunk planned like a
        later one (nobody waits for its first audio), its input bounded where the book was read."""
        request = SpeechRequest(
            input=text, voice=voice, speed=speed, lang_code=lang_code, stream=True, input_format="text"
        )
        job = self._prepared(request)
        job.background = True
        job.planner = self.book_planner
        if captions:
            job.captions = Captions(job.script.text)
        return job

    def script_text(self, text: str) -> str:
        """The text a chapter's captions are in: its script's (prepare_chapter's), inline tags and all."""
        return read_script(text, input_format="text", voice_tags=self.settings.voice_tags, ssml=False).text

    def check_voice(self, voice: str, lang_code: str | None) -> None:
        """Raises APIError unless `voice` exists and speaks `lang_code` (its own language when None)."""
        self._voice(voice, lang_code)

    def _voice(self, voice: str, lang_code: str | None) -> tuple[np.ndarray[Any, Any], str]:
        """`voice`'s pack and G2P language (`lang_code`, else the voice's own); raises APIError."""
        names = self.voices.canonical_names(voice)
        lang = (lang_code or names[0][0]).lower()
        self.phonemizer.check_language(lang)
        return self.voices.resolve(voice), lang

    def _prepared(self, request: SpeechRequest) -> SpeechJob:
        if request.model not in MODEL_IDS:
            raise NotFoundError(
                f"The model '{request.model}' does not exist. Available: {', '.join(MODEL_IDS)}.",
                param="model",
                code="model_not_found",
            )
        voice = request.voice or self.settings.default_voice
        pack, lang_code = self._voice(voice, request.lang_code)
        script = read_script(
            request.input,
            input_format=request.input_format,
            voice_tags=self.settings.voice_tags,
            ssml=self.settings.ssml,
        )
        if not script.parts:
            raise InvalidRequestError(
                "The input contains nothing to speak.", param="input", code="empty_input"
            )
        job = SpeechJob(request, uuid.uuid4().hex[:12], pack, lang_code, script)
        job.packs[None], job.langs[None] = pack, lang_code
        for name in script.voices:
            job.packs[name], job.langs[name] = self._tagged_voice(name)
        if request.return_timestamps:
            self._check_timestamps(request)
            job.captions = Captions(script.text)
        return job

    def prepare_phonemes(self, request: PhonemesRequest) -> SpeechJob:
        """A job that speaks the given phonemes (no normalization, no G2P); raises APIError."""
        vocab = self.scheduler.engine.vocab
        unknown = sorted(
            {symbol for symbol in request.phonemes if symbol not in vocab and not symbol.isspace()}
        )
        if unknown:
            raise InvalidRequestError(
                f"Unknown phoneme symbols: {' '.join(unknown)}.", param="phonemes", code="invalid_phonemes"
            )
        speech = SpeechRequest(
            input=request.phonemes,
            voice=request.voice,
            response_format=request.response_format,
            speed=request.speed,
            stream=request.stream,
            input_format="text",
        )
        job = self.prepare(speech)
        job.phonemes = request.phonemes
        job.script = Script(request.phonemes, (Part(0, len(request.phonemes)),))
        return job

    def _tagged_voice(self, name: str) -> tuple[np.ndarray[Any, Any], str]:
        """The pack and language of a voice named in the input (a voice tag or SSML), as a 400 on `input`."""
        try:
            return self._voice(name, None)
        except APIError as exc:
            raise InvalidRequestError(
                f"In the input's voice '{name}': {exc.message}", param="input", code=exc.code
            ) from exc

    async def audio(
        self, job: SpeechJob, encoder: OffLoopEncoder | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Encoded audio bytes as they are ready, ending with the encoder's tail."""
        async with aclosing(self.pieces(job, encoder)) as pieces:
            async for piece in pieces:
                yield piece.data

    async def pieces(
        self, job: SpeechJob, encoder: OffLoopEncoder | None = None
    ) -> AsyncGenerator[Piece, None]:
        """Encoded audio as it is ready (never empty), each with the words it completes; the last one
        carries any words left. `encoder` (closed here) replaces the request's format's."""
        encoder = encoder or OffLoopEncoder(
            create_encoder(
                job.request.response_format,
                self.sample_rate,
                streaming=job.request.stream,
                mp3_kbps=self.settings.mp3_kbps,
                mp3_quality=self.settings.mp3_quality,
            ),
            self._encode_threads,
        )
        words: list[WordTime] = []
        try:
            async with aclosing(self._samples(job)) as chunks:
                async for samples, completed in chunks:
                    words += completed
                    data = await encoder.encode(samples)
                    if data:
                        yield Piece(data, words)
                        words = []
            tail = await encoder.finish()
            if tail or words:
                yield Piece(tail, words)
        finally:
            encoder.close()

    def samples(self, job: SpeechJob) -> AsyncGenerator[tuple[np.ndarray[Any, Any], list[WordTime]], None]:
        """The job's audio chunk by chunk, shaped for joining, each with the caption words it completes;
        for a caller that encodes several jobs into one stream (the live path). The timings count from
        `job.samples_out`."""
        return self._samples(job)

    def raw_encoder(self, encoding: RawEncoding, rate: int) -> OffLoopEncoder:
        """Headerless audio at `rate` (resampled from the model's), for the voice-agent protocols."""
        return self.offloop(RawEncoder(encoding, rate, self.sample_rate))

    def offloop(self, encoder: AudioEncoder) -> OffLoopEncoder:
        """`encoder` run on the encode threads; close it when done."""
        return OffLoopEncoder(encoder, self._encode_threads)

    def encoder(self, response_format: AudioFormat) -> OffLoopEncoder:
        """A streaming encoder of `response_format` that runs on the encode threads; close it when done."""
        encoder = create_encoder(
            response_format,
            self.sample_rate,
            streaming=True,
            mp3_kbps=self.settings.mp3_kbps,
            mp3_quality=self.settings.mp3_quality,
        )
        return OffLoopEncoder(encoder, self._encode_threads)

    async def events(self, job: SpeechJob) -> AsyncGenerator[bytes, None]:
        """Server-sent events: speech.audio.delta per encoded piece (with its words' timestamps when
        asked), then speech.audio.done with usage."""
        async with aclosing(self.pieces(job)) as pieces:
            async for piece in pieces:
                timestamps = None
                if job.captions is not None:
                    timestamps = [WordTimestamp(**vars(word)) for word in piece.words]
                audio = base64.b64encode(piece.data).decode("ascii")
                yield _sse(SpeechAudioDelta(audio=audio, timestamps=timestamps))
        yield _sse(SpeechAudioDone(usage=job.usage))

    async def _samples(
        self, job: SpeechJob
    ) -> AsyncGenerator[tuple[np.ndarray[Any, Any], list[WordTime]], None]:
        """Chunk audio in order, shaped for joining, with one chunk always in flight ahead; with each, the
        caption words it completes."""
        pending: deque[tuple[asyncio.Future[ChunkAudio], Planned]] = deque()
        finished = False
        try:
            vocab = self.scheduler.engine.vocab
            planner = job.planner or self.planner
            async for planned in planner.plan_parts(self.parts(job), vocab):
                pending.append((self._schedule(job, planned), planned))
                if len(pending) > PREFETCH_CHUNKS:
                    yield await self._finish(job, *pending.popleft(), pending, last=False)
            while pending:
                yield await self._finish(job, *pending.popleft(), pending, last=not pending)
            finished = True
        finally:
            for future, _ in pending:
                future.cancel()
            if not finished:
                logger.info(
                    "request %s stopped after %d chunks sent (%d scheduled); the rest is cancelled",
                    job.request_id,
                    job.chunks_sent,
                    job.chunks_total,
                )
        if job.chunks_total == 0:
            raise InvalidRequestError(
                "The input contains nothing to speak.", param="input", code="empty_input"
            )

    def _schedule(self, job: SpeechJob, planned: Planned) -> asyncio.Future[ChunkAudio]:
        if isinstance(planned, PlannedPause):
            pause: asyncio.Future[ChunkAudio] = asyncio.get_running_loop().create_future()
            pause.set_result(ChunkAudio(self.pause(planned, after_speech=job.chunks_total > 0)))
            return pause
        return self.submit(job, planned)

    def pause(self, planned: PlannedPause, *, after_speech: bool) -> np.ndarray[Any, Any]:
        """A pause's silence; `after_speech`: a chunk of the same job came before it."""
        # The margins kept around the speech on either side are quiet too: they count toward the pause.
        margins = MARGIN_S * (2 if after_speech else 1)
        return silence(max(planned.seconds - margins, 0.0), self.sample_rate)

    def submit(self, job: SpeechJob, planned: PlannedChunk) -> asyncio.Future[ChunkAudio]:
        """Queue a chunk of the job on the engine, at the job's priority; 503 when the queue is full."""
        job.chunks_total += 1
        job.usage.input_tokens += len(planned.tokens)
        style = style_for(job.packs[planned.voice], len(planned.tokens))
        item = SynthesisItem(tokens=planned.tokens, style=style, speed=_speed(job, planned))
        try:
            return self.scheduler.submit(item, job.request_id, priority=_priority(job))
        except QueueFullError as exc:
            raise ServiceUnavailableError("The server is overloaded; retry later.", retry_after=2) from exc

    def shape(
        self, job: SpeechJob, planned: PlannedChunk, chunk: ChunkAudio, *, before_pause: bool, offset: int
    ) -> tuple[np.ndarray[Any, Any], list[Timed]]:
        """A chunk's audio shaped for joining (its punctuation's pause unless `before_pause`), and when the
        job has captions, its spoken words' times counted from `offset` samples."""
        speed = _speed(job, planned)
        rate = self.sample_rate
        shaped = shaped_chunk(chunk.samples, planned.ending, rate, speed=speed, pause=not before_pause)
        if job.captions is None:
            return shaped.samples, []
        if chunk.durations is None:
            raise SynthesisError(f"The {self.scheduler.engine.name} engine gave no durations for timestamps.")
        timed = chunk_timings(
            planned.words,
            chunk.durations,
            trimmed=shaped.start,
            kept=shaped.end - shaped.start,
            voiced=shaped.voiced,
            offset=offset,
            sample_rate=self.sample_rate,
            speed=speed,
        )
        return shaped.samples, timed

    async def _finish(
        self,
        job: SpeechJob,
        future: asyncio.Future[ChunkAudio],
        planned: Planned,
        following: deque[tuple[asyncio.Future[ChunkAudio], Planned]],
        *,
        last: bool,
    ) -> tuple[np.ndarray[Any, Any], list[WordTime]]:
        """A chunk's shaped audio and the caption words complete once it is out; `following` is what is
        planned after it and `last` says nothing else will be."""
        chunk = await chunk_result(future)
        samples = chunk.samples
        words: list[WordTime] = []
        if isinstance(planned, PlannedChunk):
            # A pause tag (or SSML break) right after the chunk replaces its punctuation pause.
            before_pause = bool(following) and isinstance(following[0][1], PlannedPause)
            offset = job.samples_out
            samples, timed = self.shape(job, planned, chunk, before_pause=before_pause, offset=offset)
            if job.captions is not None:
                words = job.captions.add(timed)
            job.chunks_sent += 1
        if job.captions is not None:
            words += job.captions.finish() if last else job.captions.close_before(_next_origin(following))
        job.samples_out += len(samples)
        job.usage.output_tokens = -(-job.samples_out // SAMPLES_PER_FRAME)
        job.usage.total_tokens = job.usage.input_tokens + job.usage.output_tokens
        return _louder(samples, job.request.volume_multiplier), words

    async def parts(self, job: SpeechJob) -> AsyncIterator[PlanPart]:
        """The script's parts, each normalized in its voice's language when the planner reaches it."""
        if job.phonemes is not None:
            yield PlanPart(Tracked.of(job.phonemes), _phoneme_words, word_text=False)
            return
        for part in job.script.parts:
            lang_code = job.langs[part.voice]
            text = await self._normalized(job, part, lang_code)
            words_of = partial(self._words, lang_code)
            word_text = self.phonemizer.gives_word_text(lang_code)
            yield PlanPart(text, words_of, word_text, voice=part.voice, rate=part.rate)

    async def _normalized(self, job: SpeechJob, part: Part, lang_code: str) -> Tracked:
        normalize = partial(
            normalize_tracked,
            options=job.request.normalization_options,
            lang_code=lang_code,
            date_order=self.settings.date_order,
            offset=part.start,
            lexicon=self.lexicon,
        )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._g2p_thread, normalize, job.script.text[part.start : part.end])

    async def phonemize(self, text: str, lang_code: str) -> tuple[str, list[int]]:
        """Kokoro-FastAPI's /dev/phonemize: the text normalized (lexicon included) and phonemized as the
        speech path does it; its phonemes and their token ids."""
        self.phonemizer.check_language(lang_code, param="language")  # the field is `language` here
        self._check_input(text)
        normalize = partial(
            normalize_tracked, lang_code=lang_code, date_order=self.settings.date_order, lexicon=self.lexicon
        )
        loop = asyncio.get_running_loop()
        normalized = await loop.run_in_executor(self._g2p_thread, normalize, text)
        words = await self._words(lang_code, normalized.text)
        phonemes = phonemes_of(words)
        vocab = self.scheduler.engine.vocab
        return phonemes, [vocab[symbol] for symbol in phonemes if symbol in vocab]

    async def _words(self, lang_code: str, text: str) -> list[Word]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._g2p_thread, self.phonemizer.words, text, lang_code)

    @property
    def sample_rate(self) -> int:
        return self.scheduler.engine.sample_rate

    def check_ready(self) -> None:
        """Raises ServiceUnavailableError while the model is loading or after it failed to load."""
        state = self.scheduler.state
        if state is EngineState.READY:
            return
        if state is EngineState.FAILED:
            raise ServiceUnavailableError(
                f"The model failed to load: {self.scheduler.failure}",
                retry_after=60,
                code="model_unavailable",
            )
        raise ServiceUnavailableError("The model is still loading.", retry_after=5, code="model_loading")

    def _check_timestamps(self, request: SpeechRequest) -> None:
        engine = self.scheduler.engine
        if not engine.gives_durations:
            raise InvalidRequestError(
                f"Word timestamps need the model's durations, which the {engine.name} engine's model file "
                "does not give.",
                param="return_timestamps",
                code="timestamps_unavailable",
            )
        if request.stream_format != "sse" and not isinstance(request, CaptionedSpeechRequest):
            raise InvalidRequestError(
                "Word timestamps come with stream_format 'sse' here, or from /dev/captioned_speech.",
                param="return_timestamps",
                code="timestamps_need_sse",
            )

    def _check_input(self, text: str) -> None:
        if not text.strip():
            raise InvalidRequestError("The input must contain text.", param="input", code="empty_input")
        limit = self.settings.max_input_chars
        if len(text) > limit:
            raise InvalidRequestError(
                f"The input is {len(text)} characters; the limit is {limit}.",
                param="input",
                code="string_too_long",
            )


class OffLoopEncoder:
    """One response's encoder, run on the encode threads one call at a time. Closed only once no call
    is running: a client that leaves mid-stream cancels the await, not the call, and closing a PyAV
    encoder while it encodes crashed the whole process (found by scripts/bench/soak.py)."""

    def __init__(self, encoder: AudioEncoder, threads: ThreadPoolExecutor) -> None:
        self._encoder = encoder
        self._threads = threads
        self._running: Future[bytes] | None = None

    async def encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        return await self._run(self._encoder.encode, samples)

    async def finish(self) -> bytes:
        return await self._run(self._encoder.finish)

    def close(self) -> None:
        running = self._running
        if running is not None and not running.done():
            running.add_done_callback(lambda _: self._encoder.close())
        else:
            self._encoder.close()

    async def _run(self, call: Callable[..., bytes], *args: object) -> bytes:
        self._running = self._threads.submit(call, *args)
        return await asyncio.wrap_future(self._running)


async def chunk_result(future: asyncio.Future[ChunkAudio]) -> ChunkAudio:
    try:
        return await future
    except APIError:
        raise
    except Exception as exc:
        raise SynthesisError(f"Synthesis failed: {exc}", code="synthesis_failed") from exc


def _speed(job: SpeechJob, planned: PlannedChunk) -> float:
    """The request's speed times the chunk's rate (SSML prosody), within what the model takes."""
    return min(max(job.request.speed * planned.rate, MIN_SPEED), MAX_SPEED)


async def _phoneme_words(piece: str) -> list[Word]:
    return phoneme_words(piece)


def _next_origin(following: deque[tuple[asyncio.Future[ChunkAudio], Planned]]) -> tuple[int, int] | None:
    """Where the next spoken word planned came from, if it is known yet."""
    for _, planned in following:
        if isinstance(planned, PlannedChunk):
            return next((word.origin for word in planned.words if word.tokens is not None), None)
    return None


def _louder(samples: np.ndarray[Any, Any], gain: float) -> np.ndarray[Any, Any]:
    if gain == 1.0:
        return samples
    louder: np.ndarray[Any, Any] = np.clip(samples * np.float32(gain), -1.0, 1.0)
    return louder


def _priority(job: SpeechJob) -> int:
    if job.background:
        return BACKGROUND_PRIORITY
    # The first chunk sets the request's time to first audio; the others have playback time in hand.
    return FIRST_CHUNK_PRIORITY if job.chunks_total == 1 else LATER_CHUNK_PRIORITY


def _sse(event: SpeechAudioDelta | SpeechAudioDone) -> bytes:
    # json.dumps' spacing, as these events have always been written; a delta without timestamps has none.
    return f"data: {json.dumps(event.model_dump(exclude_none=True))}\n\n".encode()


async def started(stream: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Run a stream up to its first bytes before the response starts, so that failures before any audio
    still get a proper status; the returned iterator yields those bytes, then the rest."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = b""

    async def resumed() -> AsyncIterator[bytes]:
        async with aclosing(stream):
            yield first
            async for data in stream:
                yield data

    return resumed()
