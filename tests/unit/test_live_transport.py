"""The live session's Transport: a session driven over an in-memory transport (it needs nothing else of its
connection), and Wyoming's TCP stream read as frames."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wyoming.event import Event
from wyoming.tts import Synthesize

from api.errors import InvalidRequestError
from api.live.session import LiveService
from api.live.transport import LIVE_SUBPROTOCOL, Frame, Transport
from api.live.wyoming import MAX_HEADER_BYTES, WyomingTransport, encoded
from tests.unit.test_api import wait_ready
from tests.unit.test_live import make_client


class MemoryTransport:
    """A client in memory: its frames given up front (an exception is raised where it stands), then the
    end of the connection once the server has sent the event that ends the talk."""

    def __init__(self, frames: list[Frame | Exception], until: str) -> None:
        self.frames = frames
        self.until = until
        self.sent: list[dict[str, Any]] = []
        self.accepted: list[str | None] = []
        self.closed: list[tuple[int, str]] = []
        self._ended = asyncio.Event()

    @property
    def subprotocols(self) -> Sequence[str]:
        return ("something-else", LIVE_SUBPROTOCOL)

    async def accept(self, subprotocol: str | None) -> None:
        self.accepted.append(subprotocol)

    async def receive(self) -> Frame | None:
        if self.frames:
            frame = self.frames.pop(0)
            if isinstance(frame, Exception):
                raise frame
            return frame
        await self._ended.wait()
        return None

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))
        if self.sent[-1]["type"] == self.until:
            self._ended.set()

    async def send_bytes(self, data: bytes) -> None:
        raise AssertionError("the live protocol sends text only")

    async def send_json(self, body: Mapping[str, Any]) -> None:
        await self.send_text(json.dumps(body))

    async def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))


def served(tmp_path: Path, transport: Transport) -> None:
    with make_client(tmp_path) as client:
        wait_ready(client)
        live: LiveService = client.app.state.live

        async def serve() -> None:
            await asyncio.wait_for(live.serve(transport), 30)

        client.portal.call(serve)


def text_frame(event: dict[str, Any]) -> Frame:
    return Frame(text=json.dumps(event))


def test_a_session_speaks_over_any_transport(tmp_path: Path) -> None:
    frames: list[Frame | Exception] = [
        text_frame({"type": "input_text.append", "text": "Hello there, my friend."}),
        InvalidRequestError("That was no frame.", code="invalid_event"),  # the session tells, and reads on
        Frame(data=b"\x00\x01"),  # the live protocol takes text frames only
        text_frame({"type": "input_text.done"}),
    ]
    transport = MemoryTransport(frames, until="speech.audio.done")
    served(tmp_path, transport)
    assert transport.accepted == [LIVE_SUBPROTOCOL]
    kinds = [event["type"] for event in transport.sent]
    assert kinds[:2] == ["error", "error"], kinds
    assert [event["error"]["message"] for event in transport.sent[:2]] == [
        "That was no frame.",
        "Send events as JSON text frames.",
    ]
    assert kinds[-1] == "speech.audio.done"
    assert set(kinds[2:-1]) == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(event["audio"]) for event in transport.sent[2:-1])
    assert len(audio) > 24000  # pcm16 at 24 kHz: over half a second of the fake engine's tone
    assert transport.closed == []  # the client ended the connection, not the server


async def wyoming_transport(sent: bytes) -> tuple[WyomingTransport, socket.socket]:
    """A transport over one end of a socket pair whose other end has sent `sent` and shut its writing."""
    ours, theirs = socket.socketpair()
    theirs.sendall(sent)
    theirs.shutdown(socket.SHUT_WR)
    reader, writer = await asyncio.open_connection(sock=ours, limit=MAX_HEADER_BYTES)
    return WyomingTransport(reader, writer, max_data_bytes=1024), theirs


def test_wyoming_events_arrive_as_frames_and_a_bad_line_is_skipped() -> None:
    event = Event("synthesize", {"text": "Hi."}, payload=b"\x01\x02")

    async def run() -> list[Frame | str | None]:
        transport, theirs = await wyoming_transport(b"not json\n" + encoded(event))
        got: list[Frame | str | None] = []
        try:
            await transport.receive()
        except InvalidRequestError as exc:
            got.append(exc.code)
        got += [await transport.receive(), await transport.receive()]
        await transport.send_bytes(encoded(Synthesize(text="back").event()))
        await transport.close(1000, "done")
        got.append(theirs.recv(1024).decode())
        theirs.close()
        return got

    invalid, frame, end, echoed = asyncio.run(run())
    assert invalid == "invalid_event"
    assert isinstance(frame, Frame)
    assert json.loads(frame.text or "") == {"type": "synthesize", "data": {"text": "Hi."}}
    assert frame.data == b"\x01\x02"
    assert end is None  # the client shut its side: the connection is over
    assert isinstance(echoed, str)
    assert json.loads(echoed.split("\n")[0])["type"] == "synthesize"


def test_a_broken_wyoming_stream_is_told_once_then_ends() -> None:
    async def run() -> list[str | Frame | None]:
        # A data length over the limit: what follows can no longer be framed.
        transport, theirs = await wyoming_transport(
            b'{"type": "describe", "data_length": 5000}\n' + b"x" * 5000
        )
        got: list[str | Frame | None] = []
        try:
            await transport.receive()
        except InvalidRequestError as exc:
            got.append(exc.message)
        got.append(await transport.receive())
        await transport.close(1000, "")
        theirs.close()
        return got

    message, after = asyncio.run(run())
    assert message == "`data_length` is 5000 bytes; at most 1024 are taken."
    assert after is None
