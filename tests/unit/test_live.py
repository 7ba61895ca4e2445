"""The live WebSocket over a fake engine and phonemizer: the protocol, phrase by phrase audio, barge-in,
errors, keys, admission and metrics."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from starlette.testclient import WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from api.live.transport import LIVE_SUBPROTOCOL
from api.protocol import LiveServerEvent
from api.server.app import create_app
from tests.fakes import SAMPLES_PER_TOKEN, FakeEngine, FakePhonemizer
from tests.unit.test_api import decoded_seconds, make_settings, wait_ready

PATH = "/v1/audio/speech/live"
SERVER_EVENTS: TypeAdapter[Any] = TypeAdapter(LiveServerEvent)
TEXT = "Hello there, my friend. How are you today? I hope the sun is out where you are."


def make_client(tmp_path: Path, engine: FakeEngine | None = None, **overrides: object) -> TestClient:
    settings = make_settings(tmp_path, **overrides)
    return TestClient(create_app(settings, engine=engine or FakeEngine(), phonemizer=FakePhonemizer()))  # type: ignore[arg-type]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(tmp_path: Path, engine: FakeEngine) -> Iterator[TestClient]:
    with make_client(tmp_path, engine) as client:
        wait_ready(client)
        yield client


def event(ws: WebSocketTestSession) -> dict[str, Any]:
    """The next event, checked against the server's event models."""
    body: dict[str, Any] = ws.receive_json()
    SERVER_EVENTS.validate_python(body)
    return body


