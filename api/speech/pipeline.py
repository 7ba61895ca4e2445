"""The synthesis pipeline: a job's text to shaped audio, chunk by chunk, with one chunk always in flight on
the engine ahead of the one being sent. Its per-chunk decisions (speed, priority, gain) are pure."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import Any

import numpy as np

from api.audio.joins import MARGIN_S, shaped_chunk, silence
from api.engine.base import SAMPLES_PER_FRAME, ChunkAudio, SynthesisItem
from api.engine.scheduling.entries import (
    BACKGROUND_PRIORITY,
    FIRST_CHUNK_PRIORITY,
    LATER_CHUNK_PRIORITY,
    QueueFullError,
)
from api.engine.scheduling.scheduler import Scheduler
from api.engine.voices import style_for
from api.errors import APIError, InvalidRequestError, ServiceUnavailableError, SynthesisError
from api.protocol import MAX_SPEED, MIN_SPEED
from api.speech.captions import Timed, WordTime, chunk_timings
from api.speech.g2p import G2P
from api.speech.job import SpeechJob
from api.text.chunk import Word, phoneme_words
from api.text.plan import Planned, PlannedChunk, PlannedPause, Planner, PlanPart
from api.text.tracked import Tracked

logger = logging.getLogger(__name__)

# Chunks submitted ahead of the one being encoded and sent, so the engine never waits on the network.
PREFETCH_CHUNKS = 1

Pending = deque[tuple[asyncio.Future[ChunkAudio], Planned]]


class Pipeline:
    """Turns a job into audio samples: normalizes and phonemizes its parts on the G2P thread as the planner
    reaches them, submits each planned chunk to the engine's scheduler at the job's priority, and shapes
    each chunk's audio for joining, with its words' timings when the job has captions."""

    def __init__(self, scheduler: Scheduler, g2p: G2P, planner: Planner) -> None:
        self.scheduler = scheduler
        self.g2p = g2p
        self.planner = planner  # a job's, unless the job brings its own

    @property
    def sample_rate(self) -> int:
        return self.scheduler.engine.sample_rate

    async def samples(
        self, job: SpeechJob
    ) -> AsyncGenerator[tuple[np.ndarray[Any, Any], list[WordTime]], None]:
        """Chunk audio in order, shaped for joining, with one chunk always in flight ahead; with each, the
        caption words it completes. The timings count from `job.samples_out`."""
        pending: Pending = deque()
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

    async def parts(self, job: SpeechJob) -> AsyncIterator[PlanPart]:
        """The script's parts, each normalized in its voice's language when the planner reaches it."""
        if job.phonemes is not None:
            yield PlanPart(Tracked.of(job.phonemes), _phoneme_words, word_text=False)
            return
        for part in job.script.parts:
            lang_code = job.langs[part.voice]
            text = await self.g2p.normalized(
                job.script.text[part.start : part.end],
                lang_code=lang_code,
                options=job.request.normalization_options,
                offset=part.start,
            )
            words_of = partial(self.g2p.words, lang_code)
            word_text = self.g2p.phonemizer.gives_word_text(lang_code)
            yield PlanPart(text, words_of, word_text, voice=part.voice, rate=part.rate)

    def submit(self, job: SpeechJob, planned: PlannedChunk) -> asyncio.Future[ChunkAudio]:
        """Queue a chunk of the job on the engine, at the job's priority; 503 when the queue is full."""
        job.chunks_total += 1
        job.usage.input_tokens += len(planned.tokens)
        style = style_for(job.packs[planned.voice], len(planned.tokens))
        item = SynthesisItem(tokens=planned.tokens, style=style, speed=speed(job, planned))
        try:
            return self.scheduler.submit(item, job.request_id, priority=priority(job))
        except QueueFullError as exc:
            raise ServiceUnavailableError("The server is overloaded; retry later.", retry_after=2) from exc

    def pause(self, planned: PlannedPause, *, after_speech: bool) -> np.ndarray[Any, Any]:
        """A pause's silence; `after_speech`: a chunk of the same job came before it."""
        # The margins kept around the speech on either side are quiet too: they count toward the pause.
        margins = MARGIN_S * (2 if after_speech else 1)
        return silence(max(planned.seconds - margins, 0.0), self.sample_rate)

    def shape(
        self, job: SpeechJob, planned: PlannedChunk, chunk: ChunkAudio, *, before_pause: bool, offset: int
    ) -> tuple[np.ndarray[Any, Any], list[Timed]]:
        """A chunk's audio shaped for joining (its punctuation's pause unless `before_pause`), and when the
        job has captions, its spoken words' times counted from `offset` samples."""
        chunk_speed = speed(job, planned)
        rate = self.sample_rate
        shaped = shaped_chunk(chunk.samples, planned.ending, rate, speed=chunk_speed, pause=not before_pause)
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
            sample_rate=rate,
            speed=chunk_speed,
        )
        return shaped.samples, timed

    def _schedule(self, job: SpeechJob, planned: Planned) -> asyncio.Future[ChunkAudio]:
        if isinstance(planned, PlannedPause):
            pause: asyncio.Future[ChunkAudio] = asyncio.get_running_loop().create_future()
            pause.set_result(ChunkAudio(self.pause(planned, after_speech=job.chunks_total > 0)))
            return pause
        return self.submit(job, planned)

    async def _finish(
        self,
        job: SpeechJob,
        future: asyncio.Future[ChunkAudio],
        planned: Planned,
        following: Pending,
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
            words += job.captions.finish() if last else job.captions.close_before(next_origin(following))
        job.samples_out += len(samples)
        job.usage.output_tokens = -(-job.samples_out // SAMPLES_PER_FRAME)
        job.usage.total_tokens = job.usage.input_tokens + job.usage.output_tokens
        return louder(samples, job.request.volume_multiplier), words


async def chunk_result(future: asyncio.Future[ChunkAudio]) -> ChunkAudio:
    """A chunk's audio; an engine failure becomes a SynthesisError."""
    try:
        return await future
    except APIError:
        raise
    except Exception as exc:
        raise SynthesisError(f"Synthesis failed: {exc}", code="synthesis_failed") from exc


def speed(job: SpeechJob, planned: PlannedChunk) -> float:
    """The request's speed times the chunk's rate (SSML prosody), within what the model takes."""
    return min(max(job.request.speed * planned.rate, MIN_SPEED), MAX_SPEED)


def priority(job: SpeechJob) -> int:
    """The priority of the job's chunk just counted: a book's is background; a request's first chunk sets
    its time to first audio, while the others have playback time in hand."""
    if job.background:
        return BACKGROUND_PRIORITY
    return FIRST_CHUNK_PRIORITY if job.chunks_total == 1 else LATER_CHUNK_PRIORITY


def next_origin(following: Pending) -> tuple[int, int] | None:
    """Where the next spoken word planned came from, if it is known yet."""
    for _, planned in following:
        if isinstance(planned, PlannedChunk):
            return next((word.origin for word in planned.words if word.tokens is not None), None)
    return None


def louder(samples: np.ndarray[Any, Any], gain: float) -> np.ndarray[Any, Any]:
    if gain == 1.0:
        return samples
    amplified: np.ndarray[Any, Any] = np.clip(samples * np.float32(gain), -1.0, 1.0)
    return amplified


async def _phoneme_words(piece: str) -> list[Word]:
    return phoneme_words(piece)
