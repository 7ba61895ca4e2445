"""The batch-forming decision, with fake entries and a fake clock: no engine, no thread."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from api.engine.base import BatchPolicy, SynthesisItem
from api.engine.scheduling.batching import BatchDecision, BatchOverrides, effective_policy, next_batch
from api.engine.scheduling.entries import (
    BACKGROUND_PRIORITY,
    FIRST_CHUNK_PRIORITY,
    LATER_CHUNK_PRIORITY,
    Entry,
)

POLICY = BatchPolicy(max_batch_size=4, batch_timeout=0.05, max_batch_tokens=2000, length_ratio=2.0)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # Futures only need a loop to belong to; it never runs here.
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def entry(
    loop: asyncio.AbstractEventLoop,
    at: float,
    tokens: int = 100,
    *,
    priority: int = LATER_CHUNK_PRIORITY,
    speed: float = 1.0,
    name: str = "r",
) -> Entry:
    item = SynthesisItem(tokens=(1,) * tokens, style=np.zeros(256, np.float32), speed=speed)
    return Entry(
        item=item, future=loop.create_future(), loop=loop, request_id=name, enqueued_at=at, priority=priority
    )


def names(entries: list[Entry]) -> list[str]:
    return [e.request_id for e in entries]


def test_an_empty_queue_waits_for_an_entry() -> None:
    assert next_batch([], now=5.0, policy=POLICY) == BatchDecision(batch=[], skipped=[], wait=None)


def test_waits_out_the_timeout_then_dispatches(loop: asyncio.AbstractEventLoop) -> None:
    entries = [entry(loop, 1.0, name="a"), entry(loop, 1.01, name="b")]
    early = next_batch(entries, now=1.02, policy=POLICY)
    assert early.batch == []
    assert early.wait == pytest.approx(0.03)
    due = next_batch(entries, now=1.05, policy=POLICY)
    assert names(due.batch) == ["a", "b"]
    assert due.wait is None


def test_a_full_batch_runs_before_the_timeout(loop: asyncio.AbstractEventLoop) -> None:
    entries = [entry(loop, 1.0 + i / 1000, name=str(i)) for i in range(6)]
    decision = next_batch(entries, now=1.006, policy=POLICY)
    assert names(decision.batch) == ["0", "1", "2", "3"]


def test_zero_timeout_runs_a_lone_entry_at_once(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(max_batch_size=8, batch_timeout=0.0, max_batch_tokens=2000, length_ratio=2.0)
    decision = next_batch([entry(loop, 3.0, name="a")], now=3.0, policy=policy)
    assert names(decision.batch) == ["a"]


def test_first_chunks_go_ahead_of_older_later_chunks(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(max_batch_size=2, batch_timeout=0.0, max_batch_tokens=2000, length_ratio=2.0)
    entries = [
        entry(loop, 1.0, name="old-later"),
        entry(loop, 1.1, name="older-later"),
        entry(loop, 2.0, priority=FIRST_CHUNK_PRIORITY, name="first-b"),
        entry(loop, 1.5, priority=FIRST_CHUNK_PRIORITY, name="first-a"),
    ]
    decision = next_batch(entries, now=2.0, policy=policy)
    assert names(decision.batch) == ["first-a", "first-b"]


def test_within_a_priority_the_oldest_goes_first(loop: asyncio.AbstractEventLoop) -> None:
    entries = [entry(loop, 1.3, name="c"), entry(loop, 1.1, name="a"), entry(loop, 1.2, name="b")]
    decision = next_batch(entries, now=2.0, policy=POLICY)
    assert names(decision.batch) == ["a", "b", "c"]


def test_an_overdue_entry_behind_a_fresh_head_dispatches_the_head(loop: asyncio.AbstractEventLoop) -> None:
    entries = [entry(loop, 1.0, name="overdue"), entry(loop, 1.2, priority=FIRST_CHUNK_PRIORITY, name="head")]
    decision = next_batch(entries, now=1.2, policy=POLICY)
    assert names(decision.batch) == ["head", "overdue"]


def test_cancelled_entries_are_skipped_never_batched(loop: asyncio.AbstractEventLoop) -> None:
    entries = [entry(loop, 1.0 + i / 10, name=str(i)) for i in range(4)]
    entries[0].future.cancel()
    entries[2].future.cancel()
    decision = next_batch(entries, now=5.0, policy=POLICY)
    assert names(decision.skipped) == ["0", "2"]
    assert names(decision.batch) == ["1", "3"]


def test_only_cancelled_entries_wait_for_new_ones(loop: asyncio.AbstractEventLoop) -> None:
    gone = entry(loop, 1.0)
    gone.future.cancel()
    assert next_batch([gone], now=1.0, policy=POLICY) == BatchDecision(batch=[], skipped=[gone], wait=None)


def test_length_ratio_keeps_short_and_long_chunks_apart(loop: asyncio.AbstractEventLoop) -> None:
    entries = [
        entry(loop, 1.0, 20, name="short"),
        entry(loop, 1.1, 400, name="long"),
        entry(loop, 1.2, 30, name="s2"),
    ]
    first = next_batch(entries, now=5.0, policy=POLICY)
    assert names(first.batch) == ["short", "s2"]
    second = next_batch([entries[1]], now=5.0, policy=POLICY)
    assert names(second.batch) == ["long"]


def test_speed_counts_in_the_cost(loop: asyncio.AbstractEventLoop) -> None:
    # 100 tokens at half speed make as many frames as 200 tokens: too long beside 60 at full speed.
    slow = entry(loop, 1.0, 100, speed=0.5, name="slow")
    short = entry(loop, 1.1, 60, name="short")
    assert slow.cost == pytest.approx(200.0)
    assert names(next_batch([slow, short], now=5.0, policy=POLICY).batch) == ["slow"]


def test_token_budget_caps_the_batch(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(max_batch_size=8, batch_timeout=0.0, max_batch_tokens=350, length_ratio=2.0)
    entries = [entry(loop, 1.0 + i / 10, 100, name=str(i)) for i in range(5)]
    decision = next_batch(entries, now=5.0, policy=policy)
    assert names(decision.batch) == ["0", "1", "2"]  # 3 x 100 fits 350, 4 x 100 does not


def test_budget_counts_padding_to_the_longest(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(max_batch_size=8, batch_timeout=0.0, max_batch_tokens=350, length_ratio=2.0)
    entries = [
        entry(loop, 1.0, 100, name="a"),
        entry(loop, 1.1, 180, name="b"),
        entry(loop, 1.2, 100, name="c"),
    ]
    decision = next_batch(entries, now=5.0, policy=policy)
    assert names(decision.batch) == ["a", "c"]  # with b, 2 x 180 = 360 exceeds the budget


def test_an_oversize_entry_still_runs_alone(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(max_batch_size=4, batch_timeout=0.0, max_batch_tokens=300, length_ratio=2.0)
    entries = [entry(loop, 1.0, 500, name="huge"), entry(loop, 1.1, 400, name="big")]
    decision = next_batch(entries, now=1.1, policy=policy)
    assert names(decision.batch) == ["huge"]


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchPolicy(max_batch_size=0, batch_timeout=0.0, max_batch_tokens=1, length_ratio=1.0)
    with pytest.raises(ValueError, match="batch_timeout"):
        BatchPolicy(max_batch_size=1, batch_timeout=-0.1, max_batch_tokens=1, length_ratio=1.0)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=0, length_ratio=1.0)
    with pytest.raises(ValueError, match="length_ratio"):
        BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=1, length_ratio=0.5)


def test_overrides_apply_over_engine_defaults() -> None:
    defaults = BatchPolicy(max_batch_size=16, batch_timeout=0.01, max_batch_tokens=4096, length_ratio=2.0)
    assert effective_policy(defaults, BatchOverrides()) == defaults
    assert effective_policy(defaults, BatchOverrides(max_batch_size=4, batch_timeout=0.0)) == BatchPolicy(
        max_batch_size=4, batch_timeout=0.0, max_batch_tokens=4096, length_ratio=2.0
    )
    assert effective_policy(defaults, BatchOverrides(max_batch_tokens=1000)).max_batch_tokens == 1000


BUSY_POLICY = BatchPolicy(
    max_batch_size=4, batch_timeout=0.005, max_batch_tokens=2000, length_ratio=2.0, busy_timeout=0.05
)


def test_beside_a_running_call_later_chunks_wait_for_the_busy_timeout(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queued = [entry(loop, 0.0, name="a"), entry(loop, 0.001, name="b")]
    idle = next_batch(queued, now=0.01, policy=BUSY_POLICY)
    assert names(idle.batch) == ["a", "b"]  # nothing running: the batch timeout applies
    busy = next_batch(queued, now=0.01, policy=BUSY_POLICY, busy=True)
    assert busy.batch == []
    assert busy.wait == pytest.approx(0.04)
    due = next_batch(queued, now=0.05, policy=BUSY_POLICY, busy=True)
    assert names(due.batch) == ["a", "b"]
    full = [entry(loop, 0.0, name=str(n)) for n in range(4)]
    assert len(next_batch(full, now=0.0, policy=BUSY_POLICY, busy=True).batch) == 4  # a full batch goes


def test_a_first_chunk_never_waits_for_the_busy_timeout(loop: asyncio.AbstractEventLoop) -> None:
    queued = [entry(loop, 0.0, priority=FIRST_CHUNK_PRIORITY, name="first"), entry(loop, 0.0, name="later")]
    decision = next_batch(queued, now=0.006, policy=BUSY_POLICY, busy=True)
    assert names(decision.batch) == ["first", "later"]


def test_a_negative_busy_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        BatchPolicy(
            max_batch_size=4, batch_timeout=0.0, max_batch_tokens=10, length_ratio=1.0, busy_timeout=-1
        )


LAUNCH_POLICY = BatchPolicy(
    max_batch_size=4, batch_timeout=0.0, max_batch_tokens=2000, length_ratio=2.0, launch_tokens=900
)


def test_below_the_launch_tokens_a_batch_takes_chunks_beyond_the_ratio(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # A short first chunk would run alone; padded to 3 x 300 it costs the device no more than its launch.
    entries = [
        entry(loop, 1.0, 40, priority=FIRST_CHUNK_PRIORITY, name="first"),
        entry(loop, 1.1, 300, name="long"),
        entry(loop, 1.2, 250, name="l2"),
        entry(loop, 1.3, 280, name="l3"),
    ]
    assert names(next_batch(entries, now=5.0, policy=POLICY).batch) == ["first"]
    assert names(next_batch(entries, now=5.0, policy=LAUNCH_POLICY).batch) == ["first", "long", "l2"]


def test_the_ratio_fill_comes_before_the_top_up(loop: asyncio.AbstractEventLoop) -> None:
    # The chunks within the ratio join first, wherever they are queued; the top-up takes what fits after.
    entries = [
        entry(loop, 1.0, 100, name="a"),
        entry(loop, 1.1, 400, name="long"),
        entry(loop, 1.2, 120, name="b"),
        entry(loop, 1.3, 90, name="c"),
        entry(loop, 1.4, 200, name="d"),
    ]
    decision = next_batch(entries, now=5.0, policy=LAUNCH_POLICY)
    assert names(decision.batch) == ["a", "b", "c", "d"]  # 4 x 200 = 800: long (4 x 400) would not fit


def test_a_batch_at_its_launch_tokens_keeps_the_ratio(loop: asyncio.AbstractEventLoop) -> None:
    entries = [
        entry(loop, 1.0, 300, name="a"),
        entry(loop, 1.1, 310, name="b"),
        entry(loop, 1.2, 320, name="c"),
        entry(loop, 1.3, 100, name="short"),
    ]
    # 3 x 320 = 960 is past 900: the short chunk waits for a batch of its own kind.
    assert names(next_batch(entries, now=5.0, policy=LAUNCH_POLICY).batch) == ["a", "b", "c"]


def test_the_top_up_stays_within_the_token_budget(loop: asyncio.AbstractEventLoop) -> None:
    policy = BatchPolicy(
        max_batch_size=8, batch_timeout=0.0, max_batch_tokens=500, length_ratio=2.0, launch_tokens=5000
    )
    entries = [
        entry(loop, 1.0, 50, name="a"),
        entry(loop, 1.1, 200, name="b"),
        entry(loop, 1.2, 300, name="c"),
    ]
    assert names(next_batch(entries, now=5.0, policy=policy).batch) == ["a", "b"]  # with c, 3 x 300 > 500


def test_negative_launch_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match="launch_tokens"):
        BatchPolicy(
            max_batch_size=4, batch_timeout=0.0, max_batch_tokens=10, length_ratio=1.0, launch_tokens=-1
        )


def test_a_book_jobs_chunks_run_last_and_never_beside_a_requests(loop: asyncio.AbstractEventLoop) -> None:
    book = [entry(loop, 0.5 + i / 10, priority=BACKGROUND_PRIORITY, name=f"book-{i}") for i in range(3)]
    later = entry(loop, 2.0, name="later")
    first = entry(loop, 3.0, priority=FIRST_CHUNK_PRIORITY, name="first")
    decision = next_batch([*book, later, first], now=9.0, policy=POLICY)
    assert [chosen.request_id for chosen in decision.batch] == ["first", "later"]
    # With no request's chunk waiting, they batch among themselves, oldest first.
    decision = next_batch(book, now=9.0, policy=POLICY)
    assert [chosen.request_id for chosen in decision.batch] == ["book-0", "book-1", "book-2"]
    # Even a launch's worth of room is not topped up with them.
    roomy = BatchPolicy(
        max_batch_size=8, batch_timeout=0.0, max_batch_tokens=4000, length_ratio=1.0, launch_tokens=4000
    )
    decision = next_batch([*book, first], now=9.0, policy=roomy)
    assert [chosen.request_id for chosen in decision.batch] == ["first"]
