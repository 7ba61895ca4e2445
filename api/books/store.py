"""Opening the jobs' store: PostgreSQL where its URL is given, else the embedded SQLite."""

from __future__ import annotations

from pathlib import Path

from api.books.postgres_store import PostgresJobStore
from api.books.queries import JobStore
from api.books.sqlite_store import SqliteJobStore


def open_store(url: str | None, local: Path) -> JobStore:
    """PostgreSQL where `url` names it (postgresql://…), else SQLite under `local`."""
    if url:
        return PostgresJobStore(url, local)
    return SqliteJobStore(local)
