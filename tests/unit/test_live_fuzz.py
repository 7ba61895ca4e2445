"""The live WebSocket protocols under malformed frames and bad sequences, driven by hypothesis over a fake
engine: the server's own (/v1/audio/speech/live), Deepgram's (/v1/speak), ElevenLabs' multi-stream-input
and Cartesia's (/tts/websocket). Whatever a client sends (text
that is not JSON, JSON of the wrong shape, events of unknown or known types with wrong fields, binary
frames, in any order), the session never ends with an internal error, every answer is one of the
protocol's own messages, and a frame the protocol cannot read is answered with its error; after each run
a new session on the same server still speaks."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import WebSocketTestSession

from api.live.transport import INTERNAL_ERROR
from tests.unit.test_api import wait_ready
from tests.unit.test_live import PATH, SERVER_EVENTS, make_client

DEEPGRAM = "/v1/speak?model=aura-2-thalia-en&encoding=linear16&sample_rate=24000"
DEEPGRAM_TYPES = ("Speak", "Flush", "Clear", "Close", "KeepAlive")
OWN_TYPES = ("session.update", "input_text.append", "input_text.flush", "input_text.clear", "input_text.done")
# The first answer a Deepgram socket gets, and those it may get after.
DEEPGRAM_ANSWERS = ("Metadata", "Flushed", "Cleared", "Warning", "Error")
ELEVENLABS = "/v1/text-to-speech/af_heart/multi-stream-input?output_format=pcm_24000"
ELEVENLABS_FIELDS = ("text", "context_id", "flush", "close_context", "voice_settings", "generation_config")
# Every message ElevenLabs' socket sends: audio (with its alignment), a context's isFinal, or an error.
ELEVENLABS_KEYS = {
    "audio",
    "alignment",
    "normalizedAlignment",
    "isFinal",
    "contextId",
    "error",
    "message",
    "code",
}
CARTESIA = "/tts/websocket?cartesia_version=2025-04-16"
CARTESIA_FIELDS = ("context_id", "transcript", "continue", "cancel", "flush", "voice", "output_format")
CARTESIA_ANSWERS = ("chunk", "timestamps", "done", "flush_done", "error")
CARTESIA_CONTEXT = {
    "model_id": "sonic-2",
    "voice": {"mode": "id", "id": "af_heart"},
    "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
}

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


@dataclass(frozen=True)
class Frame:
    text: str | None = None
    data: bytes | None = None
    unreadable: bool = False  # not JSON, or not an object: the protocol cannot read it at all


def frames(types: tuple[str, ...]) -> st.SearchStrategy[Frame]:
    """Frames of every kind a broken or hostile client sends."""
    fields = st.dictionaries(
        st.sampled_from(["text", "session", "voice", "speed", "response_format", "lang_code", "flush"])
        | st.text(max_size=8),
        JSON_VALUES,
        max_size=4,
    )
    events = st.builds(
        lambda kind, extra: Frame(text=json.dumps({**extra, "type": kind})),
        st.sampled_from(types) | st.text(max_size=12),
        fields,
    )
    not_json = (
        st.text(max_size=60)
        .filter(lambda text: not _is_json(text))
        .map(lambda text: Frame(text=text, unreadable=True))
    )
    not_objects = (st.lists(JSON_VALUES, max_size=3) | st.integers() | st.text(max_size=10)).map(
        lambda value: Frame(text=json.dumps(value), unreadable=True)
    )
    binary = st.binary(max_size=64).map(lambda data: Frame(data=data, unreadable=True))
    return st.one_of(events, not_json, not_objects, binary)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def send(ws: WebSocketTestSession, frame: Frame) -> None:
    if frame.data is not None:
        ws.send_bytes(frame.data)
    else:
        assert frame.text is not None
        ws.send_text(frame.text)


def answers_until(
    ws: WebSocketTestSession, done: Callable[[dict[str, Any]], bool]
) -> tuple[list[dict[str, Any]], int | None]:
    """The JSON answers up to the one `done` accepts (audio frames skipped), and the close code if the
    server closed first."""
    answers = []
    while True:
        message = ws.receive()
        if message["type"] == "websocket.close":
            return answers, int(message.get("code", 1000))
        if message.get("text") is None:
            continue
        answers.append(json.loads(message["text"]))
        if done(answers[-1]):
            return answers, None


def send_all(
    ws: WebSocketTestSession,
    sent: Iterable[Frame],
    is_error: Callable[[dict[str, Any]], bool],
    answered: Callable[[list[dict[str, Any]]], bool],
) -> int | None:
    """Each frame sent in turn; after each one the protocol cannot read, its answers up to its error
    (`is_error`) must satisfy `answered`, and the session must not end with an internal error. The close
    code if the server closed the socket, else None."""
    for frame in sent:
        send(ws, frame)
        if frame.unreadable:
            answers, closed = answers_until(ws, is_error)
            assert closed != INTERNAL_ERROR, (frame, closed)
            if closed is not None:
                return closed
            assert answered(answers), answers
    return None


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp_path: Path = tmp_path_factory.mktemp("live-fuzz")
    with make_client(tmp_path, live_max_message_bytes=4096) as client:
        wait_ready(client)
        yield client


FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(sent=st.lists(frames(OWN_TYPES), min_size=1, max_size=6))
def test_the_live_protocol_answers_every_frame_and_never_fails(client: TestClient, sent: list[Frame]) -> None:
    with client.websocket_connect(PATH) as ws:
        # An unreadable frame is answered with an error event, before anything it sends later.
        closed = send_all(
            ws,
            sent,
            lambda body: body["type"] == "error",
            lambda answers: answers[-1]["error"]["code"] == "invalid_event",
        )
        if closed is None:
            # A clear is always answered, after whatever the frames above made the session send.
            ws.send_json({"type": "input_text.clear"})
            answers, closed = answers_until(ws, lambda body: body["type"] == "input_text.cleared")
            for body in answers:
                SERVER_EVENTS.validate_python(body)
        assert closed != INTERNAL_ERROR, (sent, closed)
    assert_still_speaks(client)


@FUZZ
@given(sent=st.lists(frames(DEEPGRAM_TYPES), min_size=1, max_size=6))
def test_deepgrams_protocol_answers_every_frame_and_never_fails(
    client: TestClient, sent: list[Frame]
) -> None:
    with client.websocket_connect(DEEPGRAM) as ws:
        assert ws.receive_json()["type"] == "Metadata"
        # Deepgram's session errors are Warnings, and the session goes on.
        closed = send_all(
            ws,
            sent,
            lambda body: body.get("type") == "Warning",
            lambda answers: answers[-1]["code"] == "invalid_event",
        )
        if closed is None:
            ws.send_json({"type": "Clear"})
            answers, closed = answers_until(ws, lambda body: body.get("type") == "Cleared")
            assert all(body.get("type") in DEEPGRAM_ANSWERS for body in answers), answers
        assert closed != INTERNAL_ERROR, (sent, closed)
    assert_still_speaks(client)


def vendor_frames(names: tuple[str, ...]) -> st.SearchStrategy[Frame]:
    """A vendor's messages (no `type`: fields only, some of them its own, of any value) and the frames no
    protocol reads."""
    fields = st.dictionaries(
        st.sampled_from(names) | st.text(max_size=8),
        JSON_VALUES | st.sampled_from(["ctx-a", "ctx-b", " ", "", "Hello there."]),
        max_size=4,
    )
    ours = fields.map(lambda body: Frame(text=json.dumps(body)))
    unreadable = frames(("none",)).filter(lambda frame: frame.unreadable)
    return st.one_of(ours, unreadable)


@FUZZ
@given(sent=st.lists(vendor_frames(ELEVENLABS_FIELDS), min_size=1, max_size=6))
def test_elevenlabs_protocol_answers_every_frame_and_never_fails(
    client: TestClient, sent: list[Frame]
) -> None:
    with client.websocket_connect(ELEVENLABS) as ws:
        closed = send_all(
            ws,
            sent,
            lambda body: body.get("code") == "invalid_event",
            lambda answers: set(answers[-1]) == {"error", "message", "code"},
        )
        if closed is None:
            # close_socket always ends the socket, after whatever the frames above made it send.
            ws.send_json({"close_socket": True})
            answers, closed = answers_until(ws, lambda body: False)
            assert all(set(body) <= ELEVENLABS_KEYS for body in answers), answers
        assert closed != INTERNAL_ERROR, (sent, closed)
    assert_still_speaks(client)


@FUZZ
@given(sent=st.lists(vendor_frames(CARTESIA_FIELDS), min_size=1, max_size=6))
def test_cartesias_protocol_answers_every_frame_and_never_fails(
    client: TestClient, sent: list[Frame]
) -> None:
    with client.websocket_connect(CARTESIA) as ws:
        closed = send_all(
            ws,
            (*sent, Frame(text="not json", unreadable=True)),
            lambda body: body.get("code") == "invalid_event",
            lambda answers: (
                answers[-1]["type"] == "error"
                and all(body.get("type") in CARTESIA_ANSWERS for body in answers)
            ),
        )
        if closed is None:  # the socket still speaks a new context, after the frames above
            for context_id in opened_contexts(sent):  # one left open would speak first, and wait for text
                ws.send_json({"context_id": context_id, "cancel": True})
            ws.send_json(
                {**CARTESIA_CONTEXT, "context_id": "probe", "transcript": "Still here.", "continue": False}
            )
            answers, closed = answers_until(
                ws, lambda body: body.get("context_id") == "probe" and body.get("type") in ("done", "error")
            )
            assert closed != INTERNAL_ERROR, (sent, closed)
            assert all(body.get("type") in CARTESIA_ANSWERS for body in answers), answers
    assert_still_speaks(client)


def opened_contexts(sent: list[Frame]) -> set[str]:
    found = set()
    for frame in sent:
        body = json.loads(frame.text) if frame.text is not None and not frame.unreadable else {}
        if isinstance(body.get("context_id"), str) and body["context_id"]:
            found.add(body["context_id"])
    return found


def assert_still_speaks(client: TestClient) -> None:
    """A new session on the same server: the words in, audio out."""
    with client.websocket_connect(PATH) as ws:
        ws.send_json({"type": "input_text.append", "text": "Still here."})
        ws.send_json({"type": "input_text.done"})
        answers, closed = answers_until(ws, lambda body: body["type"] in ("speech.audio.done", "error"))
        assert closed is None, answers
        assert answers[-1]["type"] == "speech.audio.done", answers
        assert any(body["type"] == "speech.audio.delta" for body in answers)
