"""ElevenLabs' text-to-speech (api/live/elevenlabs.py) over a fake engine: contexts on one socket and their
isFinal, the alignment, keep-alives, a closed context abandoned for a new one (barge-in), the one-stream
socket, the POSTs and their output formats, and keys in ElevenLabs' header. The frameworks' real plugins
run against the real model in tests/integration/test_voice_agents.py."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketTestSession

from api.errors import InvalidRequestError
from api.live.elevenlabs import output_format
from tests.unit.test_api import wait_ready
from tests.unit.test_live import TEXT, make_client

VOICE_ID = "21m00Tcm4TlvDq8ikWAM"  # an ElevenLabs voice id: the server's default voice
MULTI = f"/v1/text-to-speech/{VOICE_ID}/multi-stream-input?model_id=eleven_flash_v2_5&output_format=pcm_24000"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as client:
        wait_ready(client)
        yield client


def until_final(ws: WebSocketTestSession, context: str | None) -> tuple[bytes, list[dict[str, Any]]]:
    audio = bytearray()
    messages = []
    while True:
        message = ws.receive_json()
        assert "error" not in message, message
        messages.append(message)
        if message.get("audio"):
            audio += base64.b64decode(message["audio"])
        if message.get("isFinal"):
            assert message.get("contextId") == context
            return bytes(audio), messages


def speak(ws: WebSocketTestSession, context: str, text: str) -> None:
    ws.send_json({"text": " ", "context_id": context, "voice_settings": {"stability": 0.5}})
    for word in text.split(" "):
        ws.send_json({"text": word + " ", "context_id": context})
    ws.send_json({"text": "", "context_id": context, "flush": True})
    ws.send_json({"context_id": context, "close_context": True})


def test_a_context_speaks_its_text_with_alignment_then_is_final(client: TestClient) -> None:
    with client.websocket_connect(MULTI) as ws:
        speak(ws, "a", TEXT)
        audio, messages = until_final(ws, "a")
        speak(ws, "b", "And a second answer.")
        second, _ = until_final(ws, "b")
    assert audio
    assert second
    assert all(message["contextId"] == "a" for message in messages)
    alignments = [message["alignment"] for message in messages if message.get("alignment")]
    chars = "".join("".join(alignment["chars"]) for alignment in alignments)
    assert chars.split() == TEXT.split()
    for alignment in alignments:
        assert (
            len(alignment["chars"]) == len(alignment["charStartTimesMs"]) == len(alignment["charDurationsMs"])
        )
        assert alignment["charStartTimesMs"] == sorted(alignment["charStartTimesMs"])
        assert min(alignment["charStartTimesMs"]) >= 0
    # Each message's times count from its own start: together they span no more than the audio.
    span_ms = sum(a["charStartTimesMs"][-1] + a["charDurationsMs"][-1] for a in alignments)
    assert span_ms <= len(audio) / 2 / 24000 * 1000


def test_keep_alives_and_an_empty_flush_change_nothing(client: TestClient) -> None:
    with client.websocket_connect(MULTI) as ws:
        ws.send_json({"text": ""})
        ws.send_json({"text": " ", "context_id": "a"})
        ws.send_json({"text": "", "context_id": "a"})
        ws.send_json({"text": "Hello there.", "context_id": "a"})
        ws.send_json({"text": "", "context_id": "a"})
        ws.send_json({"context_id": "a", "close_context": True})
        audio, _ = until_final(ws, "a")
    assert audio


def test_a_new_context_abandons_a_closed_one_still_speaking(client: TestClient) -> None:
    """Barge-in as the frameworks do it: close the interrupted context, open the next one."""
    with client.websocket_connect(MULTI) as ws:
        ws.send_json({"text": TEXT * 6, "context_id": "long", "flush": True})
        ws.send_json({"context_id": "long", "close_context": True})
        first = ws.receive_json()
        assert first["contextId"] == "long"
        ws.send_json({"text": "Yes?", "context_id": "next"})
        ws.send_json({"context_id": "next", "close_context": True})
        seen = []
        while not ((message := ws.receive_json()).get("isFinal") and message.get("contextId") == "next"):
            seen.append((message.get("contextId"), bool(message.get("audio")), message.get("isFinal")))
    long_after_final = seen[seen.index(("long", False, True)) + 1 :]
    assert all(context == "next" for context, _, _ in long_after_final)
    assert sum(context == "long" and audio for context, audio, _ in seen) < 3


def test_stream_input_ends_with_an_empty_text_and_closes(client: TestClient) -> None:
    with client.websocket_connect("/v1/text-to-speech/af_bella/stream-input?output_format=ulaw_8000") as ws:
        ws.send_json({"text": " ", "voice_settings": {"stability": 0.5}, "xi_api_key": "ignored"})
        ws.send_json({"text": TEXT})
        ws.send_json({"text": ""})
        audio, messages = until_final(ws, None)
        closed = ws.receive()
    assert closed["code"] == 1000
    assert all("contextId" not in message for message in messages)
    assert len(audio) > 8000  # one byte a sample at 8 kHz: over a second


def test_close_socket_closes(client: TestClient) -> None:
    with client.websocket_connect(MULTI) as ws:
        ws.send_json({"text": TEXT * 4, "context_id": "a", "flush": True})
        ws.send_json({"close_socket": True})
        while (message := ws.receive())["type"] != "websocket.close":
            pass
    assert message["code"] == 1000


def test_a_bad_message_is_an_error_and_the_socket_goes_on(client: TestClient) -> None:
    with client.websocket_connect(MULTI) as ws:
        ws.send_json({"context_id": "a"})
        assert ws.receive_json()["code"] == "invalid_event"
        ws.send_json({"text": "Still here.", "context_id": "a"})
        ws.send_json({"context_id": "a", "close_context": True})
        assert until_final(ws, "a")[0]


@pytest.mark.parametrize(
    ("name", "offered"),
    [
        ("pcm_16000", True),
        ("pcm_44100", True),
        ("ulaw_8000", True),
        ("alaw_8000", True),
        ("mp3_44100_128", True),
        ("mp3_22050_32", True),
        ("pcm_11025", False),
        ("ulaw_16000", False),
        ("opus_48000_64", False),
        ("mp3_44100", False),
        ("wav", False),
    ],
)
def test_output_formats(name: str, offered: bool) -> None:
    if offered:
        assert output_format(name).rate == int(name.split("_")[1])
    else:
        with pytest.raises(InvalidRequestError):
            output_format(name)


def test_the_posts_answer_in_the_output_format(client: TestClient) -> None:
    body = {"text": TEXT, "model_id": "eleven_multilingual_v2", "voice_settings": {"stability": 0.4}}
    mp3 = client.post("/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM", json=body)
    assert mp3.status_code == 200, mp3.text
    assert mp3.headers["content-type"] == "audio/mpeg"
    with av.open(io.BytesIO(mp3.content)) as container:
        stream = container.streams.audio[0]
        assert stream.rate == 44100
        seconds = sum(frame.samples for frame in container.decode(audio=0)) / 44100
    pcm = client.post("/v1/text-to-speech/af_heart/stream?output_format=pcm_16000", json=body)
    assert pcm.headers["content-type"] == "audio/pcm"
    assert len(pcm.content) / 2 / 16000 == pytest.approx(seconds, abs=0.1)
    faster = client.post(
        "/v1/text-to-speech/af_heart/stream?output_format=pcm_16000",
        json={**body, "voice_settings": {"speed": 2.0}},
    )
    assert len(faster.content) < 0.7 * len(pcm.content)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/v1/text-to-speech/nobody", "voice_not_found"),
        ("/v1/text-to-speech/af_heart?output_format=opus_48000_64", "invalid_output_format"),
    ],
)
def test_bad_requests_are_refused_with_their_reason(client: TestClient, path: str, code: str) -> None:
    response = client.post(path, json={"text": "Hello."})
    assert response.status_code in (400, 404)
    assert response.json()["error"]["code"] == code
    socket_path = path.replace("?", "/multi-stream-input?") if "?" in path else path + "/multi-stream-input"
    with client.websocket_connect(socket_path) as ws:
        error = ws.receive_json()
        closed = ws.receive()
    assert error["code"] == code
    assert closed["code"] == 1008


def test_keys_come_in_elevenlabs_header(tmp_path: Path) -> None:
    with make_client(tmp_path, api_keys="el:secret-key") as client:
        wait_ready(client)
        key = {"xi-api-key": "secret-key"}
        assert (
            client.post("/v1/text-to-speech/af_heart", json={"text": "Hi."}, headers=key).status_code == 200
        )
        refused = client.post(
            "/v1/text-to-speech/af_heart", json={"text": "Hi."}, headers={"xi-api-key": "no"}
        )
        assert refused.status_code == 401
        with client.websocket_connect(MULTI, headers=key) as ws:
            ws.send_json({"text": "Hi.", "context_id": "a"})
            ws.send_json({"context_id": "a", "close_context": True})
            assert until_final(ws, "a")[0]
        assert json.loads(json.dumps(refused.json()))["error"]["code"] == "invalid_api_key"
