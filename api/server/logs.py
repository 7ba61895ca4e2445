"""Logging: text or JSON lines, and one access line per request (never the input text unless asked)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("api.access")

# LogRecord's own attributes: anything else on a record came from `extra=` and goes into the JSON line.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the `extra=` fields, and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({key: value for key, value in vars(record).items() if key not in _RECORD_FIELDS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def configure_logging(level: str, fmt: str = "text") -> None:
    """The server's logging, and kokoro's own (through loguru) kept to its warnings."""
    configure(level, fmt)
    from loguru import logger as loguru_logger

    loguru_logger.remove()
    loguru_logger.add(lambda message: logging.getLogger("kokoro").warning(message.rstrip()), level="WARNING")


class AccessLogMiddleware:
    """Logs each HTTP request once it has ended: request id, method, path, status, duration, the audio
    seconds sent (speech requests) and, only with `log_input`, the input text."""

    def __init__(self, app: ASGIApp, log_input: bool = False) -> None:
        self.app = app
        self.log_input = log_input

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 500, "request_id": None}

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                headers = dict(message.get("headers", []))
                request_id = headers.get(b"x-request-id")
                seen["request_id"] = request_id.decode() if request_id else None
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self._log(scope, seen, time.perf_counter() - started)

    def _log(self, scope: Scope, seen: dict[str, Any], seconds: float) -> None:
        state = scope.get("state", {})
        fields: dict[str, Any] = {
            "request_id": seen["request_id"],
            "method": scope["method"],
            "path": scope["path"],
            "status": seen["status"],
            "duration_ms": round(seconds * 1000, 1),
        }
        if "audio_seconds" in state:
            fields["audio_seconds"] = round(state["audio_seconds"](), 3)
        if "api_key" in state:
            fields["api_key"] = state["api_key"]
        if self.log_input and "input" in state:
            fields["input"] = state["input"]
        logger.info(
            "%s %s %s %.0f ms",
            fields["method"],
            fields["path"],
            fields["status"],
            fields["duration_ms"],
            extra=fields,
        )
