from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from api.engine.base import BatchPolicy, SynthesisItem
from api.engine.scheduling.batching import BatchOverrides
from api.engine.scheduling.entries import (
    BACKGROUND_PRIORITY,
    FIRST_CHUNK_PRIORITY,
    LATER_CHUNK_PRIORITY,
    QueueFullError,
)
from api.engine.scheduling.lifecycle import EngineState
from api.engine.scheduling.niceness import LANE_NICENESS
from api.engine.scheduling.scheduler import Scheduler
from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine, FakeLanedEngine, FakeSteppedEngine

FAIL = 99


def item(n: int = 3, *, speed: float = 1.0, fail: bool = False) -> SynthesisItem:
    tokens = (*range(1, n), FAIL if fail else n)
    return SynthesisItem(tokens=tokens, style=np.zeros(256, np.float32), speed=speed)


def expected_samples(n: int, speed: float = 1.0) -> int:
    return int(n * SAMPLES_PER_TOKEN / speed)


def wait_ready(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + 10
    while scheduler.state is EngineState.STARTING and time.monotonic() < deadline:
        time.sleep(0.01)


def test_results_arrive_in_submission_order() -> None:
    async def main() -> list[int]:
        scheduler = Scheduler(FakeEngine(), max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), "r") for n in (1, 2, 3)]
        lengths = [len((await future).samples) for future in futures]
        scheduler.stop()
        return lengths

    assert asyncio.run(main()) == [1200, 2400, 3600]


def test_cancelled_entries_are_skipped() -> None:
    engine = FakeEngine(delay=0.2)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        wait_ready(scheduler)
        first = scheduler.submit(item(1), "a")
        doomed = [scheduler.submit(item(2), "b") for _ in range(3)]
        for future in doomed:
            future.cancel()
        last = scheduler.submit(item(4), "c")
        await first
        await last
        scheduler.stop()
        assert scheduler.chunks_skipped == 3

    asyncio.run(main())
    assert [len(call.tokens) for call in engine.calls] == [1, 4]


def test_queue_bound() -> None:
    async def main() -> None:
        scheduler = Scheduler(FakeEngine(load_delay=0.5), max_queued=2)
        scheduler.start()
        scheduler.submit(item(), "a")
        scheduler.submit(item(), "a")
        with pytest.raises(QueueFullError):
            scheduler.submit(item(), "a")
        scheduler.stop()

    asyncio.run(main())


def test_load_failure_is_reported_and_fails_entries() -> None:
    def broken() -> None:
        raise OSError("no weights here")

    async def main() -> None:
        scheduler = Scheduler(FakeEngine(), max_queued=4, prepare=broken)
        scheduler.start()
        wait_ready(scheduler)
        assert scheduler.state is EngineState.FAILED
        assert "no weights here" in (scheduler.failure or "")
        with pytest.raises(RuntimeError, match="failed to load"):
            await scheduler.submit(item(), "a")
        scheduler.stop()

    asyncio.run(main())


def test_engine_error_reaches_only_its_future() -> None:
    async def main() -> None:
        scheduler = Scheduler(FakeEngine(fail_token=FAIL), max_queued=4)
        scheduler.start()
        bad = scheduler.submit(item(1, fail=True), "bad")
        good = scheduler.submit(item(2), "good")
        with pytest.raises(RuntimeError, match="fake engine failure"):
            await bad
        assert len((await good).samples) == 2400
        scheduler.stop()

    asyncio.run(main())


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="max_queued"):
        Scheduler(FakeEngine(), max_queued=0)