def until_done(ws: WebSocketTestSession) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The deltas of one utterance and its done event; any other event fails."""
    deltas = []
    while (got := event(ws))["type"] == "speech.audio.delta":
        deltas.append(got)
    assert got["type"] == "speech.audio.done", got
    return deltas, got


def audio_of(deltas: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(delta["audio"]) for delta in deltas)


def spoken(client: TestClient, text: str) -> bytes:
    """What /v1/audio/speech says for `text`, as pcm."""
    response = client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return response.content


def type_words(ws: WebSocketTestSession, text: str) -> None:
    words = text.split(" ")
    for word in [words[0], *(" " + word for word in words[1:])]:
        ws.send_json({"type": "input_text.append", "text": word})


def update(ws: WebSocketTestSession, **session: object) -> dict[str, Any]:
    ws.send_json({"type": "session.update", "session": session})
    return event(ws)


def error_of(ws: WebSocketTestSession) -> dict[str, Any]:
    got = event(ws)
    assert got["type"] == "error", got
    assert set(got["error"]) == {"message", "type", "param", "code"}
    assert got["error"]["message"]
    return dict(got["error"])


def test_text_typed_word_by_word_comes_back_as_audio_and_timings_in_its_words(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        assert update(ws, voice="af_bella", return_timestamps=True)["session"]["voice"] == "af_bella"
        type_words(ws, TEXT)
        ws.send_json({"type": "input_text.done"})
        deltas, done = until_done(ws)
    words = [word for delta in deltas for word in delta["timestamps"]]
    assert [word["word"] for word in words] == TEXT.split()
    starts = [word["start_time"] for word in words]
    assert starts == sorted(starts)
    assert all(word["start_time"] <= word["end_time"] for word in words)
    samples = len(audio_of(deltas)) // 2
    assert words[-1]["end_time"] <= samples / 24000
    assert done["usage"]["input_tokens"] > 0
    assert done["usage"]["output_tokens"] == -(-samples // 600)  # 25 ms frames


def test_a_sentence_is_spoken_before_the_utterance_is_done(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        type_words(ws, "Good morning to you. And")
        first = event(ws)
        assert first["type"] == "speech.audio.delta"
        ws.send_json({"type": "input_text.done"})
        deltas, _ = until_done(ws)
    # 'Good morning to you.' alone, as /v1/audio/speech says it, then 'And'.
    assert base64.b64decode(first["audio"]) == spoken(client, "Good morning to you.")
    assert deltas


def test_flush_speaks_what_waits_and_idle_speaks_whole_words(tmp_path: Path) -> None:
    with make_client(tmp_path, live_idle_ms=50) as client:
        wait_ready(client)
        with client.websocket_connect(PATH) as ws:
            ws.send_json({"type": "input_text.append", "text": "no punctuation here"})
            ws.send_json({"type": "input_text.flush"})
            assert event(ws)["type"] == "speech.audio.delta"
            ws.send_json({"type": "input_text.append", "text": " and then a pause for thought"})
            idle = event(ws)  # 'and then a pause for', after 50 ms with nothing new
            assert len(base64.b64decode(idle["audio"])) // 2 < len("and then a pause for thought") * 1200
            ws.send_json({"type": "input_text.done"})
            until_done(ws)


def test_the_socket_takes_one_utterance_after_another(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        for voice in ("af_heart", "am_adam"):
            assert update(ws, voice=voice)["type"] == "session.updated"
            ws.send_json({"type": "input_text.append", "text": "One short line."})
            ws.send_json({"type": "input_text.done"})
            deltas, done = until_done(ws)
            assert audio_of(deltas)
            assert done["usage"]["total_tokens"] > 0
        ws.send_json({"type": "input_text.done"})  # an empty utterance is done at once
        assert until_done(ws) == ([], {"type": "speech.audio.done", "usage": _zero_usage()})


def _zero_usage() -> dict[str, int]:
    return {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


@pytest.mark.parametrize("response_format", ["wav", "mp3", "opus"])
def test_an_utterance_is_one_playable_file_in_each_format(client: TestClient, response_format: str) -> None:
    with client.websocket_connect(PATH) as ws:
        update(ws, response_format=response_format)
        type_words(ws, TEXT)
        ws.send_json({"type": "input_text.done"})
        deltas, _ = until_done(ws)
    seconds = decoded_seconds(audio_of(deltas))
    expected = sum(1 for char in TEXT.lower() if char.isalpha() or char in " ,.?") * SAMPLES_PER_TOKEN / 24000
    assert seconds == pytest.approx(expected, rel=0.3)


def test_clear_drops_what_is_not_sent_and_frees_the_engine_queue(tmp_path: Path) -> None:
    engine = FakeEngine(delay=0.2)
    with make_client(tmp_path, engine) as client:
        wait_ready(client)
        scheduler = client.app.state.speech.scheduler  # type: ignore[attr-defined]
        with client.websocket_connect(PATH) as ws:
            ws.send_json({"type": "input_text.append", "text": " ".join([TEXT] * 6) + " And"})
            assert event(ws)["type"] == "speech.audio.delta"
            ws.send_json({"type": "input_text.clear"})
            assert event(ws) == {"type": "input_text.cleared"}  # nothing of the cleared text after it
            assert scheduler.queued == 0
            made = len(engine.calls)
            ws.send_json({"type": "input_text.append", "text": "Something else."})
            ws.send_json({"type": "input_text.done"})
            deltas, _ = until_done(ws)
        assert audio_of(deltas) == spoken(client, "Something else.")
    assert len(engine.calls) <= made + 1 + 2  # the chunk in synthesis at the clear, then the new text's


def test_closing_the_socket_cancels_its_chunks(tmp_path: Path) -> None:
    engine = FakeEngine(delay=0.2)
    with make_client(tmp_path, engine) as client:
        wait_ready(client)
        scheduler = client.app.state.speech.scheduler  # type: ignore[attr-defined]
        with client.websocket_connect(PATH) as ws:
            ws.send_json({"type": "input_text.append", "text": " ".join([TEXT] * 6) + " And"})
            assert event(ws)["type"] == "speech.audio.delta"
        deadline = time.monotonic() + 5
        while scheduler.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler.queued == 0
        made = len(engine.calls)
        time.sleep(0.5)
        assert len(engine.calls) <= made + 1


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("not json", "invalid_event", None),
        ({"type": "input_text.shout", "text": "hi"}, "invalid_event", None),
        ({"type": "input_text.append"}, "invalid_event", "text"),
        ({"type": "input_text.append", "text": "hi", "extra": 1}, "invalid_event", "extra"),
        ({"type": "input_text.append", "text": 5}, "invalid_event", "text"),
        ({"type": "session.update", "session": {"speed": 9}}, "invalid_event", "session.speed"),
        (
            {"type": "session.update", "session": {"response_format": "aac"}},
            "invalid_event",
            "session.response_format",
        ),
        ({"type": "session.update", "session": {"voice": "xx_nobody"}}, "voice_not_found", "voice"),
        ({"type": "session.update", "session": {"lang_code": "q"}}, "unsupported_language", "lang_code"),
    ],
)
def test_a_bad_event_gets_an_error_event_and_the_session_goes_on(
    client: TestClient, message: object, code: str | None, param: str | None
) -> None:
    with client.websocket_connect(PATH) as ws:
        if isinstance(message, str):
            ws.send_text(message)
        else:
            ws.send_json(message)
        error = error_of(ws)
        assert (error["code"], error["param"]) == (code, param)
        ws.send_json({"type": "input_text.append", "text": "Still here."})
        ws.send_json({"type": "input_text.done"})
        assert audio_of(until_done(ws)[0])


def test_binary_frames_and_large_messages_are_refused(tmp_path: Path) -> None:
    with make_client(tmp_path, live_max_message_bytes=1024, live_max_pending_chars=1500) as client:
        wait_ready(client)
        with client.websocket_connect(PATH) as ws:
            ws.send_bytes(b"\x00\x01")
            assert error_of(ws)["code"] == "invalid_event"
            ws.send_json({"type": "input_text.append", "text": "x" * 2000})
            assert error_of(ws)["code"] == "message_too_large"
            for _ in range(2):  # one word still being written, so all of it waits
                ws.send_json({"type": "input_text.append", "text": "y" * 900})
            too_long = error_of(ws)
            assert (too_long["code"], too_long["param"]) == ("input_too_long", "text")
            ws.send_json({"type": "input_text.clear"})
            assert event(ws)["type"] == "input_text.cleared"


def test_session_update_waits_for_the_utterance_to_end(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_json({"type": "input_text.append", "text": "Half a"})
        ws.send_json({"type": "session.update", "session": {"voice": "am_adam"}})
        assert error_of(ws)["code"] == "utterance_in_progress"
        ws.send_json({"type": "input_text.clear"})
        assert event(ws)["type"] == "input_text.cleared"
        assert update(ws, voice="am_adam")["session"]["voice"] == "am_adam"


def test_a_voice_changes_the_audio_and_a_mix_is_taken(client: TestClient, engine: FakeEngine) -> None:
    with client.websocket_connect(PATH) as ws:
        assert update(ws, voice="af_bella(1)+am_adam(1)", speed=2)["session"]["speed"] == 2.0
        ws.send_json({"type": "input_text.append", "text": "Fast."})
        ws.send_json({"type": "input_text.done"})
        until_done(ws)
    assert engine.calls[-1].speed == 2.0
    assert float(engine.calls[-1].style[0]) == pytest.approx(np.mean([0.2, 0.4]), rel=1e-3)


def test_keys_are_needed_by_header_or_subprotocol(tmp_path: Path) -> None:
    with make_client(tmp_path, api_keys="secret-key") as client:
        wait_ready(client)
        with client.websocket_connect(PATH) as ws:
            error = error_of(ws)
            assert error["code"] == "invalid_api_key"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1008
        with client.websocket_connect(PATH, headers={"Authorization": "Bearer secret-key"}) as ws:
            assert update(ws)["type"] == "session.updated"
        protocols = [LIVE_SUBPROTOCOL, "openai-insecure-api-key.secret-key"]
        with client.websocket_connect(PATH, subprotocols=protocols) as ws:
            assert ws.accepted_subprotocol == LIVE_SUBPROTOCOL
            assert update(ws)["type"] == "session.updated"


def test_a_full_server_refuses_the_socket_with_1013_and_a_retry_hint(tmp_path: Path) -> None:
    with make_client(tmp_path, live_max_sessions=1) as client:
        wait_ready(client)
        with client.websocket_connect(PATH) as first:
            assert update(first)["type"] == "session.updated"
            with client.websocket_connect(PATH) as second:
                error = error_of(second)
                assert (error["code"], error["type"]) == ("overloaded", "server_error")
                assert "Retry after" in error["message"]
                with pytest.raises(WebSocketDisconnect) as closed:
                    second.receive_json()
                assert closed.value.code == 1013
                assert closed.value.reason.startswith("retry after")


def test_a_loading_model_refuses_the_socket(tmp_path: Path) -> None:
    with make_client(tmp_path, FakeEngine(load_delay=2)) as client, client.websocket_connect(PATH) as ws:
        assert error_of(ws)["code"] == "model_loading"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1013


def test_an_utterance_without_a_slot_is_refused_and_the_next_one_is_spoken(tmp_path: Path) -> None:
    with make_client(tmp_path, max_inflight=1, max_waiting=0) as client:
        wait_ready(client)
        admission = client.app.state.admission  # type: ignore[attr-defined]
        with client.websocket_connect(PATH) as ws:
            admission.inflight = 1  # another request holds the only slot
            ws.send_json({"type": "input_text.append", "text": "Not now."})
            ws.send_json({"type": "input_text.done"})
            assert error_of(ws)["code"] == "overloaded"
            assert until_done(ws) == ([], {"type": "speech.audio.done", "usage": _zero_usage()})
            admission.inflight = 0
            ws.send_json({"type": "input_text.append", "text": "Now."})
            ws.send_json({"type": "input_text.done"})
            assert audio_of(until_done(ws)[0])
            assert admission.inflight == 0  # the utterance gave its slot back


def test_an_idle_session_is_closed(tmp_path: Path) -> None:
    with make_client(tmp_path, live_session_idle_s=0.2) as client:
        wait_ready(client)
        with client.websocket_connect(PATH) as ws:
            assert error_of(ws)["code"] == "session_idle"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1000


def test_metrics_count_sessions_utterances_and_first_audio(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        assert "kokoro_live_sessions_open 1.0" in client.get("/metrics").text
        ws.send_json({"type": "input_text.append", "text": "Count me."})
        ws.send_json({"type": "input_text.done"})
        until_done(ws)
        ws.send_json({"type": "input_text.append", "text": "Drop me"})
        ws.send_json({"type": "input_text.clear"})
        event(ws)
    metrics = client.get("/metrics").text
    assert "kokoro_live_sessions_open 0.0" in metrics
    assert 'kokoro_live_sessions_total{outcome="accepted"} 1.0' in metrics
    assert 'kokoro_live_utterances_total{end="done"} 1.0' in metrics
    assert 'kokoro_live_utterances_total{end="cleared"} 1.0' in metrics
    assert "kokoro_live_first_audio_seconds_count 1.0" in metrics
