"""Where book jobs live: a database of the jobs and their units (each unit a chunk of speech or a pause,
planned ahead with everything needed to make it, then its audio once made), and the finished files.

Two stores, one schema and one set of queries: SQLite under a data directory (the embedded default: the
workers and the replicas of one machine share it), and PostgreSQL (replicas on many machines share it).
A job moves through two kinds of work. Its *task* (planning its units, later assembling its file) is held
by one worker at a time with a lease on the job's row. Its *units* are claimed a few at a time by any
worker with a lease on each unit (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so claimers never wait on each
other or take the same unit); a unit's audio and its row are committed in one transaction. A lease that
runs out (its holder died) lets another take the work over; a holder on this host whose process is gone
is an orphan at once. Every method blocks: call them off the event loop.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import shutil
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from api.books.read import Book, Chapter
from api.errors import ServiceUnavailableError

logger = logging.getLogger(__name__)

BYTES_PER_SAMPLE = 2  # a unit's audio is int16 mono at the model's rate
JOB_ID = re.compile(r"job_[0-9a-f]{20}")
# A finished file is kept in PostgreSQL in parts of this size (bytea values stay well under its limits).
FILE_PART_BYTES = 4 * 1024 * 1024
# Units' audio read back for assembly this many at a time.
_AUDIO_BATCH = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    created_at {real} NOT NULL,
    state TEXT NOT NULL,
    title TEXT NOT NULL,
    options TEXT NOT NULL,
    chapters TEXT NOT NULL,
    book TEXT NOT NULL,
    characters_total BIGINT NOT NULL,
    characters_done BIGINT NOT NULL DEFAULT 0,
    units_done INTEGER NOT NULL DEFAULT 0,
    units_total INTEGER,
    chunks_done INTEGER NOT NULL DEFAULT 0,
    chunks_total INTEGER,
    samples_done BIGINT NOT NULL DEFAULT 0,
    prefix_units INTEGER NOT NULL DEFAULT 0,
    prefix_samples BIGINT NOT NULL DEFAULT 0,
    rate {real},
    rate_since {real},
    rate_characters BIGINT NOT NULL DEFAULT 0,
    error TEXT,
    error_code TEXT,
    owner TEXT,
    lease_until {real} NOT NULL DEFAULT 0,
    started_at {real},
    finished_at {real},
    file_bytes BIGINT,
    chapter_starts TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS units (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    chapter INTEGER NOT NULL,
    spoken INTEGER NOT NULL,
    characters BIGINT NOT NULL,
    plan TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until {real} NOT NULL DEFAULT 0,
    samples BIGINT,
    timed TEXT,
    audio {blob},
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX IF NOT EXISTS units_to_do ON units (done, job_id, idx);
CREATE TABLE IF NOT EXISTS files (
    job_id TEXT NOT NULL,
    part INTEGER NOT NULL,
    data {blob} NOT NULL,
    PRIMARY KEY (job_id, part)
);
"""


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Task(str, enum.Enum):
    """A job's work that one worker holds at a time."""

    PLAN = "plan"  # plan every unit into the store
    ASSEMBLE = "assemble"  # every unit is made: make the file


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
class PlannedUnit:
    """A unit as planned: its place, and what makes it (`plan`, JSON that the runner writes and reads)."""

    index: int
    chapter: int
    spoken: bool  # a chunk of speech (a pause is not)
    characters: int  # of the book's text that this unit completes
    plan: str


@dataclass(frozen=True)
class ClaimedUnit:
    job_id: str
    index: int
    chapter: int
    plan: str


@dataclass(frozen=True)
class Unit:
    """One unit of a job's audio, as made."""

    index: int
    chapter: int
    samples: int
    spoken: bool
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
    units_total: int | None = None  # known once planning is over
    chunks_done: int = 0
    chunks_total: int | None = None
    samples_done: int = 0
    rate: float | None = None  # characters per second, over the last minute or so
    error: str | None = None
    error_code: str | None = None
    owner: str | None = None  # who holds its task
    lease_until: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    file_bytes: int | None = None
    chapter_starts: list[int | None] = field(default_factory=list)  # samples; None until all before is made


_COLUMNS = ", ".join(column.name for column in fields(JobRecord))