def test_entries_queued_while_loading_run_in_full_batches() -> None:
    # Ten chunks arrive while the engine loads; it then takes them four at a time, in order.
    engine = FakeEngine(load_delay=0.5, max_batch_size=4)
    sizes = [(10 + i, 1.0 + 0.1 * (i % 3)) for i in range(10)]

    async def main() -> list[int]:
        scheduler = Scheduler(engine, max_queued=16)
        scheduler.start()
        futures = [scheduler.submit(item(n, speed=speed), f"r{i}") for i, (n, speed) in enumerate(sizes)]
        lengths = [len((await future).samples) for future in futures]
        scheduler.stop()
        assert scheduler.chunks_done == 10
        return lengths

    assert asyncio.run(main()) == [expected_samples(n, speed) for n, speed in sizes]
    assert [len(batch) for batch in engine.batches] == [4, 4, 2]
    assert [len(call.tokens) for call in engine.batches[0]] == [10, 11, 12, 13]


def run_with_one_failure(bad_first: bool) -> FakeEngine:
    engine = FakeEngine(load_delay=0.5, max_batch_size=4, fail_token=FAIL)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        bad = scheduler.submit(item(13, fail=True), "bad") if bad_first else None
        good = [scheduler.submit(item(n), f"good{n}") for n in (10, 11, 12)]
        bad = bad or scheduler.submit(item(13, fail=True), "bad")
        with pytest.raises(RuntimeError, match="fake engine failure"):
            await bad
        assert [len((await future).samples) for future in good] == [expected_samples(n) for n in (10, 11, 12)]
        scheduler.stop()

    asyncio.run(main())
    return engine


def test_a_failing_chunk_fails_alone_and_its_batch_mates_succeed() -> None:
    engine = run_with_one_failure(bad_first=True)
    # The batch of four fails at its first chunk, then its halves run; the failing half is split again.
    assert [[len(call.tokens) for call in batch] for batch in engine.batches] == [
        [13, 10, 11, 12],
        [13, 10],
        [13],
        [10],
        [11, 12],
    ]


def test_chunks_delivered_before_a_failure_are_not_run_again() -> None:
    engine = run_with_one_failure(bad_first=False)
    # 10, 11 and 12 were resolved as soon as they were done: only the failing chunk is left, and it fails.
    assert [[len(call.tokens) for call in batch] for batch in engine.batches] == [[10, 11, 12, 13]]


def test_cancelled_entries_never_reach_a_batch() -> None:
    engine = FakeEngine(load_delay=0.5, max_batch_size=8)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), f"r{n}") for n in (10, 11, 12, 13, 14)]
        futures[1].cancel()
        futures[3].cancel()
        for future in (futures[0], futures[2], futures[4]):
            await future
        scheduler.stop()
        assert scheduler.chunks_skipped == 2

    asyncio.run(main())
    assert [[len(call.tokens) for call in batch] for batch in engine.batches] == [[10, 12, 14]]


def test_overrides_apply_once_the_engine_has_loaded() -> None:
    engine = FakeEngine(load_delay=0.3, max_batch_size=8, batch_timeout=0.5)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8, overrides=BatchOverrides(max_batch_size=2))
        scheduler.start()
        assert scheduler.policy is None
        futures = [scheduler.submit(item(n), "r") for n in (10, 11, 12)]
        for future in futures:
            await future
        scheduler.stop()
        assert scheduler.policy == BatchPolicy(
            max_batch_size=2, batch_timeout=0.5, max_batch_tokens=100_000, length_ratio=2.0
        )

    asyncio.run(main())
    assert [len(batch) for batch in engine.batches] == [2, 1]


def test_stop_fails_waiting_entries_promptly() -> None:
    # A lone chunk would wait ten minutes for company; stop() must not.
    policy = BatchPolicy(max_batch_size=4, batch_timeout=600.0, max_batch_tokens=1000, length_ratio=2.0)

    async def main() -> float:
        scheduler = Scheduler(FakeEngine(), max_queued=4, policy=policy)
        scheduler.start()
        wait_ready(scheduler)
        future = scheduler.submit(item(), "a")
        await asyncio.sleep(0.1)
        started = time.monotonic()
        scheduler.stop()
        elapsed = time.monotonic() - started
        with pytest.raises(RuntimeError, match="stopped"):
            await future
        with pytest.raises(RuntimeError, match="stopped"):
            await scheduler.submit(item(), "b")
        assert scheduler.state is EngineState.STOPPED
        return elapsed

    assert asyncio.run(main()) < 60


