"""The jobs' store in PostgreSQL: replicas on many machines share it, and the finished files are kept in
it in parts."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from api.books.queries import Connection, JobStore
from api.books.records import JOB_ID, JobRecord
from api.books.schema import SCHEMA
from api.errors import ServiceUnavailableError

# A finished file is kept in PostgreSQL in parts of this size (bytea values stay well under its limits).
FILE_PART_BYTES = 4 * 1024 * 1024
# How long a query waits for a connection before the database is said to be unreachable (503).
CONNECTION_WAIT_S = 5.0


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
            # A connection is checked as it is handed out: after a database restart the pool's old ones
            # are dead, and the first query on each would fail otherwise.
            check=psycopg_pool.ConnectionPool.check_connection,
        )
        self._pool.open(wait=True, timeout=30)
        with self._transaction() as db:
            # One schema creation at a time: replicas starting together would race on CREATE IF NOT EXISTS.
            db.execute("SELECT pg_advisory_xact_lock(7270655)")
            for statement in SCHEMA.format(real="DOUBLE PRECISION", blob="BYTEA").split(";"):
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
            with self._pool.connection(timeout=CONNECTION_WAIT_S) as connection, connection.transaction():
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
