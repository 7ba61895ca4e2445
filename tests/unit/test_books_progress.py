"""The jobs' pure decisions, without a database: a job's pace, the audio whole from its start (where its
chapters begin) as units commit in any order, its task, and which holders on this host are gone."""

from __future__ import annotations

import pytest

from api.books.owners import orphaned
from api.books.progress import RATE_SETTLE_S, RATE_WINDOW_S, grow_prefix, next_rate, task_of
from api.books.records import Task

ME = "here:100:aaaa"


def test_the_first_commit_opens_the_rate_window() -> None:
    assert next_rate(None, None, 0, 40, now=5.0) == (None, 5.0, 40)


def test_the_rate_shows_at_once_then_only_once_the_window_has_settled() -> None:
    rate, since, base = next_rate(None, 0.0, 0, 30, now=3.0)
    assert (rate, since, base) == (10.0, 0.0, 0)  # none shown yet: the first measure shows at once
    assert next_rate(rate, since, base, 60, now=RATE_SETTLE_S - 1) == (10.0, 0.0, 0)  # not settled: kept
    assert next_rate(rate, since, base, 60, now=RATE_SETTLE_S * 2) == (3.0, 0.0, 0)


def test_the_rate_window_starts_again_once_it_is_old() -> None:
    assert next_rate(2.0, 0.0, 0, 120, now=RATE_WINDOW_S) == (2.0, RATE_WINDOW_S, 120)


def test_no_rate_from_no_progress_or_no_time() -> None:
    assert next_rate(None, 0.0, 50, 50, now=20.0) == (None, 0.0, 50)
    assert next_rate(None, 7.0, 0, 50, now=7.0) == (None, 7.0, 0)


def test_the_prefix_grows_up_to_the_first_gap_and_marks_each_chapters_start() -> None:
    made = [(0, 0, 100), (1, 0, 50), (2, 1, 70), (4, 1, 10)]  # unit 3 is not made yet
    assert grow_prefix(0, 0, [], made) == (3, 220, [0, 150])


def test_the_prefix_goes_on_from_where_it_stood_and_skips_a_chapter_with_no_units_before_it() -> None:
    starts: list[int | None] = [0]
    assert grow_prefix(3, 220, starts, [(3, 3, 30), (4, 3, 5)]) == (5, 255, [0, None, None, 220])
    assert starts == [0]  # the caller's list is left as it was


def test_nothing_grows_while_the_next_unit_is_missing() -> None:
    assert grow_prefix(2, 90, [0], [(3, 0, 10), (4, 1, 10)]) == (2, 90, [0])


def test_a_job_is_planned_until_its_units_total_is_known_then_assembled() -> None:
    assert task_of(None) is Task.PLAN
    assert task_of(0) is Task.ASSEMBLE
    assert task_of(12) is Task.ASSEMBLE


@pytest.mark.parametrize(
    ("holder", "alive", "gone"),
    [
        (None, True, True),  # nobody holds it
        (ME, False, False),  # this very process
        ("here:100:bbbb", True, True),  # this process id before a restart
        ("here:200:bbbb", False, True),  # a process of this host that is gone
        ("here:200:bbbb", True, False),  # alive
        ("there:200:bbbb", False, False),  # another host's: its lease decides
        ("here:not-a-pid", False, False),
    ],
)
def test_a_holder_here_is_gone_when_its_process_is(holder: str | None, alive: bool, gone: bool) -> None:
    asked: list[int] = []

    def is_alive(pid: int) -> bool:
        asked.append(pid)
        return alive

    assert orphaned(holder, ME, alive=is_alive) is gone
    assert asked == ([200] if holder == "here:200:bbbb" else [])