def test_first_chunks_overtake_queued_later_chunks() -> None:
    engine = FakeEngine(load_delay=0.5)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        later = [scheduler.submit(item(n), "playing") for n in (10, 11)]
        first = scheduler.submit(item(12), "new", priority=FIRST_CHUNK_PRIORITY)
        for future in (*later, first):
            await future
        scheduler.stop()

    asyncio.run(main())
    assert [len(call.tokens) for call in engine.calls] == [12, 10, 11]


def test_each_chunk_is_resolved_as_soon_as_the_engine_has_it() -> None:
    engine = FakeEngine(load_delay=0.5, delay=0.5, max_batch_size=3)

    async def main() -> list[int]:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), f"r{n}") for n in (10, 11, 12)]
        done_when_first_arrived = []
        for future in futures:
            await future
            done_when_first_arrived.append(len(engine.calls))
        scheduler.stop()
        return done_when_first_arrived

    seen = asyncio.run(main())
    assert [len(batch) for batch in engine.batches] == [3]
    # The first chunk's future was resolved while the engine was still on the rest of its batch.
    assert seen[0] < 3


def stepped_item(first_token: int, n: int = 5) -> SynthesisItem:
    return SynthesisItem(tokens=(first_token,) * n, style=np.zeros(256, np.float32), speed=1.0)


async def begun_chunk(
    engine: FakeSteppedEngine, item: SynthesisItem, request_id: str
) -> tuple[Scheduler, asyncio.Future[np.ndarray]]:
    """A started scheduler over `engine` and the future of `item`, once the engine has run its first step."""
    scheduler = Scheduler(engine, max_queued=8)
    scheduler.start()
    wait_ready(scheduler)
    future = scheduler.submit(item, request_id)
    while not engine.step_log:
        await asyncio.sleep(0.005)
    return scheduler, future


def test_a_stepped_engine_runs_a_first_chunk_between_the_steps_of_a_long_one() -> None:
    engine = FakeSteppedEngine(steps=10, step_delay=0.02)

    async def main() -> tuple[float, float, int, int]:
        scheduler, long_chunk = await begun_chunk(engine, stepped_item(7, 40), "long")
        first = scheduler.submit(stepped_item(9, 3), "first", priority=FIRST_CHUNK_PRIORITY)
        first_audio = await first
        first_done = time.monotonic()
        long_audio = await long_chunk
        long_done = time.monotonic()
        scheduler.stop()
        return first_done, long_done, len(first_audio.samples), len(long_audio.samples)

    first_done, long_done, first_length, long_length = asyncio.run(main())
    assert first_done < long_done
    assert (first_length, long_length) == (expected_samples(3), expected_samples(40))
    # The first chunk's ten steps ran together, inside the long chunk's ten.
    log = engine.step_log
    start = log.index(9)
    assert log[start : start + 10] == [9] * 10
    assert log[0] == 7
    assert log[-1] == 7
    assert log.count(7) == 10


def test_stopping_fails_a_begun_stepped_chunk() -> None:
    engine = FakeSteppedEngine(steps=50, step_delay=0.02)

    async def main() -> None:
        scheduler, future = await begun_chunk(engine, stepped_item(7), "r")
        await asyncio.to_thread(scheduler.stop)
        with pytest.raises(RuntimeError, match="stopped"):
            await future

    asyncio.run(main())
    assert engine.step_log.count(7) < 50


def test_a_cancelled_stepped_chunk_stops_between_steps() -> None:
    engine = FakeSteppedEngine(steps=50, step_delay=0.01)

    async def main() -> None:
        scheduler, doomed = await begun_chunk(engine, stepped_item(7), "gone")
        doomed.cancel()
        after = scheduler.submit(stepped_item(8), "next")
        await after
        scheduler.stop()
        assert scheduler.chunks_skipped == 1

    asyncio.run(main())
    assert engine.step_log.count(7) < 50


