"""`python -m api.server.drain` (the pod's preStop hook): waits while requests are in flight or waiting."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import generate_latest

from api.metrics import Metrics
from api.server.drain import SETTLE_S, UNANSWERED_S, Outcome, busy_requests, wait_idle


class Clock:
    """A clock that moves only when the drain sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def replay(values: list[float | Exception]) -> Callable[[], float]:
    """Each poll gets the next value (the last one repeats); an exception is raised instead."""
    remaining: Iterator[float | Exception] = iter(values)
    last: list[float | Exception] = [values[0]]

    def busy() -> float:
        last[0] = next(remaining, last[0])
        if isinstance(last[0], Exception):
            raise last[0]
        return last[0]

    return busy


def test_busy_requests_adds_in_flight_waiting_and_live_sessions() -> None:
    metrics = Metrics()
    metrics.in_flight.inc(3)
    metrics.waiting.inc(2)
    metrics.live_sessions.set(4)  # open sockets, speaking or not
    metrics.queue_depth.inc(7)  # chunks, not requests
    assert busy_requests(generate_latest(metrics.registry).decode()) == 9


def test_an_open_live_session_keeps_the_pod_busy() -> None:
    metrics = Metrics()
    metrics.live_sessions.set(1)
    assert busy_requests(generate_latest(metrics.registry).decode()) == 1


def test_returns_once_idle_for_the_settle_time() -> None:
    clock = Clock()
    assert wait_idle(replay([2, 1, 0]), timeout=100, clock=clock, sleep=clock.sleep) is Outcome.IDLE
    assert 2 + SETTLE_S <= clock.now <= 3 + SETTLE_S


def test_a_request_arriving_while_settling_restarts_the_wait() -> None:
    clock = Clock()
    assert wait_idle(replay([0, 0, 1, 0]), timeout=100, clock=clock, sleep=clock.sleep) is Outcome.IDLE
    assert clock.now >= 3 + SETTLE_S


def test_gives_up_at_the_timeout() -> None:
    clock = Clock()
    assert wait_idle(replay([1]), timeout=30, clock=clock, sleep=clock.sleep) is Outcome.BUSY
    assert 30 <= clock.now <= 31


def test_a_short_read_failure_counts_as_busy() -> None:
    clock = Clock()
    outcome = wait_idle(replay([ConnectionRefusedError(), 0]), timeout=100, clock=clock, sleep=clock.sleep)
    assert outcome is Outcome.IDLE
    assert clock.now >= 1 + SETTLE_S


def test_a_server_that_stops_answering_is_given_up_on_long_before_the_timeout() -> None:
    clock = Clock()
    outcome = wait_idle(replay([2, TimeoutError("timed out")]), timeout=360, clock=clock, sleep=clock.sleep)
    assert outcome is Outcome.UNANSWERED
    assert UNANSWERED_S <= clock.now <= UNANSWERED_S + 2


def test_an_answer_between_failures_restarts_the_unanswered_count() -> None:
    clock = Clock()
    failure = OSError("down")
    reads: list[float | Exception] = [*[failure] * 8, 1, *[failure] * 8, 1, 0]
    outcome = wait_idle(replay(reads), timeout=360, clock=clock, sleep=clock.sleep)
    assert outcome is Outcome.IDLE
    assert clock.now >= 18 + SETTLE_S
