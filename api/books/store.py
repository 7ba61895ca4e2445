"""Where book jobs live: one SQLite database (the jobs, and each unit of audio made) and a folder per job
(the book's text, its audio so far, the finished file). Every method blocks: call them off the event loop.

Durability: a unit's audio is appended to the job's audio.pcm and flushed to disk before its row is
committed, so after a crash the rows say how much of the file is whole, and the rest is cut off when the
job resumes. Workers and replicas that share the folder share the jobs: a job is claimed with a lease
that its runner renews; a lease that runs out (the runner died) lets another take the job over.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from api.books.read import Book, Chapter

BYTES_PER_SAMPLE = 2  # audio.pcm holds int16 mono at the model's rate
JOB_ID = re.compile(r"job_[0-9a-f]{20}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,
    title TEXT NOT NULL,
    options TEXT NOT NULL,
    chapters TEXT NOT NULL,
    characters_total INTEGER NOT NULL,
    characters_done INTEGER NOT NULL DEFAULT 0,
    units_done INTEGER NOT NULL DEFAULT 0,
    chunks_done INTEGER NOT NULL DEFAULT 0,
    chunks_total INTEGER,
    samples_done INTEGER NOT NULL DEFAULT 0,
    rate REAL,
    error TEXT,
    error_code TEXT,
    owner TEXT,
    lease_until REAL NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL,
    file_bytes INTEGER,
    chapter_starts TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS units (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    chapter INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    characters_done INTEGER NOT NULL,
    spoken INTEGER NOT NULL,
    timed TEXT,
    PRIMARY KEY (job_id, idx)
);
"""


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


UNFINISHED = (JobState.QUEUED, JobState.RUNNING)


@dataclass(frozen=True)
class JobOptions:
    """How a job speaks and what it makes."""

    voice: str
    speed: float = 1.0
    lang_code: str | None = None
    response_format: str = "m4b"
    captions: bool = False


@dataclass(frozen=True)
class ChapterInfo:
    title: str
    characters: int


@dataclass(frozen=True)
class Unit:
    """One unit of a job's audio (a chunk of speech, or a pause), as committed."""

    index: int
    chapter: int
    samples: int
    characters_done: int  # of the whole book, once this unit is made
    spoken: bool  # a chunk of speech (a pause is not)
    timed: list[list[float | None]] | None = None  # [origin start, origin end, start s, end s], unit-relative


@dataclass
class JobRecord:
    id: str
    created_at: float
    state: JobState
    title: str
    options: JobOptions
    chapters: list[ChapterInfo]
    characters_total: int
    characters_done: int = 0
    units_done: int = 0
    chunks_done: int = 0
    chunks_total: int | None = None
    samples_done: int = 0
    rate: float | None = None  # characters per second, as measured by its runner
    error: str | None = None
    error_code: str | None = None
    owner: str | None = None
    lease_until: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    file_bytes: int | None = None
    chapter_starts: list[int | None] = field(default_factory=list)  # samples; None until its first unit


