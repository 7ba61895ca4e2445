"""Runs book jobs in this worker beside every other worker and replica on the same store, at the
scheduler's background priority.

A job's units (its chunks of speech and its pauses, chapter after chapter) follow from its text alone:
one worker plans them all into the store (a worker that plans again after a crash plans the same units,
and those already there stay), and each is made with the same seed wherever it is made, so the finished
file does not depend on which worker made which unit, or on how often the work was taken over. Any
worker claims units a few at a time, as many as keep its engine busy, and commits each as it is made;
once every unit is in, one worker joins their audio into the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from api.audio.encoder import Chapter as ChapterMark
from api.audio.encoder import to_int16
from api.audio.formats import BookFormat
from api.books.assemble import assemble, book_spec
from api.books.owners import owner_id
from api.books.queries import JobStore
from api.books.read import Book, Chapter
from api.books.records import ClaimedUnit, JobRecord, JobState, PlannedUnit, Task
from api.engine.base import ChunkAudio
from api.errors import APIError, ServiceUnavailableError
from api.metrics import Metrics
from api.settings import Settings
from api.speech.job import SpeechJob
from api.speech.pipeline import chunk_result
from api.speech.service import SpeechService
from api.text.chunk import Ending
from api.text.plan import Planned, PlannedChunk, PlannedPause, PlannedWord

logger = logging.getLogger(__name__)

# Silence between one chapter and the next (its chapter's last unit).
CHAPTER_GAP_S = 2.0
# Without work, the runner looks for some this often (a job posted to this worker wakes it at once).
IDLE_POLL_S = 2.0
# Waits before submitting again when the engine's queue is full.
QUEUE_FULL_RETRY_S = 0.5
# A unit made while the jobs database is unreachable is committed again this often, until its lease
# would have run out (another worker may take it from then on).
COMMIT_RETRY_S = 1.0
# Planned units go into the store this many at a time (the first at once, so work starts at once).
PLAN_BATCH = 16
# Jobs whose book and chapters this worker keeps ready.
_JOBS_KEPT = 4


class LostJob(Exception):
    """The worker no longer holds the work: the job was cancelled or failed, or another took it over."""


@dataclass(frozen=True)
class UnitPlan:
    """What makes a unit: a chunk (and whether a pause follows it, which then has its silence instead of
    the chunk's own), or a pause (and whether speech of its chapter came before it)."""

    planned: Planned
    before_pause: bool = False
    after_speech: bool = False

    def dumps(self) -> str:
        if isinstance(self.planned, PlannedPause):
            return json.dumps({"pause": self.planned.seconds, "after_speech": self.after_speech})
        chunk = self.planned
        return json.dumps(
            {
                "tokens": chunk.tokens,
                "ending": chunk.ending.value,
                "text": chunk.text,
                "words": [
                    [*(word.origin or (None, None)), *(word.tokens or (None, None))] for word in chunk.words
                ],
                "voice": chunk.voice,
                "rate": chunk.rate,
                "before_pause": self.before_pause,
            }
        )

    @classmethod
    def loads(cls, text: str) -> UnitPlan:
        data = json.loads(text)
        if "pause" in data:
            return cls(PlannedPause(data["pause"]), after_speech=data["after_speech"])
        words = tuple(
            PlannedWord(
                None if origin_start is None else (origin_start, origin_end),
                None if first is None else (first, last),
            )
            for origin_start, origin_end, first, last in data["words"]
        )
        chunk = PlannedChunk(
            tuple(data["tokens"]), Ending(data["ending"]), data["text"], words, data["voice"], data["rate"]
        )
        return cls(chunk, before_pause=data["before_pause"])


def chapter_script(chapter: Chapter) -> tuple[str, int]:
    """What a chapter's speech reads (its heading, if it has one apart from its text, then its text), and
    where its text starts in it."""
    heading = chapter.heading.strip()
    if not heading:
        return chapter.text, 0
    lead = heading if heading[-1] in ".!?:;" else f"{heading}."
    return f"{lead}\n\n{chapter.text}", len(lead) + 2


class _JobContext:
    """A job's book and options, and its chapters prepared for speech as units of them come."""

    def __init__(self, record: JobRecord, book: Book, service: SpeechService) -> None:
        self.record = record
        self.book = book
        self._service = service
        self._chapters: dict[int, SpeechJob] = {}
        self.making = False  # this worker has claimed units of it

    def chapter(self, number: int) -> SpeechJob:
        job = self._chapters.get(number)
        if job is None:
            options = self.record.options
            job = self._service.prepare_chapter(
                chapter_script(self.book.chapters[number])[0],
                voice=options.voice,
                speed=options.speed,
                lang_code=options.lang_code,
                captions=options.captions,
            )
            self._chapters[number] = job
        return job


class JobRunner:
    """This worker's share of the book jobs: a job's task (planning, or assembling) when one is free,
    and units to make, as many at once as keep the engine busy. `wake` says a job was posted or planned
    here; `cancel` stops a job's work here."""

    def __init__(
        self,
        store: JobStore,
        service: SpeechService,
        settings: Settings,
        metrics: Metrics | None = None,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.service = service
        self.settings = settings
        self.owner = owner or owner_id()
        self.lease_s = settings.job_lease_s
        self._wake = asyncio.Event()
        self._task: tuple[str, asyncio.Task[None]] | None = None
        self._units: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._jobs: OrderedDict[str, _JobContext] = OrderedDict()

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        if self._task is not None and self._task[0] == job_id:
            self._task[1].cancel()
        for (unit_job, _), task in list(self._units.items()):
            if unit_job == job_id:
                task.cancel()
        self._jobs.pop(job_id, None)

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                try:
                    await self._look()
                except ServiceUnavailableError as exc:  # the jobs database: try again later
                    logger.warning("book jobs: %s", exc.message)
                except Exception:  # a database error: logged, and looked again at the next poll
                    logger.exception("book jobs: looking for work failed")
                waiting = [*self._units.values(), *([self._task[1]] if self._task else [])]
                wake = asyncio.create_task(self._wake.wait())
                try:
                    await asyncio.wait(
                        [wake, *waiting], timeout=IDLE_POLL_S, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    wake.cancel()
                self._wake.clear()
        finally:
            heartbeat.cancel()
            work = [*self._units.values(), *([self._task[1]] if self._task else [])]
            for task in work:
                task.cancel()
            await asyncio.gather(*work, heartbeat, return_exceptions=True)
            with contextlib.suppress(Exception):  # another worker takes over at once
                await asyncio.to_thread(self.store.release, self.owner)

    async def _look(self) -> None:
        """Take a free task and units, up to the window (not while the model loads or failed to; an
        idle-unloaded one loads again for them)."""
        if not self.service.scheduler.serves:
            return
        if self._task is None:
            claimed = await asyncio.to_thread(self.store.claim_task, self.owner, self.lease_s)
            if claimed is not None:
                record, kind = claimed
                step = self._plan if kind is Task.PLAN else self._assemble
                task = asyncio.create_task(self._guarded(record.id, functools.partial(step, record)))
                self._task = (record.id, task)
                task.add_done_callback(lambda _: setattr(self, "_task", None))
        free = self._window() - len(self._units)
        if free <= 0:
            return
        for unit in await asyncio.to_thread(self.store.claim_units, self.owner, free, self.lease_s):
            key = (unit.job_id, unit.index)
            task = asyncio.create_task(self._guarded(unit.job_id, functools.partial(self._make, unit)))
            self._units[key] = task
            task.add_done_callback(lambda _, key=key: self._units.pop(key, None))  # type: ignore[misc]

    def _window(self) -> int:
        """Units kept on the engine: enough to keep every lane (and a GPU's batch) busy."""
        scheduler = self.service.scheduler
        batch = scheduler.policy.max_batch_size if scheduler.policy is not None else 1
        return max(2, min(batch * scheduler.lanes + 1, 64))

    async def _heartbeat(self) -> None:
        """Renew every lease this worker holds; stop its work on jobs it no longer holds."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            # The work before the renewal: what is claimed later is not in the renewal's answer.
            working = [*self._units.items(), *([self._task] if self._task else [])]
            tasks = [self._task[0]] if self._task else []
            try:
                held = await asyncio.to_thread(
                    self.store.renew, self.owner, self.lease_s, tasks, list(self._units)
                )
                if self.metrics is not None:  # the queue's depth, for scaling on it
                    waiting = await asyncio.to_thread(self.store.units_waiting)
                    self.metrics.book_units_waiting.set(waiting)
            except ServiceUnavailableError as exc:
                logger.warning("book jobs: leases not renewed: %s", exc.message)
                continue
            except Exception:
                logger.exception("book jobs: leases not renewed")
                continue
            for key, task in working:
                job_id = key[0] if isinstance(key, tuple) else key
                if job_id not in held and not task.done():
                    logger.info("book job %s: no longer held here (cancelled, failed or taken over)", job_id)
                    task.cancel()

    async def _guarded(self, job_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run a task or a unit; a failure fails the job (and stops its work here). The work is made here,
        so that a task cancelled before it starts leaves no coroutine that was never awaited."""
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except LostJob as exc:
            logger.info("book job %s: %s", job_id, exc)
            self.cancel(job_id)
        except (
            ServiceUnavailableError
        ) as exc:  # the database: the lease runs out, and the work is taken again
            logger.warning("book job %s: %s", job_id, exc.message)
        except Exception as error:  # noqa: BLE001 - any failure is the job's, with its reason
            try:
                await self._fail(job_id, error)
            except Exception as unrecorded:  # noqa: BLE001 - e.g. the database's volume is full
                # Nothing is lost: the job's lease runs out, and it is taken again at its first unit not made.
                logger.error(
                    "book job %s: %s, and its failure could not be recorded: %s", job_id, error, unrecorded
                )
                self.cancel(job_id)

    async def _fail(self, job_id: str, error: Exception) -> None:
        if await asyncio.to_thread(self.store.get, job_id) is None:
            logger.info("book job %s deleted while it ran", job_id)
            return
        message, code = _failure(error)
        logger.error("book job %s failed: %s", job_id, message, exc_info=error)
        await asyncio.to_thread(self.store.fail, job_id, message, code)
        self.cancel(job_id)

    async def _context(self, job_id: str) -> _JobContext:
        """The job's book and chapters, read the first time this worker works on it."""
        context = self._jobs.get(job_id)
        if context is None:
            record = await asyncio.to_thread(self.store.get, job_id)
            if record is None:
                raise LostJob("the job was deleted")
            book = await asyncio.to_thread(self.store.book, job_id)
            context = _JobContext(record, book, self.service)
            self._jobs[job_id] = context
            while len(self._jobs) > _JOBS_KEPT:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job_id)
        return context

    async def _plan(self, record: JobRecord) -> None:
        logger.info("book job %s (%s): planning (%d units made)", record.id, record.title, record.units_done)
        context = await self._context(record.id)
        batch: list[PlannedUnit] = []
        units = chunks = 0
        async for unit in self._planned_units(context):
            batch.append(unit)
            units, chunks = units + 1, chunks + int(unit.spoken)
            if len(batch) >= PLAN_BATCH or units == 1:
                await self._add(record.id, batch)
                batch = []
        await self._add(record.id, batch)
        if not await asyncio.to_thread(self.store.planned, record.id, self.owner, units, chunks):
            raise LostJob("the job's planning was taken over")
        logger.info("book job %s: %d units planned (%d chunks)", record.id, units, chunks)
        self.wake()

    async def _add(self, job_id: str, batch: Sequence[PlannedUnit]) -> None:
        if not await asyncio.to_thread(self.store.add_units, job_id, self.owner, batch):
            raise LostJob("the job's planning was taken over")
        self.wake()

    async def _planned_units(self, context: _JobContext) -> AsyncIterator[PlannedUnit]:
        """Every unit of the book in order, each knowing whether a pause follows it."""
        index = 0
        previous: tuple[int, Planned, int, bool] | None = None
        async for following in self._plans(context):
            if previous is not None:
                yield _unit(index, *previous, before_pause=isinstance(following[1], PlannedPause))
                index += 1
            previous = following
        if previous is not None:
            yield _unit(index, *previous, before_pause=False)

    async def _plans(self, context: _JobContext) -> AsyncIterator[tuple[int, Planned, int, bool]]:
        """Each unit's chapter, plan, how many characters of the chapter's text it completes, and whether
        speech of its chapter came before it. A chapter's gap completes its text (a tail of symbols no word
        was found in); the job's end completes the book's."""
        vocab = self.service.scheduler.engine.vocab
        book = context.book
        for number, chapter in enumerate(book.chapters):
            text_start = chapter_script(chapter)[1]
            read, spoken = 0, False
            job = context.chapter(number)
            async for planned in self.service.book_planner.plan_parts(self.service.parts(job), vocab):
                characters = 0
                if isinstance(planned, PlannedChunk):
                    ends = [word.origin[1] for word in planned.words if word.origin is not None]
                    now_read = max(
                        [read, *(min(max(end - text_start, 0), len(chapter.text)) for end in ends)]
                    )
                    characters, read = now_read - read, now_read
                yield number, planned, characters, spoken
                spoken = spoken or isinstance(planned, PlannedChunk)
            if number < len(book.chapters) - 1:
                yield number, PlannedPause(CHAPTER_GAP_S), len(chapter.text) - read, spoken

    async def _make(self, unit: ClaimedUnit) -> None:
        context = await self._context(unit.job_id)
        if not context.making:
            context.making = True
            logger.info(
                "book job %s (%s): making units from unit %d", unit.job_id, context.record.title, unit.index
            )
        plan = UnitPlan.loads(unit.plan)
        timed: list[list[float | None]] | None = None
        if isinstance(plan.planned, PlannedPause):
            samples = self.service.pause(plan.planned, after_speech=plan.after_speech)
        else:
            job = context.chapter(unit.chapter)
            chunk = await chunk_result(await self._submit(job, plan.planned))
            samples, spoken = self.service.shape(
                job, plan.planned, chunk, before_pause=plan.before_pause, offset=0
            )
            if job.captions is not None:
                timed = [[*(word.origin or (None, None)), word.start, word.end] for word in spoken]
        pcm = to_int16(samples).tobytes()
        kept = await self._commit(unit, pcm, timed)
        if self.metrics is not None:
            self.metrics.book_units.labels(outcome="kept" if kept else "not_kept").inc()
        if not kept:
            record = await asyncio.to_thread(self.store.get, unit.job_id)
            if record is None or record.state is not JobState.RUNNING:
                raise LostJob(f"unit {unit.index} not kept: the job was cancelled")
            # Its lease ran out (this worker could not renew it) and another worker made it, or is making it.
            logger.info("book job %s: unit %d taken over by another worker", unit.job_id, unit.index)
        self.wake()  # its slot is free; the last unit's commit lets the file be made

    async def _commit(self, unit: ClaimedUnit, pcm: bytes, timed: list[list[float | None]] | None) -> bool:
        """The unit's audio into the store; tried again while the database is unreachable, until the unit's
        lease would have run out, so that a database restarted under a job loses none of the work done."""
        deadline = time.monotonic() + self.lease_s
        while True:
            try:
                return await asyncio.to_thread(
                    self.store.commit, unit.job_id, unit.index, self.owner, pcm, timed
                )
            except ServiceUnavailableError as exc:
                if time.monotonic() + COMMIT_RETRY_S > deadline:
                    raise
                logger.warning(
                    "book job %s: unit %d not committed yet: %s", unit.job_id, unit.index, exc.message
                )
                await asyncio.sleep(COMMIT_RETRY_S)

    async def _submit(self, job: SpeechJob, planned: PlannedChunk) -> asyncio.Future[ChunkAudio]:
        while True:
            try:
                return self.service.submit(job, planned)
            except ServiceUnavailableError:  # the queue is full of requests' chunks: they go first
                await asyncio.sleep(QUEUE_FULL_RETRY_S)

    async def _assemble(self, record: JobRecord) -> None:
        logger.info("book job %s: every unit made, making the file", record.id)
        context = await self._context(record.id)
        work = self.store.work_dir(record.id)
        await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
        pcm = work / "audio.pcm"
        await asyncio.to_thread(self._join, record.id, pcm)
        ends = [*record.chapter_starts[1:], record.samples_done]
        marks = [
            ChapterMark(chapter.title, start or 0, end or 0)
            for chapter, start, end in zip(record.chapters, record.chapter_starts, ends, strict=True)
        ]
        options, settings = record.options, self.settings
        spec = book_spec(
            BookFormat(options.response_format), mp3_kbps=settings.mp3_kbps, mp3_quality=settings.mp3_quality
        )
        output = work / f"book.{options.response_format}"
        try:
            await asyncio.to_thread(
                assemble,
                pcm,
                output,
                spec,
                sample_rate=self.service.sample_rate,
                title=context.book.title,
                chapters=marks,
            )
            if not await asyncio.to_thread(self.store.finish, record.id, self.owner, output):
                raise LostJob("the job was cancelled")
        except BaseException:
            output.unlink(missing_ok=True)
            raise
        finally:
            pcm.unlink(missing_ok=True)
        logger.info("book job %s done", record.id)

    def _join(self, job_id: str, path: Path) -> None:
        with open(path, "wb") as file:
            for audio in self.store.audio(job_id):
                file.write(audio)


def _unit(
    index: int, chapter: int, planned: Planned, characters: int, after_speech: bool, *, before_pause: bool
) -> PlannedUnit:
    spoken = isinstance(planned, PlannedChunk)
    plan = UnitPlan(planned, before_pause=before_pause and spoken, after_speech=after_speech)
    return PlannedUnit(index, chapter, spoken, characters, plan.dumps())


def _failure(error: BaseException) -> tuple[str, str]:
    """A failed job's message and code."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "The disk is full: the job's audio could not be written.", "disk_full"
    if isinstance(error, sqlite3.OperationalError) and "full" in str(error):
        return "The disk is full: the job's audio could not be written.", "disk_full"
    if isinstance(error, psycopg.errors.DiskFull):
        return "The jobs database's disk is full.", "disk_full"
    if isinstance(error, APIError):
        return error.message, error.code or "synthesis_failed"
    return f"The job failed: {type(error).__name__}: {error}", "job_failed"
