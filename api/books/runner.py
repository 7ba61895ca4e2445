"""Runs book jobs in this worker, one at a time, at the scheduler's background priority.

A job's units (its chunks of speech and its pauses, chapter after chapter) follow from its text alone:
the same book plans the same units, and each chunk is synthesized with the same seed, so a job that
resumes after a crash makes the units it lacks exactly as an uninterrupted run would have, and appends
them after the ones committed. The finished file is made once every unit is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from api.audio.encoder import Chapter as ChapterMark
from api.audio.encoder import to_int16
from api.audio.formats import BookFormat
from api.books.assemble import assemble, book_spec
from api.books.read import Book, Chapter
from api.books.store import JobRecord, JobState, JobStore, Unit, owner_id
from api.engine.base import ChunkAudio
from api.errors import APIError, ServiceUnavailableError
from api.settings import Settings
from api.speech import SpeechJob, SpeechService, chunk_result
from api.text.plan import Planned, PlannedChunk, PlannedPause

logger = logging.getLogger(__name__)

# Silence between one chapter and the next (its chapter's last unit).
CHAPTER_GAP_S = 2.0
# A runner holds its job this long past its last renewal; it renews every LEASE_S / 3.
LEASE_S = 30.0
# Without a job, the runner looks for one this often (a job posted to this worker wakes it at once).
IDLE_POLL_S = 2.0
# Waits before submitting again when the engine's queue is full.
QUEUE_FULL_RETRY_S = 0.5


class LostJob(Exception):
    """The runner no longer holds its job: it was cancelled, or its lease ran out and another took it."""


@dataclass
class _Pending:
    """A unit planned and, for a chunk, submitted: waiting to be committed in order."""

    index: int
    chapter: int
    planned: Planned
    characters_done: int
    after_speech: bool  # a chunk of the same chapter came before it
    future: asyncio.Future[ChunkAudio] | None = None


def chapter_script(chapter: Chapter) -> tuple[str, int]:
    """What a chapter's speech reads (its heading, if it has one apart from its text, then its text), and
    where its text starts in it."""
    heading = chapter.heading.strip()
    if not heading:
        return chapter.text, 0
    lead = heading if heading[-1] in ".!?:;" else f"{heading}."
    return f"{lead}\n\n{chapter.text}", len(lead) + 2


class JobRunner:
    """Claims the oldest job nobody holds (waiting for the engine to be ready first), runs it to the end,
    and looks for the next; `wake` says a job was posted, `cancel` stops the job if it runs here."""

    def __init__(
        self, store: JobStore, service: SpeechService, settings: Settings, owner: str | None = None
    ) -> None:
        self.store = store
        self.service = service
        self.settings = settings
        self.owner = owner or owner_id()
        self._wake = asyncio.Event()
        self._current: tuple[str, asyncio.Task[None]] | None = None

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        if self._current is not None and self._current[0] == job_id:
            self._current[1].cancel()

    async def run(self) -> None:
        while True:
            record = None
            # Not while the model loads or after it failed to; an idle-unloaded one loads again for the job.
            if self.service.scheduler.serves:
                record = await asyncio.to_thread(self.store.claim, self.owner, LEASE_S)
            if record is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)
                self._wake.clear()
                continue
            await self._run_job(record)

    async def _run_job(self, record: JobRecord) -> None:
        logger.info("book job %s (%s): running from unit %d", record.id, record.title, record.units_done)
        task = asyncio.create_task(BookRun(self, record).run())
        self._current = (record.id, task)
        try:
            await asyncio.wait({task})
        finally:
            self._current = None
            if not task.done():  # this worker stops: another takes the job over at once
                task.cancel()
                await asyncio.wait({task})
                await asyncio.to_thread(self.store.release, record.id, self.owner)
        if task.cancelled():
            logger.info("book job %s stopped (deleted, or its lease lost)", record.id)
            return
        error = task.exception()
        if error is not None and await asyncio.to_thread(self.store.get, record.id) is None:
            logger.info("book job %s deleted while it ran", record.id)
        elif error is None:
            logger.info("book job %s done", record.id)
        elif isinstance(error, LostJob):
            logger.info("book job %s left: %s", record.id, error)
        else:
            message, code = _failure(error)
            logger.error("book job %s failed: %s", record.id, message, exc_info=error)
            await asyncio.to_thread(self.store.fail, record.id, message, code)


class BookRun:
    """One job's run in this worker: plans every unit ahead, keeps a few chunks on the engine, commits
    units in order (the ones already committed are planned again but not made), then makes the file."""

    def __init__(self, runner: JobRunner, record: JobRecord) -> None:
        self.runner = runner
        self.store = runner.store
        self.service = runner.service
        self.record = record
        self._chunks_total: int | None = None
        self._started = time.monotonic()
        self._characters_at_start = record.characters_done

    async def run(self) -> None:
        store, job_id = self.store, self.record.id
        book = await asyncio.to_thread(store.book, job_id)
        units = await asyncio.to_thread(store.units, job_id)
        await asyncio.to_thread(store.resume_offset, job_id, units)
        jobs = [self._chapter_job(chapter) for chapter in book.chapters]
        heartbeat = asyncio.create_task(self._heartbeat(asyncio.current_task()))
        try:
            await self._synthesize(book, jobs, done=len(units))
            await self._finish(book)
        finally:
            heartbeat.cancel()

    def _chapter_job(self, chapter: Chapter) -> SpeechJob:
        options = self.record.options
        return self.service.prepare_chapter(
            chapter_script(chapter)[0],
            voice=options.voice,
            speed=options.speed,
            lang_code=options.lang_code,
            captions=options.captions,
        )

    async def _heartbeat(self, run: asyncio.Task[None] | None) -> None:
        """Renew the lease while the job runs, however slowly its units come; cancels the run when lost."""
        while True:
            await asyncio.sleep(LEASE_S / 3)
            if not await asyncio.to_thread(self.store.renew, self.record.id, self.runner.owner, LEASE_S):
                logger.info("book job %s: lease lost (cancelled or taken over)", self.record.id)
                if run is not None:
                    run.cancel()
                return

    async def _synthesize(self, book: Book, jobs: Sequence[SpeechJob], *, done: int) -> None:
        planned: asyncio.Queue[_Pending | None] = asyncio.Queue()
        planning = asyncio.create_task(self._plan_all(book, jobs, planned))
        window: deque[_Pending] = deque()
        depth = self._window()
        try:
            while (pending := await planned.get()) is not None:
                if pending.index < done:
                    continue
                if isinstance(pending.planned, PlannedChunk):
                    pending.future = await self._submit(jobs[pending.chapter], pending.planned)
                window.append(pending)
                if len(window) > depth:
                    await self._commit(jobs, window.popleft(), window[0])
            await planning
            while window:
                head = window.popleft()
                await self._commit(jobs, head, window[0] if window else None)
        finally:
            planning.cancel()
            for pending in window:
                if pending.future is not None:
                    pending.future.cancel()

    def _window(self) -> int:
        """Chunks kept on the engine: enough to keep every lane (and a GPU's batch) busy."""
        scheduler = self.service.scheduler
        batch = scheduler.policy.max_batch_size if scheduler.policy is not None else 1
        return max(2, min(batch * scheduler.lanes + 1, 64))

    async def _plan_all(
        self, book: Book, jobs: Sequence[SpeechJob], out: asyncio.Queue[_Pending | None]
    ) -> None:
        """Every unit of the book into `out`, then None (also when planning fails: the failure is this
        task's, which the synthesis awaits)."""
        try:
            await self._plan_units(book, jobs, out)
        finally:
            out.put_nowait(None)

    async def _plan_units(
        self, book: Book, jobs: Sequence[SpeechJob], out: asyncio.Queue[_Pending | None]
    ) -> None:
        index = chunks = 0
        before = 0  # characters of the chapters before
        vocab = self.service.scheduler.engine.vocab
        for number, (chapter, job) in enumerate(zip(book.chapters, jobs, strict=True)):
            text_start = chapter_script(chapter)[1]
            read, spoken = 0, False
            async for planned in self.service.book_planner.plan_parts(self.service.parts(job), vocab):
                if isinstance(planned, PlannedChunk):
                    ends = [word.origin[1] for word in planned.words if word.origin is not None]
                    read = max([read, *(min(max(end - text_start, 0), len(chapter.text)) for end in ends)])
                    chunks += 1
                await out.put(_Pending(index, number, planned, before + read, spoken))
                spoken = spoken or isinstance(planned, PlannedChunk)
                index += 1
            before += len(chapter.text)
            if number < len(book.chapters) - 1:
                await out.put(_Pending(index, number, PlannedPause(CHAPTER_GAP_S), before, spoken))
                index += 1
        self._chunks_total = chunks
        await asyncio.to_thread(self.store.set_chunks_total, self.record.id, chunks)

    async def _submit(self, job: SpeechJob, planned: PlannedChunk) -> asyncio.Future[ChunkAudio]:
        while True:
            try:
                return self.service.submit(job, planned)
            except ServiceUnavailableError:
                await asyncio.sleep(
                    QUEUE_FULL_RETRY_S
                )  # the queue is full of requests' chunks: they go first

    async def _commit(self, jobs: Sequence[SpeechJob], pending: _Pending, following: _Pending | None) -> None:
        job = jobs[pending.chapter]
        timed: list[list[float | None]] | None = None
        if isinstance(pending.planned, PlannedPause):
            samples = self.service.pause(pending.planned, after_speech=pending.after_speech)
        else:
            assert pending.future is not None
            chunk = await chunk_result(pending.future)
            before_pause = following is not None and isinstance(following.planned, PlannedPause)
            samples, spoken = self.service.shape(
                job, pending.planned, chunk, before_pause=before_pause, offset=0
            )
            if job.captions is not None:
                timed = [[*(word.origin or (None, None)), word.start, word.end] for word in spoken]
        unit = Unit(
            pending.index,
            pending.chapter,
            len(samples),
            pending.characters_done,
            isinstance(pending.planned, PlannedChunk),
            timed,
        )
        pcm = to_int16(samples).tobytes()
        held = await asyncio.to_thread(
            self.store.append,
            self.record.id,
            self.runner.owner,
            unit,
            pcm,
            chunks_total=self._chunks_total,
            rate=self._rate(pending.characters_done),
        )
        if not held:
            raise LostJob("the job was cancelled or taken over")

    def _rate(self, characters_done: int) -> float | None:
        elapsed = time.monotonic() - self._started
        made = characters_done - self._characters_at_start
        return made / elapsed if elapsed > 0 and made > 0 else None

    async def _finish(self, book: Book) -> None:
        record = await asyncio.to_thread(self.store.get, self.record.id)
        if record is None or record.state is not JobState.RUNNING:
            raise LostJob("the job was cancelled")
        ends = [*record.chapter_starts[1:], record.samples_done]
        marks = [
            ChapterMark(chapter.title, start or 0, end or 0)
            for chapter, start, end in zip(record.chapters, record.chapter_starts, ends, strict=True)
        ]
        options, settings = record.options, self.runner.settings
        spec = book_spec(
            BookFormat(options.response_format), mp3_kbps=settings.mp3_kbps, mp3_quality=settings.mp3_quality
        )
        size = await asyncio.to_thread(
            assemble,
            self.store.audio_path(record.id),
            self.store.output_path(record),
            spec,
            sample_rate=self.service.sample_rate,
            title=book.title,
            chapters=marks,
        )
        if not await asyncio.to_thread(self.store.finish, record.id, self.runner.owner, size):
            raise LostJob("the job was cancelled")
        self.store.audio_path(record.id).unlink(missing_ok=True)


def _failure(error: BaseException) -> tuple[str, str]:
    """A failed job's message and code."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "The disk is full: the job's audio could not be written.", "disk_full"
    if isinstance(error, APIError):
        return error.message, error.code or "synthesis_failed"
    return f"The job failed: {type(error).__name__}: {error}", "job_failed"
