"""The jobs' store embedded in one SQLite file: the workers and the replicas of one machine share it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from api.books.queries import Connection, JobStore
from api.books.records import JobRecord
from api.books.schema import SCHEMA


class SqliteJobStore(JobStore):
    """The embedded default: one SQLite file, and the finished files, under `root` (KOKORO_DATA_DIR/jobs).
    Its writes are durable at commit (WAL, synchronous FULL)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._db = root / "books.sqlite3"
        with closing(sqlite3.connect(self._db, timeout=30)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA.format(real="REAL", blob="BLOB"))

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
