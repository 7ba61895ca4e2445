"""The speech routes' request metrics (api/metrics.py): status, time to first audio byte and latency, recorded
by an ASGI middleware around the paths given."""

from __future__ import annotations

import time
from collections.abc import Container

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.metrics import Metrics


class RequestMetricsMiddleware:
    """ASGI middleware recording status, time to first audio byte and latency of the given paths."""

    def __init__(self, app: ASGIApp, metrics: Metrics, paths: Container[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = {"status": 500, "first": False}

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and message.get("body") and not state["first"]:
                state["first"] = True
                if state["status"] == 200:
                    self.metrics.time_to_first_audio.observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self.metrics.requests.labels(status=str(state["status"])).inc()
            key = scope.get("state", {}).get("api_key")
            if key is not None:
                self.metrics.requests_by_key.labels(key=key, status=str(state["status"])).inc()
            if state["status"] == 200:
                self.metrics.latency.observe(time.perf_counter() - started)
