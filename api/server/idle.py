"""Idle unload: a worker that has had no work for KOKORO_IDLE_UNLOAD_S frees its model, and the next request
loads it again.

`IdleWatch` decides when (on the event loop, from counts the loop owns: requests in flight and waiting,
live sessions) and asks the scheduler, whose engine thread frees the model once nothing is queued or
running. `ReloadGate`, an ASGI middleware in front of the speech paths and the WebSockets, starts the reload
when a request finds the model unloaded and holds the request until the model is ready, or answers 503 +
Retry-After after KOKORO_RELOAD_WAIT_S. /ready stays 200 while unloaded (docs/operations.md#idle-unload).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Container
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from api.engine.scheduling.lifecycle import EngineState
from api.engine.scheduling.scheduler import Scheduler
from api.live.transport import TRY_AGAIN_LATER
from api.server.http_errors import error_body
from api.server.security import refuse_websocket, send_error
from api.speech.admission import AdmissionController

logger = logging.getLogger(__name__)

# How often the gate looks whether the reload is done, in seconds.
RELOAD_POLL_S = 0.05
# What a refused request is told to wait: about a CPU reload from the compile cache (docs/operations.md).
RELOAD_RETRY_AFTER_S = 10


@dataclass(frozen=True)
class Activity:
    """What the loop knows of the worker's work at one moment."""

    in_flight: int
    waiting: int
    live_sessions: int
    engine_idle_s: float


def unload_due(activity: Activity, idle_s: float) -> bool:
    """Whether a worker with this activity should free its model now; pure."""
    busy = activity.in_flight or activity.waiting or activity.live_sessions
    return not busy and activity.engine_idle_s >= idle_s


class IdleWatch:
    """Asks the scheduler to unload once `unload_due` says so; runs as a task on the event loop."""

    def __init__(
        self,
        scheduler: Scheduler,
        admission: AdmissionController,
        live_sessions: Callable[[], int],
        idle_s: float,
    ) -> None:
        if idle_s <= 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s}")
        self.scheduler = scheduler
        self.admission = admission
        self.live_sessions = live_sessions
        self.idle_s = idle_s
        self.interval_s = min(1.0, idle_s / 4)

    def activity(self) -> Activity:
        return Activity(
            in_flight=self.admission.inflight,
            waiting=self.admission.waiting,
            live_sessions=self.live_sessions(),
            engine_idle_s=self.scheduler.idle_s(),
        )

    def check(self) -> bool:
        """Ask for an unload if one is due; whether it was asked."""
        if self.scheduler.state is not EngineState.READY or not unload_due(self.activity(), self.idle_s):
            return False
        return self.scheduler.unload()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()


class ReloadGate:
    """ASGI middleware: a request on `paths` (or any WebSocket) that finds the model unloaded or reloading
    starts the reload and waits for it up to `wait_s`, then gets 503 + Retry-After (a WebSocket: an error
    event and close code 1013); the reload goes on. Every request that passes restarts the idle clock."""

    def __init__(self, app: ASGIApp, scheduler: Scheduler, paths: Container[str], wait_s: float) -> None:
        self.app = app
        self.scheduler = scheduler
        self.paths = paths
        self.wait_s = wait_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gated = scope["type"] == "websocket" or (scope["type"] == "http" and scope["path"] in self.paths)
        if gated and not await self._loaded():
            await self._refuse(scope, receive, send)
            return
        if gated:
            self.scheduler.touch()
        await self.app(scope, receive, send)

    async def _loaded(self) -> bool:
        """False only when the model was unloaded and is not loaded again within `wait_s`."""
        if self.scheduler.state not in (EngineState.UNLOADED, EngineState.RELOADING):
            return True
        self.scheduler.reload()
        deadline = time.monotonic() + self.wait_s
        while self.scheduler.state in (EngineState.UNLOADED, EngineState.RELOADING):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(RELOAD_POLL_S)
        return True

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            f"The model was unloaded while idle and is loading again (over {self.wait_s:g} s so far); "
            f"retry after {RELOAD_RETRY_AFTER_S} s."
        )
        body = error_body(message, "server_error", None, "model_loading")
        if scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send, body, TRY_AGAIN_LATER, "model loading")
            return
        await send_error(send, 503, body, {"Retry-After": str(RELOAD_RETRY_AFTER_S)})
