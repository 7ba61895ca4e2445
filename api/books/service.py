"""The book service: what the job routes call. Reads a book (off the event loop), checks its voice and
size, queues it in the store and wakes this worker's runner; answers a job's state from the store (any
worker or replica on the same store answers alike); serves the finished file and captions."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from api.audio.formats import BOOK_CONTENT_TYPES, BookFormat
from api.books.queries import JobStore
from api.books.read import Book, BookError, read_book, read_markdown, read_text
from api.books.records import JOB_ID, JobOptions, JobRecord, JobState, Unit
from api.books.runner import JobRunner, chapter_script
from api.errors import ConflictError, InvalidRequestError, NotFoundError
from api.protocol import BookJob, BookJobChapter, BookJobError, BookJobProgress, BookJobRequest
from api.settings import Settings
from api.speech.captions import Captions, Timed, WordTime
from api.speech.service import SpeechService
from api.text.subtitles import SubtitleFormat, TimedWord, render

_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,()-]")


class BookService:
    """Book jobs for the routes: create, list, show, download, captions, delete."""

    def __init__(self, store: JobStore, speech: SpeechService, runner: JobRunner, settings: Settings) -> None:
        self.store = store
        self.speech = speech
        self.runner = runner
        self.settings = settings
        # A book file, or the JSON that carries one, with room for the form's framing and fields.
        self.max_body_bytes = settings.max_book_bytes + 64 * 1024

    async def create(self, request: BookJobRequest) -> BookJob:
        read = read_markdown if request.input_format == "markdown" else read_text
        return await self._create(await self._read(read, request.input, title=request.title), request)

    async def create_from_file(self, data: bytes, filename: str, request: BookJobRequest) -> BookJob:
        if len(data) > self.settings.max_book_bytes:
            raise InvalidRequestError(
                f"The file is {len(data)} bytes; the limit is {self.settings.max_book_bytes}.",
                param="file",
                code="file_too_large",
            )
        return await self._create(await self._read(read_book, data, filename, title=request.title), request)

    async def recent(self, limit: int) -> list[BookJob]:
        records = await asyncio.to_thread(self.store.recent, limit)
        return [self._job(record) for record in records]

    async def get(self, job_id: str) -> BookJob:
        return self._job(await self._record(job_id))

    async def audio(self, job_id: str) -> tuple[Path, str, str]:
        """The finished file, its content type and a file name for it."""
        record = await self._done(job_id)
        fmt = BookFormat(record.options.response_format)
        name = _FILENAME_UNSAFE.sub("", record.title).strip() or "book"
        path = await asyncio.to_thread(self.store.output, record)
        return path, BOOK_CONTENT_TYPES[fmt], f"{name}.{fmt.value}"

    async def captions(self, job_id: str, fmt: SubtitleFormat) -> str:
        record = await self._done(job_id)
        if not record.options.captions:
            raise InvalidRequestError(
                "This job was made without captions (captions: true when it is created).",
                param="captions",
                code="captions_off",
            )
        book = await asyncio.to_thread(self.store.book, job_id)
        units = await asyncio.to_thread(self.store.units, job_id)
        words = self._words(book, units)
        return render([TimedWord(word.word, word.start_time, word.end_time) for word in words], fmt)

    async def delete(self, job_id: str) -> None:
        self.runner.cancel(job_id)
        if not await asyncio.to_thread(self.store.delete, job_id):
            raise _not_found(job_id)

    async def _read(self, read: object, *args: object, title: str | None) -> Book:
        try:
            book: Book = await asyncio.to_thread(read, *args, title=title)  # type: ignore[arg-type]
        except BookError as exc:
            raise InvalidRequestError(str(exc), param="file", code="invalid_book") from exc
        return book

    async def _create(self, book: Book, request: BookJobRequest) -> BookJob:
        limit = self.settings.max_book_chars
        if book.characters > limit:
            raise InvalidRequestError(
                f"The book has {book.characters} characters of text; the limit is {limit}.",
                param="input",
                code="book_too_long",
            )
        voice = request.voice or self.settings.default_voice
        self.speech.check_voice(voice, request.lang_code)
        options = JobOptions(
            voice, request.speed, request.lang_code, request.response_format.value, request.captions
        )
        record = await asyncio.to_thread(self.store.create, book, options)
        self.runner.wake()
        return self._job(record)

    async def _record(self, job_id: str) -> JobRecord:
        if not JOB_ID.fullmatch(job_id):
            raise _not_found(job_id)
        record = await asyncio.to_thread(self.store.get, job_id)
        if record is None:
            raise _not_found(job_id)
        return record

    async def _done(self, job_id: str) -> JobRecord:
        record = await self._record(job_id)
        if record.state is not JobState.DONE:
            raise ConflictError(
                f"The job is {record.state.value}: its audio and captions come when it is done.",
                code="job_not_done",
            )
        return record

    def _words(self, book: Book, units: list[Unit]) -> list[WordTime]:
        """The captions' words: each chapter's spoken words, timed in the whole book, in its own text."""
        rate = self.speech.sample_rate
        words: list[WordTime] = []
        offset = 0
        by_chapter: dict[int, list[Timed]] = {}
        for unit in units:
            for origin_start, origin_end, start, end in unit.timed or []:
                origin = None if origin_start is None else (int(origin_start), int(origin_end or 0))
                by_chapter.setdefault(unit.chapter, []).append(
                    Timed(origin, offset / rate + float(start or 0), offset / rate + float(end or 0))
                )
            offset += unit.samples
        for number, chapter in enumerate(book.chapters):
            captions = Captions(self.speech.script_text(chapter_script(chapter)[0]))
            words += captions.add(by_chapter.get(number, []))
            words += captions.finish()
        return words

    def _job(self, record: JobRecord) -> BookJob:
        rate = self.speech.sample_rate
        options = record.options
        done = record.state is JobState.DONE
        remaining = record.characters_total - record.characters_done
        eta = None
        if record.state is JobState.RUNNING and record.rate:
            eta = round(remaining / record.rate, 1)
        starts = record.chapter_starts or [None] * len(record.chapters)
        return BookJob(
            id=record.id,
            created_at=int(record.created_at),
            state=record.state.value,
            title=record.title,
            voice=options.voice,
            speed=options.speed,
            lang_code=options.lang_code,
            response_format=BookFormat(options.response_format),
            captions=options.captions,
            progress=BookJobProgress(
                chunks_done=record.chunks_done,
                chunks_total=record.chunks_total,
                characters_done=record.characters_done,
                characters_total=record.characters_total,
                audio_seconds=round(record.samples_done / rate, 3),
                fraction=round(record.characters_done / max(record.characters_total, 1), 4),
            ),
            eta_seconds=eta,
            chapters=[
                BookJobChapter(
                    title=info.title,
                    characters=info.characters,
                    start_time=None if start is None else round(start / rate, 3),
                )
                for info, start in zip(record.chapters, starts, strict=True)
            ],
            error=BookJobError(message=record.error, code=record.error_code or "job_failed")
            if record.error
            else None,
            started_at=_seconds(record.started_at),
            finished_at=_seconds(record.finished_at),
            audio_url=f"/v1/audio/jobs/{record.id}/audio" if done else None,
            captions_url=f"/v1/audio/jobs/{record.id}/captions" if done and options.captions else None,
            bytes=record.file_bytes,
        )


def _seconds(timestamp: float | None) -> int | None:
    return None if timestamp is None else int(timestamp)


def _not_found(job_id: str) -> NotFoundError:
    return NotFoundError(f"No job '{job_id}'.", param="job_id", code="job_not_found")