class Connection(Protocol):
    """What the queries need of a connection (sqlite3's, or psycopg's through `_Postgres`)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...


class JobStore:
    """The queries over either database; subclasses open connections and keep finished files."""

    # PostgreSQL's row locks for claims; SQLite takes the whole database for a write transaction instead.
    _lock_units = ""
    _lock_jobs = ""
    _lock_job = ""  # one job's row, waited for (a unit's commit serializes with the job's others)

    def __init__(self, local: Path) -> None:
        self.local = local  # this worker's own folder: work in progress and finished files (or their copies)
        local.mkdir(parents=True, exist_ok=True)

    # Connections, and the finished files, are the backend's.
    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        raise NotImplementedError
        yield  # pragma: no cover

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        raise NotImplementedError
        yield  # pragma: no cover

    def output(self, record: JobRecord) -> Path:
        """The finished file, on this machine's disk."""
        raise NotImplementedError

    def _keep_output(self, db: Connection, job_id: str, path: Path) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to close for SQLite; PostgreSQL's pool."""

    def work_dir(self, job_id: str) -> Path:
        """This worker's folder for the job (its audio joined, its file made)."""
        if not JOB_ID.fullmatch(job_id):  # never a path outside the jobs' folder ("..", "/")
            raise ValueError(f"not a job id: {job_id!r}")
        return self.local / job_id

    def create(self, book: Book, options: JobOptions) -> JobRecord:
        job_id = f"job_{uuid.uuid4().hex[:20]}"  # JOB_ID
        chapters = [ChapterInfo(chapter.title, len(chapter.text)) for chapter in book.chapters]
        record = JobRecord(
            job_id, time.time(), JobState.QUEUED, book.title, options, chapters, book.characters
        )
        text = {"title": book.title, "chapters": [asdict(chapter) for chapter in book.chapters]}
        with self._transaction() as db:
            db.execute(
                "INSERT INTO jobs (id, created_at, state, title, options, chapters, book, characters_total) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    record.created_at,
                    record.state.value,
                    record.title,
                    json.dumps(asdict(options)),
                    json.dumps([asdict(chapter) for chapter in chapters]),
                    json.dumps(text),
                    record.characters_total,
                ),
            )
        return record

    def book(self, job_id: str) -> Book:
        with self._connect() as db:
            row = db.execute("SELECT book FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        data = json.loads(row["book"])
        return Book(data["title"], tuple(Chapter(**chapter) for chapter in data["chapters"]))

    def get(self, job_id: str) -> JobRecord | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _record(row)

    def recent(self, limit: int) -> list[JobRecord]:
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        return [_record(row) for row in rows]

    def claim_task(
        self, owner: str, lease_s: float, now: float | None = None
    ) -> tuple[JobRecord, Task] | None:
        """The oldest unfinished job whose task nobody holds, its task now held by `owner`: planning while
        its units are not all planned, assembling once they are all made; None when there is none."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, owner, lease_until, units_total FROM jobs WHERE state IN ('queued', 'running') "
                f"AND (units_total IS NULL OR units_done = units_total) ORDER BY created_at{self._lock_jobs}"
            ).fetchall()
            free = (row for row in rows if row["lease_until"] < now or _orphaned(row["owner"], owner))
            row = next(free, None)
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET state = 'running', owner = ?, lease_until = ?, "
                "started_at = COALESCE(started_at, ?), rate_since = ?, rate_characters = characters_done "
                "WHERE id = ?",
                (owner, now + lease_s, now, now, row["id"]),
            )
            task = Task.PLAN if row["units_total"] is None else Task.ASSEMBLE
            record = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return _record(record), task

    def add_units(self, job_id: str, owner: str, units: Sequence[PlannedUnit]) -> bool:
        """Planned units into the store (ones already there stay as they are: planning again after a
        crash plans the same units); False when `owner` no longer holds the job's task."""
        with self._transaction() as db:
            if not _holds(db, job_id, owner):
                return False
            for unit in units:
                db.execute(
                    "INSERT INTO units (job_id, idx, chapter, spoken, characters, plan) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (job_id, unit.index, unit.chapter, int(unit.spoken), unit.characters, unit.plan),
                )
        return True

    def planned(self, job_id: str, owner: str, units_total: int, chunks_total: int) -> bool:
        """Planning is over: the job's totals are known and its task is free (for its assembly)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET units_total = ?, chunks_total = ?, owner = NULL, lease_until = 0 "
                "WHERE id = ? AND owner = ? AND state = 'running'",
                (units_total, chunks_total, job_id, owner),
            )
        return bool(cursor.rowcount == 1)

    def claim_units(
        self, owner: str, count: int, lease_s: float, now: float | None = None
    ) -> list[ClaimedUnit]:
        """Up to `count` units to make, oldest job first and in order, nobody else's, now `owner`'s until
        `lease_s` from now."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            holders = db.execute(
                "SELECT DISTINCT owner FROM units WHERE done = 0 AND lease_until >= ? AND owner IS NOT NULL",
                (now,),
            ).fetchall()
            orphans = [row["owner"] for row in holders if _orphaned(row["owner"], owner)]
            orphaned = f" OR u.owner IN ({', '.join('?' * len(orphans))})" if orphans else ""
            rows = db.execute(
                "SELECT u.job_id, u.idx, u.chapter, u.plan FROM units u JOIN jobs j ON j.id = u.job_id "
                f"WHERE j.state = 'running' AND u.done = 0 AND (u.lease_until < ?{orphaned}) "
                f"ORDER BY j.created_at, u.idx LIMIT ?{self._lock_units}",
                (now, *orphans, count),
            ).fetchall()
            for row in rows:
                db.execute(
                    "UPDATE units SET owner = ?, lease_until = ? WHERE job_id = ? AND idx = ?",
                    (owner, now + lease_s, row["job_id"], row["idx"]),
                )
        return [ClaimedUnit(row["job_id"], row["idx"], row["chapter"], row["plan"]) for row in rows]

    def renew(self, owner: str, lease_s: float) -> set[str]:
        """Extend every lease `owner` holds (tasks and units); the jobs it still holds anything of."""
        until = time.time() + lease_s
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET lease_until = ? WHERE owner = ? AND state = 'running'", (until, owner)
            )
            db.execute("UPDATE units SET lease_until = ? WHERE owner = ? AND done = 0", (until, owner))
            rows = db.execute(
                "SELECT id FROM jobs WHERE owner = ? AND state = 'running' UNION "
                "SELECT u.job_id FROM units u JOIN jobs j ON j.id = u.job_id "
                "WHERE u.owner = ? AND u.done = 0 AND j.state = 'running'",
                (owner, owner),
            ).fetchall()
        return {row["id"] for row in rows}

    def release(self, owner: str) -> None:
        """Give up everything `owner` holds (a worker that stops): the next worker to look takes it."""
        with self._transaction() as db:
            db.execute("UPDATE jobs SET lease_until = 0 WHERE owner = ?", (owner,))
            db.execute("UPDATE units SET lease_until = 0 WHERE owner = ? AND done = 0", (owner,))

    def commit(
        self, job_id: str, index: int, owner: str, pcm: bytes, timed: list[list[float | None]] | None
    ) -> bool:
        """A unit made: its audio and row, and the job's progress, in one transaction; False (nothing
        written) when the job is gone, not running, or the unit is no longer `owner`'s."""
        now = time.time()
        samples = len(pcm) // BYTES_PER_SAMPLE
        with self._transaction() as db:
            job = db.execute(
                "SELECT state, characters_done, prefix_units, prefix_samples, chapter_starts, rate, "
                f"rate_since, rate_characters FROM jobs WHERE id = ?{self._lock_job}",
                (job_id,),
            ).fetchone()
            if job is None or job["state"] != JobState.RUNNING.value:
                return False
            made_rows = db.execute(
                "UPDATE units SET done = 1, samples = ?, timed = ?, audio = ?, lease_until = 0 "
                "WHERE job_id = ? AND idx = ? AND owner = ? AND done = 0 RETURNING spoken, characters",
                (samples, None if timed is None else json.dumps(timed), pcm, job_id, index, owner),
            ).fetchall()  # all of it: SQLite finishes the statement only once its rows are read
            if len(made_rows) != 1:
                return False
            made = made_rows[0]
            prefix, prefix_samples = job["prefix_units"], job["prefix_samples"]
            starts = json.loads(job["chapter_starts"])
            following = db.execute(
                "SELECT idx, chapter, samples FROM units WHERE job_id = ? AND idx >= ? AND done = 1 "
                "ORDER BY idx",
                (job_id, prefix),
            ).fetchall()
            for row in following:  # the audio whole from the start grows: chapters' starts are known
                if row["idx"] != prefix:
                    break
                if len(starts) <= row["chapter"]:  # the chapter's first unit
                    starts += [None] * (row["chapter"] - len(starts)) + [prefix_samples]
                prefix, prefix_samples = prefix + 1, prefix_samples + row["samples"]
            characters = job["characters_done"] + made["characters"]
            rate, since, base = _rate(job["rate"], job["rate_since"], job["rate_characters"], characters, now)
            db.execute(
                "UPDATE jobs SET units_done = units_done + 1, chunks_done = chunks_done + ?, "
                "samples_done = samples_done + ?, characters_done = ?, prefix_units = ?, prefix_samples = ?, "
                "chapter_starts = ?, rate = ?, rate_since = ?, rate_characters = ? WHERE id = ?",
                (
                    made["spoken"],
                    samples,
                    characters,
                    prefix,
                    prefix_samples,
                    json.dumps(starts),
                    rate,
                    since,
                    base,
                    job_id,
                ),
            )
        return True

    def units(self, job_id: str) -> list[Unit]:
        """The units made, in order."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT idx, chapter, samples, spoken, timed FROM units WHERE job_id = ? AND done = 1 "
                "ORDER BY idx",
                (job_id,),
            ).fetchall()
        return [
            Unit(
                row["idx"],
                row["chapter"],
                row["samples"],
                bool(row["spoken"]),
                json.loads(row["timed"]) if row["timed"] else None,
            )
            for row in rows
        ]

    def audio(self, job_id: str) -> Iterator[bytes]:
        """Every unit's audio, in order (int16 mono)."""
        start = 0
        while True:
            with self._connect() as db:
                rows = db.execute(
                    "SELECT idx, audio FROM units WHERE job_id = ? AND idx >= ? AND done = 1 ORDER BY idx "
                    "LIMIT ?",
                    (job_id, start, _AUDIO_BATCH),
                ).fetchall()
            for row in rows:
                if row["idx"] != start:
                    raise RuntimeError(f"job {job_id}: unit {start} is not made")
                yield bytes(row["audio"])
                start += 1
            if len(rows) < _AUDIO_BATCH:
                return

    def finish(self, job_id: str, owner: str, path: Path) -> bool:
        """The job done, its file at `path` kept; its units' audio dropped (their timings stay)."""
        with self._transaction() as db:
            if not _holds(db, job_id, owner):
                return False
            self._keep_output(db, job_id, path)
            db.execute(
                "UPDATE jobs SET state = 'done', finished_at = ?, file_bytes = ?, lease_until = 0, "
                "owner = NULL, characters_done = characters_total WHERE id = ?",
                (time.time(), path.stat().st_size, job_id),
            )
            db.execute("UPDATE units SET audio = NULL WHERE job_id = ?", (job_id,))
        return True

    def fail(self, job_id: str, message: str, code: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET state = 'failed', error = ?, error_code = ?, finished_at = ?, "
                "lease_until = 0 WHERE id = ? AND state IN ('queued', 'running')",
                (message, code, time.time(), job_id),
            )
            db.execute("UPDATE units SET audio = NULL WHERE job_id = ?", (job_id,))

    def delete(self, job_id: str) -> bool:
        """Forget the job and remove its files (its workers stop at their next unit or renewal); False
        when there is no such job."""
        if not JOB_ID.fullmatch(job_id):
            return False
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            db.execute("DELETE FROM units WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM files WHERE job_id = ?", (job_id,))
        if cursor.rowcount != 1:
            return False
        shutil.rmtree(self.work_dir(job_id), ignore_errors=True)
        return True

    def units_waiting(self) -> int:
        """Units planned and not yet made, over every running job (the queue's depth)."""
        with self._connect() as db:
            row = db.execute(
                "SELECT COUNT(*) AS n FROM units u JOIN jobs j ON j.id = u.job_id "
                "WHERE u.done = 0 AND j.state = 'running'"
            ).fetchone()
        return int(row["n"])


