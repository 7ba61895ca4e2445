"""Admission over HTTP: an ASGI middleware that takes a slot of the admission controller
(api/speech/admission.py) before a speech request reaches the app, and answers 503 with Retry-After when there
is none."""

from __future__ import annotations

import json
from collections.abc import Container

from starlette.types import ASGIApp, Receive, Scope, Send

from api.server.http_errors import error_body
from api.speech.admission import AdmissionController, Overloaded


class AdmissionMiddleware:
    """ASGI middleware: takes a slot before the request reaches the app, gives it back when the response
    is over (stream finished, client gone or error). Only the paths given are controlled."""

    def __init__(self, app: ASGIApp, controller: AdmissionController, paths: Container[str]) -> None:
        self.app = app
        self.controller = controller
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        try:
            admitted_at = await self.controller.acquire()
        except Overloaded as exc:
            await self._refuse(exc, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.controller.release(admitted_at)

    async def _refuse(self, exc: Overloaded, send: Send) -> None:
        metrics = self.controller.metrics
        if metrics is not None:
            metrics.rejected.inc()
        message = f"The server is overloaded ({exc.reason}); retry after {exc.retry_after} s."
        body = json.dumps(error_body(message, "server_error", None, "overloaded")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(exc.retry_after).encode()),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