def test_lanes_run_calls_side_by_side_on_a_share_of_the_threads() -> None:
    # Six chunks queued while loading: two lanes take them two at a time, none of them alone.
    engine = FakeLanedEngine(lanes=2, delay=0.05, load_delay=0.3)

    async def main() -> list[int]:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), "r") for n in range(1, 7)]
        lengths = [len((await future).samples) for future in futures]
        scheduler.stop()
        assert scheduler.lanes == 2
        assert scheduler.chunks_done == 6
        return lengths

    assert asyncio.run(main()) == [expected_samples(n) for n in range(1, 7)]
    assert engine.most_at_once == 2
    assert engine.claims[:2] == [False, False]


def test_a_lone_call_gets_every_thread_and_nothing_starts_beside_it() -> None:
    engine = FakeLanedEngine(lanes=2, delay=0.2)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        wait_ready(scheduler)
        first = scheduler.submit(item(1), "a")  # nothing else queued: alone
        await asyncio.sleep(0.05)
        later = [scheduler.submit(item(n), "b") for n in (2, 3)]  # wait for it, then share
        await first
        for future in later:
            await future
        scheduler.stop()

    asyncio.run(main())
    assert engine.claims == [True, False, False]
    assert engine.events[:2] == [("start", 1), ("end", 1)]
    assert engine.most_at_once == 2


def test_a_first_chunk_with_only_later_chunks_waiting_gets_every_thread() -> None:
    # A live phrase's first chunk and the rest of it, submitted together: the first runs alone, the rest
    # after it (on a lane's share, as before); a second request's first chunk would still start beside.
    engine = FakeLanedEngine(lanes=2, delay=0.1)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        wait_ready(scheduler)
        first = scheduler.submit(item(1), "a", priority=FIRST_CHUNK_PRIORITY)
        later = [scheduler.submit(item(n), "a", priority=LATER_CHUNK_PRIORITY) for n in (2, 3)]
        await first
        for future in later:
            await future
        scheduler.stop()

    asyncio.run(main())
    assert engine.claims[0] is True
    assert engine.events[:2] == [("start", 1), ("end", 1)]
    assert engine.most_at_once == 2  # the later ones then side by side


def test_one_lane_runs_one_call_at_a_time() -> None:
    engine = FakeLanedEngine(lanes=1, delay=0.02)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), "r") for n in range(1, 5)]
        for future in futures:
            await future
        scheduler.stop()

    asyncio.run(main())
    assert engine.most_at_once == 1


def test_a_failure_in_one_lane_fails_only_its_chunk_and_stop_ends_every_lane() -> None:
    engine = FakeLanedEngine(lanes=2, delay=0.05, fail_token=FAIL, load_delay=0.2)

    async def main() -> Scheduler:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        bad = scheduler.submit(item(1, fail=True), "bad")
        good = [scheduler.submit(item(n), "good") for n in (2, 3, 4)]
        with pytest.raises(RuntimeError, match="fake engine failure"):
            await bad
        assert [len((await future).samples) for future in good] == [expected_samples(n) for n in (2, 3, 4)]
        scheduler.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            await scheduler.submit(item(), "late")
        return scheduler

    scheduler = asyncio.run(main())
    assert scheduler.state is EngineState.STOPPED
    assert not any(thread.is_alive() for thread in scheduler._lane_threads)


