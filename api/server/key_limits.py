"""Per-key limits: no API key can take a worker's speech slots from the others. Each key may hold a bounded
number of speech requests (in synthesis or in line) and start them at a bounded rate; one over its share
gets 429 with Retry-After in OpenAI's shape (`rate_limit_exceeded`) before any work, while the other keys
go on through the global admission (api/server/admission.py) as before. Servers without keys keep the
global admission alone.

The decision is a pure function of a key's state and the clock (`decide`); the middleware only keeps the
states and answers."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from starlette.types import ASGIApp, Receive, Scope, Send

from api.metrics import Metrics
from api.server.http_errors import error_body
from api.server.security import send_error

# A rate's bucket holds this many seconds of requests unless its burst is set.
DEFAULT_BURST_S = 10.0
# A refusal is answered after this long (or its Retry-After, if shorter): a client that loops on its 429s
# without waiting then sends a request a second per connection, not thousands, and does not take the CPU
# that the other keys' synthesis needs (measured: docs/operations.md#per-key-limits).
REFUSAL_HOLD_S = 1.0


@dataclass(frozen=True)
class KeyPolicy:
    """What each key may do, per worker: `max_inflight` requests at once (None: no bound), started at
    `rate_per_s` (0: no bound) with bursts of up to `burst` requests."""

    max_inflight: int | None
    rate_per_s: float = 0.0
    burst: float = 1.0

    def __post_init__(self) -> None:
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError(f"max_inflight must be at least 1 or None, got {self.max_inflight}")
        if self.rate_per_s < 0 or (self.rate_per_s > 0 and self.burst < 1):
            raise ValueError("need rate_per_s >= 0 and, with a rate, burst >= 1")

    @property
    def bounded(self) -> bool:
        return self.max_inflight is not None or self.rate_per_s > 0


@dataclass(frozen=True)
class KeyState:
    """A key's requests in flight, and its rate bucket's tokens as of `updated` (a clock reading)."""

    inflight: int
    tokens: float
    updated: float


@dataclass(frozen=True)
class Refusal:
    reason: str  # "concurrency" or "rate"
    retry_after: int
    message: str


def fresh_state(policy: KeyPolicy, now: float) -> KeyState:
    return KeyState(0, policy.burst, now)


def decide(
    policy: KeyPolicy, state: KeyState, now: float, mean_duration_s: float
) -> tuple[KeyState, Refusal | None]:
    """A request of a key in `state` at `now`: its new state and None where it may go on, else the
    state (its bucket refilled, nothing taken) and why not. `mean_duration_s` (recent requests' time)
    estimates when one of the key's own requests ends."""
    tokens = state.tokens
    if policy.rate_per_s > 0:
        tokens = min(policy.burst, tokens + max(now - state.updated, 0.0) * policy.rate_per_s)
    refilled = replace(state, tokens=tokens, updated=now)
    if policy.max_inflight is not None and state.inflight >= policy.max_inflight:
        message = (
            f"This API key already has {state.inflight} speech requests in progress, its limit on this "
            f"server; retry after one ends."
        )
        return refilled, Refusal("concurrency", max(1, math.ceil(mean_duration_s)), message)
    if policy.rate_per_s > 0 and tokens < 1:
        wait = math.ceil((1 - tokens) / policy.rate_per_s)
        per_minute = policy.rate_per_s * 60
        message = f"This API key is over its rate of {per_minute:g} speech requests a minute on this server."
        return refilled, Refusal("rate", max(1, wait), message)
    spent = tokens - 1 if policy.rate_per_s > 0 else tokens
    return replace(refilled, inflight=state.inflight + 1, tokens=spent), None


def finish(state: KeyState) -> KeyState:
    return replace(state, inflight=max(state.inflight - 1, 0))


def default_share(max_inflight: int, keys: int) -> int | None:
    """A key's share of a worker's slots where none is set: the slots shared out evenly (at least one
    each), so that no key ever waits for another's requests; no bound with fewer than two keys."""
    return max(1, max_inflight // keys) if keys >= 2 else None


class KeyLimitMiddleware:
    """ASGI middleware for the speech paths: counts each key's requests (the label ApiKeyMiddleware puts in
    `scope["state"]["api_key"]`) and refuses one over its policy with 429 + Retry-After before it reaches
    the reload gate or admission, `hold_s` after it came. Requests without a key label pass untouched."""

    def __init__(
        self,
        app: ASGIApp,
        policy: KeyPolicy,
        paths: Container[str],
        mean_duration_s: Callable[[], float],
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        hold_s: float = REFUSAL_HOLD_S,
    ) -> None:
        self.app = app
        self.hold_s = hold_s
        self.policy = policy
        self.paths = paths
        self.mean_duration_s = mean_duration_s
        self.metrics = metrics
        self.clock = clock
        self.states: dict[str, KeyState] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = scope.get("state", {}).get("api_key") if scope["type"] == "http" else None
        if key is None or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        now = self.clock()
        state = self.states.get(key) or fresh_state(self.policy, now)
        self.states[key], refusal = decide(self.policy, state, now, self.mean_duration_s())
        if refusal is not None:
            if self.metrics is not None:
                self.metrics.key_limited.labels(key=key, reason=refusal.reason).inc()
            body = error_body(refusal.message, "requests", None, "rate_limit_exceeded")
            await asyncio.sleep(min(self.hold_s, refusal.retry_after))
            await send_error(send, 429, body, {"Retry-After": str(refusal.retry_after)})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.states[key] = finish(self.states[key])
