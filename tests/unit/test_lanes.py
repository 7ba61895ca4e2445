"""Lane admission, with fake entries and a fake clock: which thread may start which call beside the calls
running, and what a call holds. No engine, no thread, no lock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from api.engine.base import BatchPolicy, SynthesisItem
from api.engine.scheduling.batching import retry_halves
from api.engine.scheduling.entries import (
    BACKGROUND_PRIORITY,
    FIRST_CHUNK_PRIORITY,
    LATER_CHUNK_PRIORITY,
    Entry,
)
from api.engine.scheduling.lanes import (
    BOOK_GRACE_S,
    BOOK_LANE,
    URGENT,
    Call,
    LaneUse,
    admits,
    admits_book,
    next_call,
    plan_call,
    role_of,
)

# No waiting for company: every decision below is about room, not about timing.
POLICY = BatchPolicy(max_batch_size=4, batch_timeout=0.0, max_batch_tokens=2000, length_ratio=2.0)
TWO_LANES = LaneUse(lanes=2, pooled=True)
NOW = 100.0


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # Futures only need a loop to belong to; it never runs here.
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def entry(
    loop: asyncio.AbstractEventLoop, priority: int = LATER_CHUNK_PRIORITY, *, at: float = 1.0, name: str = "r"
) -> Entry:
    item = SynthesisItem(tokens=(1,) * 50, style=np.zeros(256, np.float32), speed=1.0)
    return Entry(
        item=item, future=loop.create_future(), loop=loop, request_id=name, enqueued_at=at, priority=priority
    )


def call(*, alone: bool = False, urgent: bool = False, background: bool = False) -> Call:
    return Call([], alone=alone, urgent=urgent, background=background)


def running(use: LaneUse, *calls: Call) -> LaneUse:
    for started in calls:
        use = use.started(started)
    return use


# --- admits: a request's call -----------------------------------------------------------------------------


def test_with_nothing_running_any_call_takes_a_lane(loop: asyncio.AbstractEventLoop) -> None:
    for priority in (FIRST_CHUNK_PRIORITY, LATER_CHUNK_PRIORITY, BACKGROUND_PRIORITY):
        assert admits(LaneUse(), entry(loop, priority)) == "lane"
        assert admits(TWO_LANES, entry(loop, priority)) == "lane"


def test_one_lane_busy_holds_every_later_call_even_a_first_chunk(loop: asyncio.AbstractEventLoop) -> None:
    busy = running(LaneUse(lanes=1), call())
    assert admits(busy, entry(loop, LATER_CHUNK_PRIORITY)) is None
    assert admits(busy, entry(loop, FIRST_CHUNK_PRIORITY)) is None


def test_a_free_lane_beside_a_busy_one_takes_a_later_chunk(loop: asyncio.AbstractEventLoop) -> None:
    assert admits(running(TWO_LANES, call()), entry(loop)) == "lane"


def test_full_lanes_hold_a_later_chunk_and_let_a_first_chunk_start_beside(
    loop: asyncio.AbstractEventLoop,
) -> None:
    full = running(TWO_LANES, call(), call())
    assert admits(full, entry(loop, LATER_CHUNK_PRIORITY)) is None
    assert admits(full, entry(loop, FIRST_CHUNK_PRIORITY)) == "urgent"


def test_a_call_alone_holds_every_lane(loop: asyncio.AbstractEventLoop) -> None:
    alone = running(TWO_LANES, call(alone=True))
    assert admits(alone, entry(loop, LATER_CHUNK_PRIORITY)) is None
    assert admits(alone, entry(loop, FIRST_CHUNK_PRIORITY)) == "urgent"


def test_one_urgent_call_at_a_time(loop: asyncio.AbstractEventLoop) -> None:
    full = running(TWO_LANES, call(), call(), call(urgent=True))
    assert admits(full, entry(loop, FIRST_CHUNK_PRIORITY)) is None
    assert admits(full, entry(loop, LATER_CHUNK_PRIORITY)) is None


def test_the_urgent_call_holds_no_lane(loop: asyncio.AbstractEventLoop) -> None:
    # One lane's call and the urgent one: the second lane is still free for a later chunk.
    assert admits(running(TWO_LANES, call(), call(urgent=True)), entry(loop)) == "lane"


def test_three_lanes_admit_until_all_three_are_busy(loop: asyncio.AbstractEventLoop) -> None:
    three = LaneUse(lanes=3)
    assert admits(running(three, call(), call()), entry(loop)) == "lane"
    assert admits(running(three, call(), call(), call()), entry(loop)) is None


def test_a_book_on_its_own_threads_holds_no_lane(loop: asyncio.AbstractEventLoop) -> None:
    use = running(LaneUse(lanes=2, book_lanes=2), call(background=True), call(background=True))
    assert use.requests_running == 0
    assert admits(use, entry(loop)) == "lane"


def test_without_book_threads_a_first_chunk_starts_beside_a_book_at_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # A GPU's lanes: a book's chunks share them, and a first chunk goes ahead of them on every thread.
    use = running(LaneUse(lanes=2, pooled=False), call(background=True))
    assert admits(use, entry(loop, FIRST_CHUNK_PRIORITY)) == "urgent"
    assert admits(use, entry(loop, LATER_CHUNK_PRIORITY)) == "lane"


# --- admits_book: a book's call on its own thread ---------------------------------------------------------


BOOK_THREADS = LaneUse(lanes=2, book_lanes=2, request_seen=NOW - 2 * BOOK_GRACE_S)


def test_a_book_starts_when_nothing_else_runs_or_waits(loop: asyncio.AbstractEventLoop) -> None:
    assert admits_book(BOOK_THREADS, [entry(loop, BACKGROUND_PRIORITY)], NOW) == "book"


def test_a_book_waits_while_a_request_runs(loop: asyncio.AbstractEventLoop) -> None:
    assert admits_book(running(BOOK_THREADS, call()), [], NOW) is None


def test_a_book_waits_while_a_request_waits_but_not_for_a_cancelled_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    waiting = entry(loop, FIRST_CHUNK_PRIORITY)
    assert admits_book(BOOK_THREADS, [waiting], NOW) is None
    waiting.future.cancel()
    assert admits_book(BOOK_THREADS, [waiting], NOW) == "book"


def test_a_book_waits_out_the_grace_after_a_request(loop: asyncio.AbstractEventLoop) -> None:
    seen = LaneUse(lanes=2, book_lanes=2, request_seen=NOW)
    assert admits_book(seen, [], NOW + BOOK_GRACE_S / 2) is None
    assert admits_book(seen, [], NOW + BOOK_GRACE_S) == "book"


def test_a_book_takes_one_thread_per_lane_at_most(loop: asyncio.AbstractEventLoop) -> None:
    assert admits_book(running(BOOK_THREADS, call(background=True)), [], NOW) == "book"
    both = running(BOOK_THREADS, call(background=True), call(background=True))
    assert admits_book(both, [], NOW) is None


# --- what a call holds, and the state it leaves ----------------------------------------------------------


def test_a_call_alone_where_nothing_runs_and_nothing_waits(loop: asyncio.AbstractEventLoop) -> None:
    head = entry(loop)
    assert plan_call(TWO_LANES, [head], [head], urgent=False).alone
    other = entry(loop)
    assert not plan_call(TWO_LANES, [head], [head, other], urgent=False).alone
    assert not plan_call(running(TWO_LANES, call()), [head], [head], urgent=False).alone


def test_a_first_chunk_runs_alone_with_only_later_chunks_waiting(loop: asyncio.AbstractEventLoop) -> None:
    first, later, another_first = (
        entry(loop, FIRST_CHUNK_PRIORITY),
        entry(loop),
        entry(loop, FIRST_CHUNK_PRIORITY),
    )
    assert plan_call(TWO_LANES, [first], [first, later], urgent=False).alone
    assert not plan_call(TWO_LANES, [first], [first, another_first], urgent=False).alone


def test_a_book_never_runs_alone_nor_does_anything_on_unpooled_lanes(
    loop: asyncio.AbstractEventLoop,
) -> None:
    book = entry(loop, BACKGROUND_PRIORITY)
    planned = plan_call(TWO_LANES, [book], [book], urgent=False)
    assert (planned.alone, planned.background) == (False, True)
    head = entry(loop)
    assert not plan_call(LaneUse(lanes=2, pooled=False), [head], [head], urgent=False).alone


def test_started_and_ended_calls_count_back_to_idle() -> None:
    alone, urgent, book = call(alone=True), call(urgent=True), call(background=True)
    use = running(TWO_LANES, alone, urgent, book)
    assert (use.running, use.background, use.alone, use.urgent) == (3, 1, True, True)
    use = use.ended(book, NOW)
    assert use.request_seen == TWO_LANES.request_seen  # a book's end is no request's
    use = use.ended(urgent, NOW).ended(alone, NOW + 1)
    assert use == LaneUse(lanes=2, pooled=True, request_seen=NOW + 1)


# --- next_call: the whole decision of one thread ---------------------------------------------------------


def test_a_lane_takes_the_batch_and_the_urgent_thread_leaves_it(loop: asyncio.AbstractEventLoop) -> None:
    queued = [entry(loop, name="a"), entry(loop, name="b")]
    taken = next_call(queued, NOW, POLICY, TWO_LANES, "lane")
    assert taken.call is not None
    assert [e.request_id for e in taken.call.batch] == ["a", "b"]
    assert taken.call.alone
    left = next_call(queued, NOW, POLICY, TWO_LANES, "urgent")
    assert (left.call, left.wait) == (None, None)  # until a call's end or a new entry


def test_the_urgent_thread_takes_a_first_chunk_beside_full_lanes(loop: asyncio.AbstractEventLoop) -> None:
    full = running(TWO_LANES, call(), call())
    queued = [entry(loop, FIRST_CHUNK_PRIORITY, name="first")]
    assert next_call(queued, NOW, POLICY, full, "lane").call is None
    taken = next_call(queued, NOW, POLICY, full, "urgent").call
    assert taken is not None
    assert (taken.urgent, taken.alone) == (True, False)


def test_lanes_and_book_threads_each_see_their_own_entries(loop: asyncio.AbstractEventLoop) -> None:
    book, request = entry(loop, BACKGROUND_PRIORITY, name="book"), entry(loop, name="request")
    queued = [book, request]
    lane = next_call(queued, NOW, POLICY, BOOK_THREADS, "lane").call
    assert lane is not None
    assert lane.batch == [request]
    # The request waits: the book's thread holds back until it has run.
    held = next_call(queued, NOW, POLICY, BOOK_THREADS, "book")
    assert held.call is None
    assert next_call([book], NOW, POLICY, BOOK_THREADS, "book").call == Call(
        [book], alone=False, urgent=False, background=True
    )


def test_a_book_thread_waits_the_grace_left(loop: asyncio.AbstractEventLoop) -> None:
    seen = LaneUse(lanes=2, book_lanes=2, request_seen=NOW)
    decision = next_call([entry(loop, BACKGROUND_PRIORITY)], NOW + 0.1, POLICY, seen, "book")
    assert decision.call is None
    assert decision.wait == pytest.approx(BOOK_GRACE_S - 0.1)


def test_cancelled_entries_are_skipped_by_whichever_thread_looks(loop: asyncio.AbstractEventLoop) -> None:
    gone, live = entry(loop, name="gone"), entry(loop, name="live")
    gone.future.cancel()
    decision = next_call([gone, live], NOW, POLICY, TWO_LANES, "lane")
    assert decision.skipped == [gone]
    assert decision.call is not None
    assert decision.call.batch == [live]


def test_threads_are_named_for_their_roles() -> None:
    assert role_of(URGENT) == "urgent"
    assert role_of(f"{BOOK_LANE}0") == "book"
    assert role_of("engine-0") == role_of("engine-3") == "lane"


# --- a failed batch ---------------------------------------------------------------------------------------


def test_a_failed_batch_retries_in_halves_of_its_live_entries(loop: asyncio.AbstractEventLoop) -> None:
    batch = [entry(loop, name=name) for name in "abcde"]
    batch[1].future.cancel()
    halves, skipped = retry_halves(batch)
    assert [[e.request_id for e in half] for half in halves] == [["a", "c"], ["d", "e"]]
    assert skipped == [batch[1]]
    lone, nothing = retry_halves([batch[0], batch[1]])
    assert lone == [[batch[0]]]
    assert nothing == [batch[1]]