def test_a_first_chunk_starts_beside_busy_lanes() -> None:
    # Two long later chunks fill both lanes; a first chunk then starts at once beside them (one such call
    # at a time), while another later chunk waits for a lane.
    engine = FakeLanedEngine(lanes=2, delay=0.3, load_delay=0.2)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        later = [scheduler.submit(item(n), "r") for n in (2, 3)]
        wait_ready(scheduler)
        # Both lanes busy before anything else arrives (a fixed sleep lost this race on a loaded machine).
        deadline = time.monotonic() + 10
        while {("start", 2), ("start", 3)} - set(engine.events):
            assert time.monotonic() < deadline, engine.events
            await asyncio.sleep(0.005)
        waiting = scheduler.submit(item(4), "r")
        first = [scheduler.submit(item(n), f"new{n}", priority=FIRST_CHUNK_PRIORITY) for n in (5, 6)]
        for future in (*later, waiting, *first):
            await future
        scheduler.stop()

    asyncio.run(main())
    starts = [tokens for kind, tokens in engine.events if kind == "start"]
    assert starts[:3] == [2, 3, 5]
    assert engine.events.index(("start", 5)) < engine.events.index(("end", 2))
    assert engine.most_at_once == 3
    assert engine.claims[:3] == [False, False, True]  # the first chunk beside them gets every thread
    # ... and the OS runs it first: the lanes' threads are nicer than the process, its thread is not.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert engine.niceness[5] == own
    assert engine.niceness[2] == engine.niceness[3] == min(own + LANE_NICENESS, 19)


def test_a_books_chunks_run_on_idle_threads_of_their_own_beside_the_lanes() -> None:
    # A book's chunk runs on a thread of its own under SCHED_IDLE, on its lane's share of the
    # threads even with nothing beside it (its audio then never depends on what ran beside it); a request's
    # first chunk starts at once beside it, on every thread (it is alone among the requests' calls), the OS
    # gives it the cores, and no other book chunk starts until it is done.
    engine = FakeLanedEngine(lanes=2, delay=0.3)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        wait_ready(scheduler)
        book = [scheduler.submit(item(n), "book", priority=BACKGROUND_PRIORITY) for n in (2, 3, 4)]
        deadline = time.monotonic() + 10
        while {("start", 2), ("start", 3)} - set(engine.events):
            assert time.monotonic() < deadline, engine.events
            await asyncio.sleep(0.005)
        first = scheduler.submit(item(5), "new", priority=FIRST_CHUNK_PRIORITY)
        for future in (*book, first):
            await future
        scheduler.stop()

    asyncio.run(main())
    assert engine.claims[:3] == [False, False, True]  # the book's two on a share, the first on every thread
    assert engine.events.index(("start", 5)) < engine.events.index(("end", 2))
    ended = min(engine.events.index(("end", 2)), engine.events.index(("end", 3)))
    assert engine.events.index(("start", 4)) > ended  # one book chunk per lane
    assert engine.events.index(("start", 4)) > engine.events.index(("end", 5))  # none while a request's runs
    assert engine.policies[2] == engine.policies[3] == engine.policies[4] == os.SCHED_IDLE
    assert engine.policies[5] == os.SCHED_OTHER
    assert engine.niceness[5] == min(os.getpriority(os.PRIO_PROCESS, 0) + LANE_NICENESS, 19)  # a lane's


def test_independent_lanes_never_hold_each_other_back() -> None:
    # Lanes with their own streams or connections (pooled_threads False): a call that starts with nothing
    # beside it does not hold the other lane, and the lanes' threads keep the process's niceness.
    engine = FakeLanedEngine(lanes=2, pooled_threads=False, delay=0.3)

    async def main() -> None:
        scheduler = Scheduler(engine, max_queued=8)
        scheduler.start()
        wait_ready(scheduler)
        first = scheduler.submit(item(1), "a")
        await asyncio.sleep(0.05)
        second = scheduler.submit(item(2), "b")  # starts beside the first, not after it
        await first
        await second
        scheduler.stop()

    asyncio.run(main())
    assert engine.claims == [False, False]
    assert engine.events[:2] == [("start", 1), ("start", 2)]
    assert engine.most_at_once == 2
    assert set(engine.niceness.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}
