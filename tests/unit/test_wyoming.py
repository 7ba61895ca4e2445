"""The Wyoming TTS service over the fake engine, driven by the `wyoming` package's own client (the one Home
Assistant's integration uses): describe, a synthesize, a streamed text, voices by name and by language,
the rate asked for, and what a bad client gets (an error event, and a closed connection where the stream
can no longer be read)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info, SelectProgram
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from api.live.wyoming import LOCALES, WyomingProtocol, voice_locale
from api.server.app import create_app
from scripts.harness import free_port
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import make_settings, wait_ready

TIMEOUT_S = 20


def serve(tmp_path: Path, **overrides: Any) -> Iterator[int]:
    port = free_port()
    settings = make_settings(tmp_path, wyoming=True, wyoming_port=port, **overrides)
    app = create_app(settings, engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        yield port


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    yield from serve(tmp_path)


async def read_until(client: AsyncTcpClient, last: str) -> list[Event]:
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), TIMEOUT_S)
        assert event is not None, events
        events.append(event)
        if event.type == last or Error.is_type(event.type):
            return events


def audio_of(events: list[Event]) -> bytes:
    return b"".join(AudioChunk.from_event(event).audio for event in events if AudioChunk.is_type(event.type))


def test_describe_lists_every_voice_with_its_locale(port: int) -> None:
    async def run() -> Info:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            (event,) = await read_until(client, "info")
            return Info.from_event(event)

    info = asyncio.run(run())
    (program,) = info.tts
    assert program.supports_synthesize_streaming
    voices = {voice.name: voice.languages for voice in program.voices}
    assert voices["af_heart"] == ["en-US"]  # American English, not Afrikaans
    assert voices["bf_emma"] == ["en-GB"]
    assert all(languages == [LOCALES[name[0]]] for name, languages in voices.items() if voice_locale(name))
    assert not info.asr


def test_a_synthesize_is_answered_with_audio_between_start_and_stop(port: int) -> None:
    async def run() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SelectProgram(name="kokoro").event())  # newer clients send it first
            await client.write_event(Synthesize(text="Hello there. How are you today?").event())
            return await read_until(client, "audio-stop")

    events = asyncio.run(run())
    kinds = [event.type for event in events]
    assert (kinds[0], kinds[-1]) == ("audio-start", "audio-stop"), kinds
    assert set(kinds[1:-1]) == {"audio-chunk"}
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    assert len(audio_of(events)) > 24000  # over half a second


def test_a_stream_is_spoken_phrase_by_phrase_before_it_stops(port: int) -> None:
    text = "The first sentence is here. Then a second one follows it, and then a third."

    async def run() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="bf_emma")).event())
            words = text.split(" ")
            for at in range(0, len(words), 3):
                await client.write_event(SynthesizeChunk(text=" ".join(words[at : at + 3]) + " ").event())
            # As Home Assistant does: the whole text for servers without streaming, to be ignored here.
            await client.write_event(Synthesize(text=text).event())
            early = await read_until(client, "audio-chunk")  # before synthesize-stop is sent
            await client.write_event(SynthesizeStop().event())
            return early, await read_until(client, "synthesize-stopped")

    early, rest = asyncio.run(run())
    assert [event.type for event in early] == ["audio-start", "audio-chunk"]
    kinds = [event.type for event in rest]
    assert kinds[-2:] == ["audio-stop", "synthesize-stopped"], kinds
    assert kinds.count("audio-start") == 0  # one utterance: one start
    assert len(audio_of(early + rest)) > 2 * 24000 * 2


def test_voices_by_language_and_unknown_ones(port: int) -> None:
    async def run(voice: SynthesizeVoice) -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text="Hello.", voice=voice).event())
            return await read_until(client, "audio-stop")

    assert asyncio.run(run(SynthesizeVoice(language="en_GB")))[-1].type == "audio-stop"
    assert asyncio.run(run(SynthesizeVoice(language="en")))[-1].type == "audio-stop"
    (refused,) = asyncio.run(run(SynthesizeVoice(name="zz_nobody")))
    assert Error.from_event(refused).code == "voice_not_found"
    (refused,) = asyncio.run(run(SynthesizeVoice(language="de-DE")))
    assert "de-DE" in Error.from_event(refused).text


def test_the_rate_asked_for_is_resampled(tmp_path: Path) -> None:
    for port in serve(tmp_path, wyoming_sample_rate=16000):

        async def run(port: int = port) -> list[Event]:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Synthesize(text="Hello there.").event())
                return await read_until(client, "audio-stop")

        events = asyncio.run(run())
        assert AudioStart.from_event(events[0]).rate == 16000
        assert {AudioChunk.from_event(event).rate for event in events[1:-1]} == {16000}


def raw_exchange(port: int, data: bytes, *, wait_close: bool) -> tuple[list[dict[str, Any]], bool]:
    """Send raw bytes; the events read back (headers with their data merged), and whether the server
    closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        if not wait_close:
            sock.sendall(b'{"type": "ping", "data": {"text": "still here"}}\n')
        received = b""
        closed = False
        while True:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                break
            if not part:
                closed = True
                break
            received += part
            if not wait_close and b'"pong"' in received:
                break
    events = []
    event, stream = wire_event(received)
    while event is not None:
        events.append(event)
        event, stream = wire_event(stream)
    assert not stream.strip(), stream[:200]  # no event cut short
    return events, closed