class SqliteJobStore(JobStore):
    """The embedded default: one SQLite file, and the finished files, under `root` (KOKORO_DATA_DIR/jobs).
    Its writes are durable at commit (WAL, synchronous FULL)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._db = root / "books.sqlite3"
        with closing(sqlite3.connect(self._db, timeout=30)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA.format(real="REAL", blob="BLOB"))

    def output(self, record: JobRecord) -> Path:
        return self.work_dir(record.id) / f"book.{record.options.response_format}"

    def _keep_output(self, db: Connection, job_id: str, path: Path) -> None:
        """The file stays where the assembly made it (`output`)."""

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with closing(sqlite3.connect(self._db, timeout=30, isolation_level=None)) as db:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA synchronous=FULL")
            yield db

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A write transaction taken at once (BEGIN IMMEDIATE), so two claimers never take the same work."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


class PostgresJobStore(JobStore):
    """Jobs in PostgreSQL (KOKORO_JOBS_DATABASE): replicas on any number of machines share the work and
    any of them answers a job's status and serves its file (copied to `local` on first download)."""

    _lock_units = " FOR UPDATE OF u SKIP LOCKED"
    _lock_jobs = " FOR UPDATE SKIP LOCKED"
    _lock_job = " FOR UPDATE"

    def __init__(self, url: str, local: Path) -> None:
        super().__init__(local)
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=4,
            kwargs={"row_factory": dict_row, "autocommit": True},
            open=False,
            name="kokoro-jobs",
        )
        self._pool.open(wait=True, timeout=30)
        with self._transaction() as db:
            # One schema creation at a time: replicas starting together would race on CREATE IF NOT EXISTS.
            db.execute("SELECT pg_advisory_xact_lock(7270655)")
            for statement in _SCHEMA.format(real="DOUBLE PRECISION", blob="BYTEA").split(";"):
                if statement.strip():
                    db.execute(statement)

    def close(self) -> None:
        self._pool.close()

    def output(self, record: JobRecord) -> Path:
        """The file, copied from the database to this machine the first time it is asked for here."""
        path = self.work_dir(record.id) / f"book.{record.options.response_format}"
        if path.exists() and path.stat().st_size == record.file_bytes:
            return path
        self._forget_deleted()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            with open(partial, "wb") as file:
                part = 0
                while True:
                    with self._connect() as db:
                        row = db.execute(
                            "SELECT data FROM files WHERE job_id = ? AND part = ?", (record.id, part)
                        ).fetchone()
                    if row is None:
                        break
                    file.write(row["data"])
                    part += 1
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return path

    def _forget_deleted(self) -> None:
        """Remove this machine's copies of jobs deleted through another replica."""
        folders = [folder.name for folder in self.local.iterdir() if JOB_ID.fullmatch(folder.name)]
        if not folders:
            return
        with self._connect() as db:
            rows = db.execute(
                f"SELECT id FROM jobs WHERE id IN ({', '.join('?' * len(folders))})", folders
            ).fetchall()
        for gone in set(folders) - {row["id"] for row in rows}:
            shutil.rmtree(self.local / gone, ignore_errors=True)

    def _keep_output(self, db: Connection, job_id: str, path: Path) -> None:
        db.execute("DELETE FROM files WHERE job_id = ?", (job_id,))
        with open(path, "rb") as file:
            part = 0
            while data := file.read(FILE_PART_BYTES):
                db.execute("INSERT INTO files (job_id, part, data) VALUES (?, ?, ?)", (job_id, part, data))
                part += 1

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with self._transaction() as db:
            yield db

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        try:
            with self._pool.connection(timeout=10) as connection, connection.transaction():
                yield _Postgres(connection)
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            raise ServiceUnavailableError(
                f"The jobs database is unreachable: {exc}", retry_after=5, code="jobs_database_unreachable"
            ) from exc


