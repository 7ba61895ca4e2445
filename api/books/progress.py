"""A job's progress as each unit commits, decided without the database: its pace, and how much of its
audio is whole from the start (where its chapters begin)."""

from __future__ import annotations

from collections.abc import Iterable

from api.books.records import Task

# The job's rate is measured over a window that starts again after this long (a job resumed after a
# pause, or joined by another replica, shows its new pace within about this), and is shown once the
# window is this old (or when there is none yet).
RATE_WINDOW_S = 60.0
RATE_SETTLE_S = 10.0


def next_rate(
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


def grow_prefix(
    units: int, samples: int, starts: list[int | None], made: Iterable[tuple[int, int, int]]
) -> tuple[int, int, list[int | None]]:
    """The prefix (`units` made from the start, `samples` long, chapters' `starts` within it) grown over
    `made`, the (index, chapter, samples) of the units made from index `units` on, in order: up to the
    first gap, each chapter's first unit giving that chapter's start."""
    starts = list(starts)
    for index, chapter, unit_samples in made:
        if index != units:
            break
        if len(starts) <= chapter:
            starts += [None] * (chapter - len(starts)) + [samples]
        units, samples = units + 1, samples + unit_samples
    return units, samples, starts


def task_of(units_total: int | None) -> Task:
    """A job's task: planning until its units are all planned (their total known), then assembling."""
    return Task.PLAN if units_total is None else Task.ASSEMBLE