def wire_event(stream: bytes) -> tuple[dict[str, Any] | None, bytes]:
    """The first whole event on `stream` (its header with its data merged; its payload skipped) and the
    bytes after it, or None and `stream` as it is where no whole event is there yet."""
    line, newline, rest = stream.partition(b"\n")
    if not newline:
        return None, stream
    header = json.loads(line)
    length = header.get("data_length") or 0
    size = length + (header.get("payload_length") or 0)
    if len(rest) < size:
        return None, stream
    header.setdefault("data", {}).update(json.loads(rest[:length]) if length else {})
    return header, rest[size:]


@pytest.mark.parametrize(
    ("data", "code", "closes"),
    [
        (b"this is not json\n", "invalid_event", False),
        (b'{"type": "tell-a-joke"}\n', "invalid_event", False),
        (b'{"type": "synthesize", "data": {}}\n', "invalid_event", False),  # no text
        (b'{"type": "synthesize-chunk", "data": {"text": "hi"}}\n', "invalid_event", False),  # no start
        (b'{"type": "select-program", "data": {"name": "piper"}}\n', "program_not_found", False),
        (b'{"type": "describe", "payload_length": 99999999}\n', "invalid_event", True),  # a length that lies
        (b'{"type": "describe", "data_length": 5}\nnope!', "invalid_event", True),  # data that is no JSON
        (b'{"type": "' + b"x" * 70_000 + b'"}\n', "invalid_event", True),  # a huge header
    ],
)
def test_a_bad_client_gets_an_error_and_never_a_stuck_connection(
    port: int, data: bytes, code: str, closes: bool
) -> None:
    events, closed = raw_exchange(port, data, wait_close=closes)
    assert events[0]["type"] == "error", events
    assert events[0]["data"]["code"] == code
    assert closed == closes
    if not closes:  # the connection still works
        assert (events[-1]["type"], events[-1]["data"]) == ("pong", {"text": "still here"})


def test_text_over_the_input_limit_is_refused(tmp_path: Path) -> None:
    for port in serve(tmp_path, max_input_chars=50):

        async def run(port: int = port) -> list[Event]:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Synthesize(text="word " * 20).event())
                await client.write_event(Ping(text="after").event())
                return [*await read_until(client, "error"), *await read_until(client, "pong")]

        events = asyncio.run(run())
        assert [event.type for event in events] == ["error", "pong"]
        assert Error.from_event(events[0]).code == "input_too_long"
        assert Pong.from_event(events[1]).text == "after"


def test_off_by_default(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    assert app.state.wyoming is None


def test_a_language_picks_the_default_voice_where_it_speaks_it_else_the_first_that_does(
    tmp_path: Path,
) -> None:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    voices = app.state.voices.store.names
    protocol = WyomingProtocol(app.state.speech, app.state.settings, voices)
    british = next(name for name in voices() if name.startswith("b"))
    assert protocol._voice(SynthesizeVoice(language="en-US")) == "af_heart"  # the default's own
    assert protocol._voice(SynthesizeVoice(language="en_GB")) == british
    assert protocol._voice(SynthesizeVoice(language="EN")) == "af_heart"
    assert protocol._voice(SynthesizeVoice(name="bf_emma", language="ja")) == "bf_emma"  # a name wins
    assert protocol._voice(None) is None


def test_a_refused_client_reads_why_even_with_its_events_unread(tmp_path: Path) -> None:
    """The server closes a refused connection without reading what its client sent: closed with those
    bytes unread, the socket would be reset, and the reset reach the client before the refusal."""
    for port in serve(tmp_path, live_max_sessions=1):
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as holder:
            holder.sendall(b'{"type": "ping"}\n')
            assert b'"pong"' in holder.recv(65536)  # its session is open: the next one is refused
            with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as refused:
                refused.sendall(b'{"type": "describe"}\n' * 15_000)  # more than the server's reader buffers
                time.sleep(0.5)  # the server has answered and closed its side by now, the events unread
                received = b""
                while part := refused.recv(65536):  # a reset raises ConnectionResetError here
                    received += part
        header = json.loads(received.partition(b"\n")[0])
        assert header["type"] == "error", received
        assert b"live sessions are open" in received