class _Postgres:
    """A psycopg connection that takes the queries' `?` placeholders."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        return self._connection.execute(sql.replace("?", "%s"), parameters)


def open_store(url: str | None, local: Path) -> JobStore:
    """PostgreSQL where `url` names it (postgresql://…), else SQLite under `local`."""
    if url:
        return PostgresJobStore(url, local)
    return SqliteJobStore(local)


def _holds(db: Connection, job_id: str, owner: str) -> bool:
    row = db.execute(
        "SELECT 1 AS held FROM jobs WHERE id = ? AND owner = ? AND state = 'running'", (job_id, owner)
    ).fetchone()
    return row is not None


# The job's rate is measured over a window that starts again after this long (a job resumed after a
# pause, or joined by another replica, shows its new pace within about this), and is shown once the
# window is this old (or when there is none yet).
RATE_WINDOW_S = 60.0
RATE_SETTLE_S = 10.0


def _rate(
    rate: float | None, since: float | None, base: int, characters: int, now: float
) -> tuple[float | None, float, int]:
    """The job's rate, and its window's start (time, characters), after a unit committed at `now`."""
    if since is None:
        return rate, now, characters
    elapsed = now - since
    if elapsed > 0 and characters > base and (rate is None or elapsed >= RATE_SETTLE_S):
        rate = (characters - base) / elapsed
    if elapsed >= RATE_WINDOW_S:
        since, base = now, characters
    return rate, since, base


def _record(row: Any) -> JobRecord:
    """A row of `jobs` (its columns named as JobRecord's fields), its JSON columns read."""
    values: dict[str, Any] = {name: row[name] for name in (column.name for column in fields(JobRecord))}
    chapters = [ChapterInfo(**chapter) for chapter in json.loads(values["chapters"])]
    starts = json.loads(values["chapter_starts"])
    values.update(
        state=JobState(values["state"]),
        options=JobOptions(**json.loads(values["options"])),
        chapters=chapters,
        chapter_starts=[*starts, *[None] * (len(chapters) - len(starts))],
    )
    return JobRecord(**values)


def owner_id() -> str:
    """This process, as a holder of work: host, process id, and a nonce (a restarted container's new
    server process may have the old one's host name and process id)."""
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
