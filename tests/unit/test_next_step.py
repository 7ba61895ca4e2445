"""The stepped engine's decision (which chunk advances next), with fake entries: no engine, no thread."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from api.engine.base import SynthesisItem
from api.engine.scheduling.batching import StepDecision, next_step
from api.engine.scheduling.entries import FIRST_CHUNK_PRIORITY, LATER_CHUNK_PRIORITY, Entry


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def entry(loop: asyncio.AbstractEventLoop, at: float, name: str, *, first: bool = False) -> Entry:
    item = SynthesisItem(tokens=(1, 2, 3), style=np.zeros(256, np.float32), speed=1.0)
    priority = FIRST_CHUNK_PRIORITY if first else LATER_CHUNK_PRIORITY
    return Entry(
        item=item, future=loop.create_future(), loop=loop, request_id=name, enqueued_at=at, priority=priority
    )


def test_nothing_to_do() -> None:
    assert next_step([], []) == StepDecision(entry=None, started=False, dropped=[])


def test_a_queued_chunk_starts_when_nothing_is_begun(loop: asyncio.AbstractEventLoop) -> None:
    a, b = entry(loop, 1.0, "a"), entry(loop, 2.0, "b")
    decision = next_step([], [b, a])
    assert decision.entry is a
    assert decision.started


def test_a_begun_chunk_goes_on_before_later_chunks_queued_after_it(loop: asyncio.AbstractEventLoop) -> None:
    begun, queued = entry(loop, 1.0, "begun"), entry(loop, 2.0, "queued")
    decision = next_step([begun], [queued])
    assert decision.entry is begun
    assert not decision.started


def test_a_first_chunk_pauses_a_begun_later_chunk(loop: asyncio.AbstractEventLoop) -> None:
    long_chunk = entry(loop, 1.0, "long")
    first = entry(loop, 5.0, "first", first=True)
    decision = next_step([long_chunk], [first])
    assert decision.entry is first
    assert decision.started
    # Once the first chunk is begun too, it goes on until done; then the paused chunk resumes.
    assert next_step([long_chunk, first], []).entry is first
    assert next_step([long_chunk], []).entry is long_chunk


def test_first_chunks_do_not_pause_each_other(loop: asyncio.AbstractEventLoop) -> None:
    begun = entry(loop, 1.0, "begun", first=True)
    newer = entry(loop, 2.0, "newer", first=True)
    assert next_step([begun], [newer]).entry is begun


def test_gone_requests_are_dropped_whether_begun_or_queued(loop: asyncio.AbstractEventLoop) -> None:
    begun, queued, alive = entry(loop, 1.0, "begun"), entry(loop, 2.0, "queued"), entry(loop, 3.0, "alive")
    begun.future.cancel()
    queued.future.cancel()
    decision = next_step([begun], [queued, alive])
    assert decision.dropped == [begun, queued]
    assert decision.entry is alive
    assert decision.started
