"""The jobs' queries, one set over SQLite and PostgreSQL alike: create, claim, lease, commit, finish."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from api.books.owners import orphaned
from api.books.progress import grow_prefix, next_rate, task_of
from api.books.read import Book, Chapter
from api.books.records import (
    JOB_ID,
    ChapterInfo,
    ClaimedUnit,
    JobOptions,
    JobRecord,
    JobState,
    PlannedUnit,
    Task,
    Unit,
    new_job_id,
)
from api.books.schema import RECORD_COLUMNS, record_of

BYTES_PER_SAMPLE = 2  # a unit's audio is int16 mono at the model's rate
# Units' audio read back for assembly this many at a time.
_AUDIO_BATCH = 32


class Connection(Protocol):
    """What the queries need of a connection (sqlite3's, or psycopg's through `_Postgres`)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...


class JobStore:
    """Where book jobs live: a database of the jobs and their units (each unit a chunk of speech or a
    pause, planned ahead with everything needed to make it, then its audio once made), and the finished
    files. The queries run over either database; subclasses open connections and keep finished files.

    A job moves through two kinds of work. Its *task* (planning its units, later assembling its file) is
    held by one worker at a time with a lease on the job's row. Its *units* are claimed a few at a time by
    any worker with a lease on each unit (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so claimers never wait on
    each other or take the same unit); a unit's audio and its row are committed in one transaction. A
    lease that runs out (its holder died) lets another take the work over; a holder on this host whose
    process is gone is an orphan at once. Every method blocks: call them off the event loop.
    """

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
        job_id = new_job_id()
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
            row = db.execute(f"SELECT {RECORD_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else record_of(row)

    def recent(self, limit: int) -> list[JobRecord]:
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {RECORD_COLUMNS} FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)
            ).fetchall()
        return [record_of(row) for row in rows]

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
            free = (row for row in rows if row["lease_until"] < now or orphaned(row["owner"], owner))
            row = next(free, None)
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET state = 'running', owner = ?, lease_until = ?, "
                "started_at = COALESCE(started_at, ?), rate_since = ?, rate_characters = characters_done "
                "WHERE id = ?",
                (owner, now + lease_s, now, now, row["id"]),
            )
            task = task_of(row["units_total"])
            record = db.execute(f"SELECT {RECORD_COLUMNS} FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return record_of(record), task

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
            orphans = [row["owner"] for row in holders if orphaned(row["owner"], owner)]
            or_orphans = f" OR u.owner IN ({', '.join('?' * len(orphans))})" if orphans else ""
            rows = db.execute(
                "SELECT u.job_id, u.idx, u.chapter, u.plan FROM units u JOIN jobs j ON j.id = u.job_id "
                f"WHERE j.state = 'running' AND u.done = 0 AND (u.lease_until < ?{or_orphans}) "
                f"ORDER BY j.created_at, u.idx LIMIT ?{self._lock_units}",
                (now, *orphans, count),
            ).fetchall()
            for row in rows:
                db.execute(
                    "UPDATE units SET owner = ?, lease_until = ? WHERE job_id = ? AND idx = ?",
                    (owner, now + lease_s, row["job_id"], row["idx"]),
                )
        return [ClaimedUnit(row["job_id"], row["idx"], row["chapter"], row["plan"]) for row in rows]

    def renew(
        self, owner: str, lease_s: float, tasks: Collection[str], units: Collection[tuple[str, int]]
    ) -> set[str]:
        """Extend the leases of the work `owner` has in hand (the jobs whose task it holds, the units it is
        making); the jobs of those it still holds. Only work in hand: a claim whose answer was lost (its
        connection cut after the claim was committed) is not renewed, so its lease runs out and another
        takes it, where renewing everything `owner` holds would keep it from everyone for good."""
        until = time.time() + lease_s
        held: set[str] = set()
        by_job: dict[str, list[int]] = {}
        for job_id, index in units:
            by_job.setdefault(job_id, []).append(index)
        with self._transaction() as db:
            for job_id in tasks:
                cursor = db.execute(
                    "UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ? AND state = 'running'",
                    (until, job_id, owner),
                )
                if cursor.rowcount == 1:
                    held.add(job_id)
            for job_id, indexes in by_job.items():
                marks = ", ".join("?" * len(indexes))
                db.execute(
                    f"UPDATE units SET lease_until = ? WHERE job_id = ? AND idx IN ({marks}) AND owner = ? "
                    "AND done = 0",
                    (until, job_id, *indexes, owner),
                )
                # A unit whose commit is under way (done, or not yet) is still this owner's work.
                row = db.execute(
                    "SELECT 1 AS held FROM units u JOIN jobs j ON j.id = u.job_id WHERE u.job_id = ? "
                    f"AND u.idx IN ({marks}) AND u.owner = ? AND j.state = 'running' LIMIT 1",
                    (job_id, *indexes, owner),
                ).fetchone()
                if row is not None:
                    held.add(job_id)
        return held

    def release(self, owner: str) -> None:
        """Give up everything `owner` holds (a worker that stops): the next worker to look takes it."""
        with self._transaction() as db:
            db.execute("UPDATE jobs SET lease_until = 0 WHERE owner = ?", (owner,))
            db.execute("UPDATE units SET lease_until = 0 WHERE owner = ? AND done = 0", (owner,))

    def commit(
        self, job_id: str, index: int, owner: str, pcm: bytes, timed: list[list[float | None]] | None
    ) -> bool:
        """A unit made: its audio and row, and the job's progress, in one transaction; True too when
        `owner` had committed it already, False (nothing written) when the job is gone, not running, or
        the unit is no longer `owner`'s."""
        now = time.time()
        samples = len(pcm) // BYTES_PER_SAMPLE
        with self._transaction() as db:
            job = db.execute(
                "SELECT state, characters_done, prefix_units, prefix_samples, chapter_starts, rate, "
                f"rate_since, rate_characters FROM jobs WHERE id = ?{self._lock_job}",
                (job_id,),
            ).fetchone()
            made_rows = []
            if job is not None and job["state"] == JobState.RUNNING.value:
                made_rows = db.execute(
                    "UPDATE units SET done = 1, samples = ?, timed = ?, audio = ?, lease_until = 0 "
                    "WHERE job_id = ? AND idx = ? AND owner = ? AND done = 0 RETURNING spoken, characters",
                    (samples, None if timed is None else json.dumps(timed), pcm, job_id, index, owner),
                ).fetchall()  # all of it: SQLite finishes the statement only once its rows are read
            if len(made_rows) != 1:
                # Made by `owner` already: a commit tried again whose first answer was lost (its connection
                # cut after the database had committed it) is kept, not made twice, even where the job
                # has been finished since.
                kept = db.execute(
                    "SELECT 1 AS kept FROM units WHERE job_id = ? AND idx = ? AND owner = ? AND done = 1",
                    (job_id, index, owner),
                ).fetchone()
                return kept is not None
            made = made_rows[0]
            following = db.execute(
                "SELECT idx, chapter, samples FROM units WHERE job_id = ? AND idx >= ? AND done = 1 "
                "ORDER BY idx",
                (job_id, job["prefix_units"]),
            ).fetchall()
            prefix, prefix_samples, starts = grow_prefix(
                job["prefix_units"],
                job["prefix_samples"],
                json.loads(job["chapter_starts"]),
                ((row["idx"], row["chapter"], row["samples"]) for row in following),
            )
            characters = job["characters_done"] + made["characters"]
            rate, since, base = next_rate(
                job["rate"], job["rate_since"], job["rate_characters"], characters, now
            )
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


def _holds(db: Connection, job_id: str, owner: str) -> bool:
    row = db.execute(
        "SELECT 1 AS held FROM jobs WHERE id = ? AND owner = ? AND state = 'running'", (job_id, owner)
    ).fetchone()
    return row is not None
