"""Admission control: a bounded number of requests in synthesis plus a bounded waiting line, per worker.

Beyond that (or after waiting too long) a request is refused before any work is done: HTTP's middleware
(api/server/admission.py) answers 503 with Retry-After, a live session its protocol's busy message.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from api.metrics import Metrics

# Weight of the newest request in the moving average of request durations.
_EWMA_WEIGHT = 0.2


class Overloaded(Exception):
    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class AdmissionController:
    """Counts requests in synthesis and in line; admits, queues or refuses; estimates Retry-After from the
    line and the recent time per request."""

    def __init__(
        self,
        max_inflight: int,
        max_waiting: int,
        max_wait_s: float,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_inflight < 1 or max_waiting < 0 or max_wait_s <= 0:
            raise ValueError("need max_inflight >= 1, max_waiting >= 0, max_wait_s > 0")
        self.max_inflight = max_inflight
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.inflight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.metrics = metrics
        self._clock = clock
        self._mean_duration_s = 2.0  # until measured: about one CPU chunk

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def mean_duration_s(self) -> float:
        """The recent time per request, from admission to release (a moving average)."""
        return self._mean_duration_s

    async def acquire(self) -> float:
        """Wait for a slot (or raise Overloaded); returns the admission time for `release`."""
        if self.inflight < self.max_inflight and not self._waiters:
            return self._admit()
        if len(self._waiters) >= self.max_waiting:
            raise Overloaded("too many requests waiting", self.retry_after())
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._publish()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.max_wait_s)
        except asyncio.TimeoutError:
            if not waiter.done():
                self._drop(waiter)
                raise Overloaded("waited too long for a slot", self.retry_after()) from None
        except asyncio.CancelledError:
            self._cancel(waiter)
            raise
        return self._clock()  # the slot was handed over by release(): inflight already counts it

    def release(self, admitted_at: float) -> None:
        duration = max(self._clock() - admitted_at, 0.0)
        self._mean_duration_s += _EWMA_WEIGHT * (duration - self._mean_duration_s)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand this slot straight to the next in line
                self._publish()
                return
        self.inflight -= 1
        self._publish()

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free: the line ahead, served max_inflight at a time."""
        rounds = (len(self._waiters) + 1) / self.max_inflight
        return max(1, math.ceil(rounds * self._mean_duration_s))

    def _admit(self) -> float:
        self.inflight += 1
        self._publish()
        return self._clock()

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        self._publish()

    def _cancel(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release(self._clock())  # a slot was handed to a request that is gone: pass it on
        else:
            waiter.cancel()
            self._drop(waiter)

    def _publish(self) -> None:
        if self.metrics is not None:
            self.metrics.in_flight.set(self.inflight)
            self.metrics.waiting.set(len(self._waiters))