class JobStore:
    """The jobs' database and folders under `root` (KOKORO_DATA_DIR/jobs)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._db = root / "jobs.sqlite3"
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    def folder(self, job_id: str) -> Path:
        if not JOB_ID.fullmatch(job_id):  # never a path outside the jobs' folder ("..", "/")
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / job_id

    def audio_path(self, job_id: str) -> Path:
        return self.folder(job_id) / "audio.pcm"

    def output_path(self, record: JobRecord) -> Path:
        return self.folder(record.id) / f"book.{record.options.response_format}"

    def create(self, book: Book, options: JobOptions) -> JobRecord:
        """A queued job; its book is on disk before its row exists."""
        job_id = f"job_{uuid.uuid4().hex[:20]}"  # JOB_ID
        folder = self.folder(job_id)
        folder.mkdir(parents=True)
        text = {"title": book.title, "chapters": [asdict(chapter) for chapter in book.chapters]}
        _write_atomically(folder / "book.json", json.dumps(text).encode())
        chapters = [ChapterInfo(chapter.title, len(chapter.text)) for chapter in book.chapters]
        record = JobRecord(
            job_id, time.time(), JobState.QUEUED, book.title, options, chapters, book.characters
        )
        with self._transaction() as db:
            db.execute(
                "INSERT INTO jobs (id, created_at, state, title, options, chapters, characters_total) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    record.created_at,
                    record.state.value,
                    record.title,
                    json.dumps(asdict(options)),
                    json.dumps([asdict(chapter) for chapter in chapters]),
                    record.characters_total,
                ),
            )
        return record

    def book(self, job_id: str) -> Book:
        data = json.loads((self.folder(job_id) / "book.json").read_text())
        return Book(data["title"], tuple(Chapter(**chapter) for chapter in data["chapters"]))

    def get(self, job_id: str) -> JobRecord | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            return _record(row)

    def recent(self, limit: int) -> list[JobRecord]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)).fetchall()
        return [_record(row) for row in rows]

    def claim(self, owner: str, lease_s: float, now: float | None = None) -> JobRecord | None:
        """The oldest unfinished job that nobody holds, now held by `owner` until `lease_s` from now; None
        when there is none. Nobody holds a job that is queued, whose lease ran out, or whose holder is a
        process of this host that is gone (killed: its job resumes at once, not after its lease)."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, owner, lease_until FROM jobs WHERE state IN ('queued', 'running') "
                "ORDER BY created_at"
            ).fetchall()
            free = (job_id for job_id, holder, until in rows if until < now or _orphaned(holder, owner))
            job_id = next(free, None)
            if job_id is None:
                return None
            db.execute(
                "UPDATE jobs SET state = 'running', owner = ?, lease_until = ?, "
                "started_at = COALESCE(started_at, ?) WHERE id = ?",
                (owner, now + lease_s, now, job_id),
            )
        return self.get(job_id)

    def release(self, job_id: str, owner: str) -> None:
        """Give up `owner`'s lease (a worker that stops): the next worker to look takes the job over."""
        with self._transaction() as db:
            db.execute("UPDATE jobs SET lease_until = 0 WHERE id = ? AND owner = ?", (job_id, owner))

    def renew(self, job_id: str, owner: str, lease_s: float) -> bool:
        """Extend `owner`'s lease on a running job; False when it no longer holds it (cancelled, taken)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ? AND state = 'running'",
                (time.time() + lease_s, job_id, owner),
            )
        return cursor.rowcount == 1

    def units(self, job_id: str) -> list[Unit]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT idx, chapter, samples, characters_done, spoken, timed FROM units WHERE job_id = ? "
                "ORDER BY idx",
                (job_id,),
            ).fetchall()
        return [
            Unit(row[0], row[1], row[2], row[3], bool(row[4]), json.loads(row[5]) if row[5] else None)
            for row in rows
        ]

    def resume_offset(self, job_id: str, units: Sequence[Unit]) -> int:
        """Cut the job's audio file back to what its committed units hold (a crash may have left a unit's
        bytes without its row); returns the file's length."""
        length = sum(unit.samples for unit in units) * BYTES_PER_SAMPLE
        path = self.audio_path(job_id)
        with open(path, "ab") as audio:
            if audio.tell() < length:
                raise RuntimeError(f"{path} holds {audio.tell()} bytes, its units {length}: it was cut short")
            if audio.tell() > length:
                audio.truncate(length)
        return length

    def append(
        self, job_id: str, owner: str, unit: Unit, pcm: bytes, *, chunks_total: int | None, rate: float | None
    ) -> bool:
        """Write a unit's audio, flush it to disk, then commit its row and the job's progress; False (and
        nothing committed) when `owner` no longer holds the job."""
        with open(self.audio_path(job_id), "ab") as audio:
            audio.write(pcm)
            audio.flush()
            os.fsync(audio.fileno())
        with self._transaction() as db:
            held = db.execute(
                "SELECT 1 FROM jobs WHERE id = ? AND owner = ? AND state = 'running'", (job_id, owner)
            ).fetchone()
            if held is None:
                return False
            done, starts_text = db.execute(
                "SELECT samples_done, chapter_starts FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            starts = json.loads(starts_text)
            if len(starts) <= unit.chapter:  # the chapter's first unit: it starts where the audio ends now
                starts += [None] * (unit.chapter - len(starts)) + [done]
            db.execute(
                "INSERT INTO units (job_id, idx, chapter, samples, characters_done, spoken, timed) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    unit.index,
                    unit.chapter,
                    unit.samples,
                    unit.characters_done,
                    int(unit.spoken),
                    None if unit.timed is None else json.dumps(unit.timed),
                ),
            )
            db.execute(
                "UPDATE jobs SET units_done = units_done + 1, chunks_done = chunks_done + ?, "
                "samples_done = samples_done + ?, characters_done = ?, chunks_total = ?, rate = ?, "
                "chapter_starts = ? WHERE id = ?",
                (
                    int(unit.spoken),
                    unit.samples,
                    unit.characters_done,
                    chunks_total,
                    rate,
                    json.dumps(starts),
                    job_id,
                ),
            )
        return True

    def set_chunks_total(self, job_id: str, chunks_total: int) -> None:
        with self._transaction() as db:
            db.execute("UPDATE jobs SET chunks_total = ? WHERE id = ?", (chunks_total, job_id))

    def finish(self, job_id: str, owner: str, file_bytes: int) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = 'done', finished_at = ?, file_bytes = ?, lease_until = 0, "
                "characters_done = characters_total WHERE id = ? AND owner = ? AND state = 'running'",
                (time.time(), file_bytes, job_id, owner),
            )
        return cursor.rowcount == 1

    def fail(self, job_id: str, message: str, code: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'failed', error = ?, error_code = ?, finished_at = ?, "
                "lease_until = 0 WHERE id = ? AND state IN ('queued', 'running')",
                (message, code, time.time(), job_id),
            )

    def delete(self, job_id: str) -> bool:
        """Forget the job and remove its folder (its runner stops at its next unit or renewal); False when
        there is no such job."""
        if not JOB_ID.fullmatch(job_id):
            return False
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            db.execute("DELETE FROM units WHERE job_id = ?", (job_id,))
        if cursor.rowcount != 1:
            return False
        shutil.rmtree(self.folder(job_id), ignore_errors=True)
        return True

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self._db, timeout=30, isolation_level=None)) as db:
            db.row_factory = sqlite3.Row
            yield db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction taken at once (BEGIN IMMEDIATE), so two claimers never pick the same job."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def _record(row: sqlite3.Row) -> JobRecord:
    """A row of `jobs` (its columns are named as JobRecord's fields), its JSON columns read."""
    values: dict[str, Any] = dict(zip(row.keys(), row, strict=True))
    chapters = [ChapterInfo(**chapter) for chapter in json.loads(values["chapters"])]
    starts = json.loads(values["chapter_starts"])
    values.update(
        state=JobState(values["state"]),
        options=JobOptions(**json.loads(values["options"])),
        chapters=chapters,
        chapter_starts=[*starts, *[None] * (len(chapters) - len(starts))],
    )
    return JobRecord(**values)


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def owner_id() -> str:
    """This process, as a job's holder: host, process id, and a nonce (a restarted container's new server
    process may have the old one's host name and process id)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _orphaned(holder: str | None, claimer: str) -> bool:
    """Whether `holder` was a process of the claimer's host that is gone: its id is not alive, or it is
    the claimer's own id with another nonce (the process before a restart)."""
    if holder is None:
        return True
    host, _, rest = holder.partition(":")
    pid_text, _, nonce = rest.partition(":")
    my_host, my_pid, my_nonce = claimer.split(":")
    if host != my_host or not pid_text.isdigit():
        return False
    if pid_text == my_pid:
        return nonce != my_nonce
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False
