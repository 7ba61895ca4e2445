from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from api.engine.base import SynthesisItem
from api.engine.scheduler import EngineState, QueueFullError, Scheduler
from tests.fakes import FakeEngine


def item(n: int = 3) -> SynthesisItem:
    return SynthesisItem(tokens=tuple(range(1, n + 1)), style=np.zeros(256, np.float32), speed=1.0)


def wait_ready(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + 10
    while scheduler.state is EngineState.STARTING and time.monotonic() < deadline:
        time.sleep(0.01)


def test_results_arrive_in_submission_order() -> None:
    async def main() -> list[int]:
        scheduler = Scheduler(FakeEngine(), max_queued=8)
        scheduler.start()
        futures = [scheduler.submit(item(n), "r") for n in (1, 2, 3)]
        lengths = [len(await future) for future in futures]
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
        scheduler = Scheduler(FakeEngine(fail_token=99), max_queued=4)
        scheduler.start()
        bad = scheduler.submit(SynthesisItem((99,), np.zeros(256, np.float32), 1.0), "bad")
        good = scheduler.submit(item(2), "good")
        with pytest.raises(RuntimeError, match="fake engine failure"):
            await bad
        assert len(await good) == 2400
        scheduler.stop()

    asyncio.run(main())


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="max_queued"):
        Scheduler(FakeEngine(), max_queued=0)
