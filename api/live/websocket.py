"""The live session's transport over Starlette's WebSocket: the live route's and the vendor sockets'."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from api.errors import InvalidRequestError
from api.live.transport import Frame
from api.settings import Settings


class WebSocketTransport:
    """A `Transport` over one WebSocket: its frames as they come, each bounded by the live message limit;
    a socket that is gone or already closed, when sent to, as ConnectionError."""

    def __init__(self, websocket: WebSocket, settings: Settings) -> None:
        self.websocket = websocket
        self.max_message_bytes = settings.live_max_message_bytes

    @property
    def subprotocols(self) -> Sequence[str]:
        offered: Sequence[str] = self.websocket.scope.get("subprotocols", [])
        return offered

    async def accept(self, subprotocol: str | None) -> None:
        await self.websocket.accept(subprotocol=subprotocol)

    async def receive(self) -> Frame | None:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        frame = Frame(text=message.get("text"), data=message.get("bytes"))
        if self._too_large(frame):
            limit = self.max_message_bytes
            raise InvalidRequestError(f"A message may be {limit} bytes at most.", code="message_too_large")
        return frame

    def _too_large(self, frame: Frame) -> bool:
        limit = self.max_message_bytes
        if frame.text is not None:
            # A character is 4 bytes at most: only a text that long needs encoding to be measured.
            return len(frame.text) > limit // 4 and len(frame.text.encode()) > limit
        return len(frame.data or b"") > limit

    async def send_text(self, text: str) -> None:
        with _gone_as_connection_error():
            await self.websocket.send_text(text)

    async def send_bytes(self, data: bytes) -> None:
        with _gone_as_connection_error():
            await self.websocket.send_bytes(data)

    async def send_json(self, body: Mapping[str, Any]) -> None:
        with _gone_as_connection_error():
            await self.websocket.send_json(body)

    async def close(self, code: int, reason: str) -> None:
        with _gone_as_connection_error():
            await self.websocket.close(code, reason)


@contextmanager
def _gone_as_connection_error() -> Iterator[None]:
    # Starlette raises RuntimeError for a socket it has closed, and the server OSError for a client gone.
    try:
        yield
    except (WebSocketDisconnect, RuntimeError, OSError) as exc:
        raise ConnectionError(f"the WebSocket is gone: {exc!r}") from exc
