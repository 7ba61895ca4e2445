"""What a server on a public port needs: optional API keys (OpenAI's `Authorization: Bearer KEY`), a bound
on request bodies enforced while they arrive, and timeouts for clients that send or read too slowly.
All are plain ASGI middlewares, so a refusal costs no work."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.live.transport import KEY_SUBPROTOCOL, LIVE_SUBPROTOCOL, POLICY_VIOLATION, chosen_subprotocol
from api.server.http_errors import error_body

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApiKey:
    """A key and the label metrics show for it (never the key itself)."""

    label: str
    secret: bytes


def parse_keys(lines: Iterable[str]) -> list[ApiKey]:
    """Keys from `LABEL:KEY` or bare `KEY` entries (blank lines and `#` comments skipped); a bare key's
    label is `key-` and the first 8 hex digits of its SHA-256."""
    keys = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        label, _, secret = line.rpartition(":") if ":" in line else ("", "", line)
        secret = secret.strip()
        label = label.strip() or "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]
        keys.append(ApiKey(label, secret.encode()))
    return keys


def load_keys(listed: str, file: Path | None) -> list[ApiKey]:
    """The keys of a comma-separated setting and of a file with one entry per line."""
    keys = parse_keys(listed.split(","))
    if file is not None:
        keys += parse_keys(file.read_text(encoding="utf-8").splitlines())
    return keys


class MissingKeysError(Exception):
    """Keys are required (require_api_keys) and none is set."""


def required_keys(listed: str, file: Path | None, required: bool) -> list[ApiKey]:
    """`load_keys`, refusing an empty result when keys are required."""
    keys = load_keys(listed, file)
    if required and not keys:
        raise MissingKeysError(
            "KOKORO_REQUIRE_API_KEYS is on and no API key is set: set KOKORO_API_KEYS (comma-separated KEY "
            "or LABEL:KEY) or KOKORO_API_KEYS_FILE, or set KOKORO_REQUIRE_API_KEYS=false to serve without "
            "keys (docs/deploy.md#compose)"
        )
    return keys


def match_key(keys: Iterable[ApiKey], presented: bytes) -> ApiKey | None:
    """The key presented, compared with every key in constant time (no early exit on a match)."""
    found = None
    for key in keys:
        if hmac.compare_digest(key.secret, presented):
            found = key
    return found


async def send_error(send: Send, status: int, body: dict[str, object], headers: Mapping[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def refuse_websocket(
    scope: Scope, receive: Receive, send: Send, body: dict[str, object], code: int, reason: str
) -> None:
    """Refuse a WebSocket so that a browser too can read why: accept it, send the error as an event, and
    close with `code` (a refusal before the handshake reaches a browser as a bare 1006)."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept", "subprotocol": chosen_subprotocol(scope)})
    await send({"type": "websocket.send", "text": json.dumps({"type": "error", **body})})
    await send({"type": "websocket.close", "code": code, "reason": reason})


class ApiKeyMiddleware:
    """Requests outside `open_paths` need `Authorization: Bearer KEY` with a configured key, else 401 in
    OpenAI's shape (`invalid_api_key`); a WebSocket may send the key as a subprotocol instead, and is
    refused with an error event and close code 1008. The key's label goes to `scope["state"]["api_key"]`
    for metrics."""

    def __init__(
        self,
        app: ASGIApp,
        keys: list[ApiKey],
        open_paths: frozenset[str],
        open_prefixes: tuple[str, ...] = (),
        open_reads: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.open_reads = open_reads  # open to GET (and HEAD) only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = scope["type"] == "websocket"
        preflight = scope["type"] == "http" and scope["method"] == "OPTIONS"
        if not (websocket or scope["type"] == "http") or preflight or self._open(scope):
            await self.app(scope, receive, send)
            return
        key = match_key(self.keys, _bearer(scope) or (_subprotocol_key(scope) if websocket else b""))
        if key is None:
            message = "Incorrect API key provided. Send it as 'Authorization: Bearer YOUR_KEY'" + (
                f" or as the subprotocol '{KEY_SUBPROTOCOL}YOUR_KEY' beside '{LIVE_SUBPROTOCOL}'."
                if websocket
                else "."
            )
            body = error_body(message, "invalid_request_error", None, "invalid_api_key")
            if websocket:
                await refuse_websocket(scope, receive, send, body, POLICY_VIOLATION, "invalid API key")
            else:
                await send_error(send, 401, body, {"WWW-Authenticate": "Bearer"})
            return
        scope.setdefault("state", {})["api_key"] = key.label
        await self.app(scope, receive, send)

    def _open(self, scope: Scope) -> bool:
        path = scope["path"]
        if path in self.open_paths or path.startswith(self.open_prefixes):
            return True
        return scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and path in self.open_reads


def _subprotocol_key(scope: Scope) -> bytes:
    """A browser's key: its WebSocket cannot send headers, only subprotocols."""
    for offered in scope.get("subprotocols", []):
        if offered.startswith(KEY_SUBPROTOCOL):
            return str(offered)[len(KEY_SUBPROTOCOL) :].encode()
    return b""


# The headers that carry a key: OpenAI's `Authorization: Bearer KEY`, Deepgram's `Authorization: Token KEY`,
# ElevenLabs' `xi-api-key: KEY`, Cartesia's `X-API-Key: KEY` (the voice-agent protocols, api/live/).
AUTH_SCHEMES = (b"bearer", b"token")
KEY_HEADERS = (b"xi-api-key", b"x-api-key")


def _bearer(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() in AUTH_SCHEMES:
                return bytes(token).strip()
        elif name in KEY_HEADERS:
            return bytes(value).strip()
    return b""


class LimitsMiddleware:
    """Bounds what a client can hold: a body over `max_body_bytes` is refused with 413 (at once when its
    Content-Length says so, else as soon as that many bytes have arrived, never reading the rest); a
    body not received within `body_timeout_s` gets 408; a response piece the client does not take within
    `send_timeout_s` ends the connection (a stalled reader would otherwise hold its slot forever).

    The body errors are raised as HTTPExceptions from `receive`: FastAPI passes those on while reading a
    body, and the app's handlers answer them in the one error shape."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float,
        send_timeout_s: float,
        path_limits: Mapping[str, int] | None = None,
    ) -> None:
        """`path_limits`: a path whose bodies have a limit of their own (a book's file)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})
        self.body_timeout_s = body_timeout_s
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            body = error_body(
                self._too_large(limit).detail, "invalid_request_error", None, "request_too_large"
            )
            await send_error(send, 413, body, {"Connection": "close"})
            return
        await self.app(scope, self._bounded(receive, limit), self._timed(send))

    def _bounded(self, receive: Receive, limit: int) -> Receive:
        received = 0
        deadline: float | None = None

        async def bounded() -> Message:
            nonlocal received, deadline
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.body_timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
            except TimeoutError as exc:
                raise HTTPException(
                    408, f"The request body did not arrive within {self.body_timeout_s:g} s."
                ) from exc
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self._too_large(limit)
                if not message.get("more_body", False):
                    deadline = float("inf")  # the body is in: later receives wait for a disconnect
            return message

        return bounded

    def _timed(self, send: Send) -> Send:
        async def timed(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except TimeoutError:
                logger.warning(
                    "a client took over %g s to take a response piece: closing", self.send_timeout_s
                )
                raise

        return timed

    @staticmethod
    def _too_large(limit: int) -> HTTPException:
        return HTTPException(413, f"The request body is larger than {limit} bytes.")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
