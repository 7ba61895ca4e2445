"""A book job's records: its state, its options, its units as planned, claimed and made."""

from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass, field

JOB_ID = re.compile(r"job_[0-9a-f]{20}")


def new_job_id() -> str:
    """A fresh id that `JOB_ID` matches."""
    return f"job_{uuid.uuid4().hex[:20]}"


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
