"""The jobs' tables, one schema for SQLite and PostgreSQL, and a `jobs` row read back as a JobRecord."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from api.books.records import ChapterInfo, JobOptions, JobRecord, JobState

# `{real}` and `{blob}` are each database's names for a double and for bytes.
SCHEMA = """
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

# The `jobs` columns that a JobRecord is read from, named as its fields.
RECORD_COLUMNS = ", ".join(column.name for column in fields(JobRecord))


def record_of(row: Any) -> JobRecord:
    """A row of `jobs` (its RECORD_COLUMNS), its JSON columns read."""
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
