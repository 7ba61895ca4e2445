"""Admission control: limits, the waiting line, time-outs, hand-over on release, Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from api.speech.admission import AdmissionController, Overloaded


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_admits_up_to_the_limit_then_queues_then_refuses() -> None:
    async def main() -> None:
        controller = AdmissionController(max_inflight=2, max_waiting=1, max_wait_s=5)
        first = await controller.acquire()
        await controller.acquire()
        assert controller.inflight == 2
        waiter = asyncio.create_task(controller.acquire())
        await asyncio.sleep(0)
        assert controller.waiting == 1
        with pytest.raises(Overloaded) as info:
            await controller.acquire()
        assert info.value.retry_after >= 1
        controller.release(first)  # hands the slot to the waiter
        await waiter
        assert (controller.inflight, controller.waiting) == (2, 0)

    run(main())


def test_waiting_too_long_is_refused() -> None:
    async def main() -> None:
        controller = AdmissionController(max_inflight=1, max_waiting=4, max_wait_s=0.05)
        await controller.acquire()
        with pytest.raises(Overloaded, match="waited too long"):
            await controller.acquire()
        assert controller.waiting == 0

    run(main())


def test_a_cancelled_waiter_leaves_the_line() -> None:
    async def main() -> None:
        controller = AdmissionController(max_inflight=1, max_waiting=4, max_wait_s=5)
        held = await controller.acquire()
        waiter = asyncio.create_task(controller.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert controller.waiting == 0
        controller.release(held)
        assert controller.inflight == 0

    run(main())


def test_a_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    async def main() -> None:
        controller = AdmissionController(max_inflight=1, max_waiting=4, max_wait_s=5)
        held = await controller.acquire()
        doomed = asyncio.create_task(controller.acquire())
        patient = asyncio.create_task(controller.acquire())
        await asyncio.sleep(0)
        controller.release(held)  # the slot goes to `doomed`...
        doomed.cancel()  # ...which is cancelled before it runs
        (outcome,) = await asyncio.gather(doomed, return_exceptions=True)
        if not isinstance(outcome, BaseException):
            # asyncio.wait_for may still return a result that was ready when the cancel came: the slot is
            # then held, as by any admitted request, until its release.
            controller.release(outcome)
        await asyncio.wait_for(patient, 1)  # either way the slot reaches `patient`
        assert controller.inflight == 1

    run(main())


def test_release_without_waiters_frees_the_slot() -> None:
    async def main() -> None:
        controller = AdmissionController(max_inflight=1, max_waiting=0, max_wait_s=1)
        controller.release(await controller.acquire())
        assert controller.inflight == 0
        await controller.acquire()

    run(main())


def test_retry_after_grows_with_the_line_and_the_request_time() -> None:
    now = [0.0]
    controller = AdmissionController(max_inflight=1, max_waiting=10, max_wait_s=1, clock=lambda: now[0])

    async def main() -> None:
        admitted = await controller.acquire()
        now[0] = 10.0
        controller.release(admitted)  # one request took 10 s

    run(main())
    quick = controller.retry_after()
    assert quick >= 1
    controller._waiters.extend([asyncio.Future.__new__(asyncio.Future) for _ in range(3)])  # type: ignore[misc]
    assert controller.retry_after() > quick


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="max_inflight"):
        AdmissionController(max_inflight=0, max_waiting=1, max_wait_s=1)
