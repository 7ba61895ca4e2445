"""What the live session needs of its connection to the client (the `Transport` protocol, which the
WebSocket and Wyoming's TCP stream implement), the WebSocket close codes it uses, and the live subprotocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# WebSocket close codes (RFC 6455, section 7.4.1) that the live socket uses.
NORMAL_CLOSURE = 1000
GOING_AWAY = 1001
POLICY_VIOLATION = 1008
INTERNAL_ERROR = 1011
TRY_AGAIN_LATER = 1013
# A browser's WebSocket sends no headers: it offers `kokoro-live` and `openai-insecure-api-key.KEY` as
# subprotocols (OpenAI's Realtime API takes its key the same way), and the server answers `kokoro-live`.
LIVE_SUBPROTOCOL = "kokoro-live"
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def live_subprotocol(offered: Sequence[str]) -> str | None:
    """The subprotocol to answer a WebSocket with: ours if offered (a browser fails the socket when it
    offered some and none is answered)."""
    return LIVE_SUBPROTOCOL if LIVE_SUBPROTOCOL in offered else None


def chosen_subprotocol(scope: Mapping[str, Any]) -> str | None:
    """`live_subprotocol` of what an ASGI WebSocket scope offers."""
    return live_subprotocol(scope.get("subprotocols", []))


@dataclass(frozen=True)
class Frame:
    """One message from the client: its text (JSON, in every protocol here) or its binary data, or both
    where the connection frames them together (a Wyoming event's header and payload)."""

    text: str | None = None
    data: bytes | None = None


class Transport(Protocol):
    """A live session's connection to its client, whatever carries it: the session accepts it, reads the
    client's frames, sends text, bytes or JSON, and closes it with a code and a reason.

    `receive` gives None once the client has gone, and raises InvalidRequestError for what it read that is
    no frame it takes (too large, or not framed as the connection's protocol says), after which it can be
    read again. Sending to a client that has gone raises OSError (ConnectionError as a rule)."""

    @property
    def subprotocols(self) -> Sequence[str]:
        """The subprotocols the client offered (none, where the connection has no such thing)."""
        ...

    async def accept(self, subprotocol: str | None) -> None: ...

    async def receive(self) -> Frame | None: ...

    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_json(self, body: Mapping[str, Any]) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...
