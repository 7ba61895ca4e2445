"""The speech service: the one place that joins text processing, the engine and the audio encoder."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import numpy as np

from api.audio.encoder import AudioEncoder
from api.audio.formats import AudioFormat
from api.audio.telephony import RawEncoding
from api.engine.base import ChunkAudio
from api.engine.scheduling.scheduler import Scheduler
from api.engine.voices import VoiceStore
from api.errors import APIError, InvalidRequestError
from api.protocol import PhonemesRequest, SpeechRequest
from api.settings import Settings
from api.speech.captions import Captions, Timed, WordTime
from api.speech.encoding import Encoders, OffLoopEncoder
from api.speech.g2p import G2P
from api.speech.job import Piece, SpeechJob
from api.speech.pipeline import Pipeline
from api.speech.planning import book_planner, request_planner
from api.speech.streaming import speech_events
from api.speech.validation import check_input, check_model, check_phonemes, check_ready, check_timestamps
from api.text.lexicon import Lexicon
from api.text.markup import Part, Script, read_script
from api.text.phonemize import Phonemizer
from api.text.plan import PlannedChunk, PlannedPause, PlanPart


class SpeechService:
    """Turns a speech request into encoded audio: validates it into a job before the first byte, runs the
    job through the pipeline (text split and phonemized, chunks scheduled on the engine one ahead) and
    encodes each chunk as it arrives. Stops when the consumer stops."""

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
        self.g2p = G2P(phonemizer, lexicon, settings)
        self.encoders = Encoders(settings)
        self.pipeline = Pipeline(scheduler, self.g2p, request_planner(settings))
        self.book_planner = book_planner(settings)

    def close(self) -> None:
        self.g2p.close()
        self.encoders.close()

    @property
    def sample_rate(self) -> int:
        return self.scheduler.engine.sample_rate

    # --- validation: everything a job needs, resolved before the first byte -----------------------------

    def check_ready(self) -> None:
        """Raises ServiceUnavailableError while the model is loading or after it failed to load."""
        check_ready(self.scheduler.state, self.scheduler.failure)

    def prepare(self, request: SpeechRequest) -> SpeechJob:
        """Validate everything that can be validated without synthesis; raises APIError."""
        self.check_ready()
        check_input(request.input, self.settings.max_input_chars)
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

    def prepare_phonemes(self, request: PhonemesRequest) -> SpeechJob:
        """A job that speaks the given phonemes (no normalization, no G2P); raises APIError."""
        check_phonemes(request.phonemes, self.scheduler.engine.vocab)
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
        check_model(request.model)
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
            check_timestamps(request, self.scheduler.engine)
            job.captions = Captions(script.text)
        return job

    def _tagged_voice(self, name: str) -> tuple[np.ndarray[Any, Any], str]:
        """The pack and language of a voice named in the input (a voice tag or SSML), as a 400 on `input`."""
        try:
            return self._voice(name, None)
        except APIError as exc:
            raise InvalidRequestError(
                f"In the input's voice '{name}': {exc.message}", param="input", code=exc.code
            ) from exc

    # --- the audio: a job's samples encoded ---------------------------------------------------------------

    async def audio(
        self, job: SpeechJob, encoder: OffLoopEncoder | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Encoded audio bytes as they are ready, ending with the encoder's tail."""
        async with aclosing(self.pieces(job, encoder)) as pieces:
            async for piece in pieces:
                yield piece.data

    def events(self, job: SpeechJob) -> AsyncGenerator[bytes, None]:
        """Server-sent events: speech.audio.delta per encoded piece (with its words' timestamps when
        asked), then speech.audio.done with usage."""
        return speech_events(job, self.pieces(job))

    async def pieces(
        self, job: SpeechJob, encoder: OffLoopEncoder | None = None
    ) -> AsyncGenerator[Piece, None]:
        """Encoded audio as it is ready (never empty), each with the words it completes; the last one
        carries any words left. `encoder` (closed here) replaces the request's format's."""
        request = job.request
        encoder = encoder or self.encoders.formatted(
            request.response_format, self.sample_rate, streaming=request.stream
        )
        words: list[WordTime] = []
        try:
            async with aclosing(self.pipeline.samples(job)) as chunks:
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

    def encoder(self, response_format: AudioFormat) -> OffLoopEncoder:
        """A streaming encoder of `response_format` that runs on the encode threads; close it when done."""
        return self.encoders.formatted(response_format, self.sample_rate, streaming=True)

    def raw_encoder(self, encoding: RawEncoding, rate: int) -> OffLoopEncoder:
        """Headerless audio at `rate` (resampled from the model's), for the voice-agent protocols."""
        return self.encoders.raw(encoding, rate, self.sample_rate)

    def offloop(self, encoder: AudioEncoder) -> OffLoopEncoder:
        """`encoder` run on the encode threads; close it when done."""
        return self.encoders.offloop(encoder)

    # --- the pipeline's steps, for a caller that runs them itself (a live session, a book job) -----------

    def samples(self, job: SpeechJob) -> AsyncGenerator[tuple[np.ndarray[Any, Any], list[WordTime]], None]:
        """The job's audio chunk by chunk, shaped for joining, each with the caption words it completes;
        for a caller that encodes several jobs into one stream (the live path). The timings count from
        `job.samples_out`."""
        return self.pipeline.samples(job)

    def parts(self, job: SpeechJob) -> AsyncIterator[PlanPart]:
        return self.pipeline.parts(job)

    def submit(self, job: SpeechJob, planned: PlannedChunk) -> asyncio.Future[ChunkAudio]:
        return self.pipeline.submit(job, planned)

    def pause(self, planned: PlannedPause, *, after_speech: bool) -> np.ndarray[Any, Any]:
        return self.pipeline.pause(planned, after_speech=after_speech)

    def shape(
        self, job: SpeechJob, planned: PlannedChunk, chunk: ChunkAudio, *, before_pause: bool, offset: int
    ) -> tuple[np.ndarray[Any, Any], list[Timed]]:
        return self.pipeline.shape(job, planned, chunk, before_pause=before_pause, offset=offset)

    # --- /dev/phonemize ------------------------------------------------------------------------------------

    async def phonemize(self, text: str, lang_code: str) -> tuple[str, list[int]]:
        """Kokoro-FastAPI's /dev/phonemize: the text's phonemes as the speech path makes them, and their
        token ids."""
        self.phonemizer.check_language(lang_code, param="language")  # the field is `language` here
        check_input(text, self.settings.max_input_chars)
        return await self.g2p.phonemize(text, lang_code, self.scheduler.engine.vocab)
