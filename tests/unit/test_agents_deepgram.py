"""Deepgram's `/v1/speak` (api/live/deepgram.py) over a fake engine: the socket's messages and their
answers, the POST, the query's checks, keys in Deepgram's header, and the same admission as the speech
endpoint. The frameworks' real plugins run against the real model in
tests/integration/test_voice_agents.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from tests.fakes import FakeEngine
from tests.unit.test_api import wait_ready
from tests.unit.test_live import TEXT, make_client, spoken

URL = "/v1/speak?model=aura-2-thalia-en&encoding=linear16&sample_rate=24000"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as client:
        wait_ready(client)
        yield client


def until_flushed(ws: WebSocketTestSession) -> tuple[bytes, dict[str, Any]]:
    audio = bytearray()
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            audio += message["bytes"]
            continue
        body = json.loads(message["text"])
        if body["type"] == "Flushed":
            return bytes(audio), body
        assert body["type"] != "Error", body


def test_speak_and_flush_give_the_speech_endpoints_audio(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        metadata = ws.receive_json()
        assert metadata["type"] == "Metadata"
        assert metadata["model_name"] == "aura-2-thalia-en"
        for word in TEXT.split(" "):
            ws.send_json({"type": "Speak", "text": word + " "})
        ws.send_json({"type": "Flush"})
        audio, flushed = until_flushed(ws)
        assert flushed == {"type": "Flushed", "sequence_id": 0}
        ws.send_json({"type": "Speak", "text": "And again."})
        ws.send_json({"type": "Flush"})
        _, second = until_flushed(ws)
        assert second == {"type": "Flushed", "sequence_id": 1}
    # The tone engine's audio is per chunk: the same samples in, however the text was cut.
    assert abs(len(audio) - len(spoken(client, TEXT))) <= 0.2 * len(audio)


def socket_audio(client: TestClient, query: str, text: str) -> bytes:
    with client.websocket_connect(f"/v1/speak?{query}") as ws:
        ws.receive_json()
        ws.send_json({"type": "Speak", "text": text})
        ws.send_json({"type": "Flush"})
        return until_flushed(ws)[0]


def test_mulaw_at_8khz_is_a_third_as_many_samples_of_one_byte(client: TestClient) -> None:
    linear = socket_audio(client, "encoding=linear16&sample_rate=24000", TEXT)
    ulaw = socket_audio(client, "encoding=mulaw", TEXT)
    assert len(ulaw) == len(linear) // 2 // 3


def test_clear_is_answered_and_nothing_of_the_cleared_text_follows(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json({"type": "Speak", "text": TEXT * 4})
        ws.send_json({"type": "Flush"})
        ws.send_json({"type": "Clear"})
        while not (message := ws.receive()).get("text") or json.loads(message["text"])["type"] != "Cleared":
            assert message.get("bytes") is not None or json.loads(message["text"])["type"] != "Flushed"
        ws.send_json({"type": "Speak", "text": "Yes?"})
        ws.send_json({"type": "Flush"})
        audio, flushed = until_flushed(ws)
        assert flushed["sequence_id"] == 1
    assert 0 < len(audio) <= len(spoken(client, "Yes?")) * 1.2


def test_close_closes_at_once_and_drops_what_is_queued(client: TestClient) -> None:
    """As Deepgram's own server does: Close stops the session; no Flushed, no more audio."""
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json({"type": "Speak", "text": TEXT * 4})
        ws.send_json({"type": "Flush"})
        ws.send_json({"type": "Close"})
        messages = []
        while (message := ws.receive())["type"] != "websocket.close":
            messages.append(message)
    assert message["code"] == 1000
    assert all(message.get("bytes") is not None for message in messages)  # audio already sent, if any
    assert len(b"".join(message["bytes"] for message in messages)) < len(spoken(client, TEXT * 4))


def test_an_unknown_message_gets_a_warning_and_the_session_goes_on(client: TestClient) -> None:
    with client.websocket_connect(URL) as ws:
        ws.receive_json()
        ws.send_json({"type": "Shout", "text": "x"})
        warning = ws.receive_json()
        assert warning["type"] == "Warning"
        assert warning["code"] == "invalid_event"
        ws.send_text("not json")
        assert ws.receive_json()["type"] == "Warning"
        ws.send_json({"type": "Speak", "text": "Still here."})
        ws.send_json({"type": "Flush"})
        assert until_flushed(ws)[0]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("encoding=mulaw&sample_rate=24000", "invalid_sample_rate"),
        ("encoding=opus", "invalid_parameter"),
        ("model=nobody", "voice_not_found"),
        ("speed=9", "invalid_parameter"),
    ],
)
def test_a_bad_query_is_refused_with_its_reason(client: TestClient, query: str, code: str) -> None:
    with client.websocket_connect(f"/v1/speak?{query}") as ws:
        error = ws.receive_json()
        closed = ws.receive()
    assert error["type"] == "Error"
    assert error["code"] == code
    assert closed["code"] == 1008
    response = client.post(f"/v1/speak?{query}", json={"text": "Hello."})
    assert response.status_code in (400, 404)
    assert response.json()["error"]["code"] == code


def test_post_streams_the_audio_in_the_querys_encoding(client: TestClient) -> None:
    pcm = spoken(client, TEXT)
    same = client.post("/v1/speak?model=af_heart", json={"text": TEXT})
    assert same.status_code == 200
    assert same.headers["content-type"] == "audio/pcm"
    assert same.content == pcm  # 24 kHz linear16 is the pcm response itself
    wav = client.post("/v1/speak?sample_rate=16000&container=wav", json={"text": TEXT})
    assert wav.headers["content-type"] == "audio/wav"
    assert wav.content[:4] == b"RIFF"
    assert len(wav.content) - 44 == pytest.approx(len(pcm) * 2 / 3, rel=0.01)
    ulaw = client.post("/v1/speak?encoding=mulaw", json={"text": TEXT})
    assert ulaw.headers["content-type"] == "audio/basic"
    assert len(ulaw.content) == pytest.approx(len(pcm) / 6, rel=0.01)
    assert client.post("/v1/speak", json={"txt": "Hello."}).status_code in (400, 422)


def test_keys_come_in_deepgrams_header(tmp_path: Path) -> None:
    with make_client(tmp_path, api_keys="dg:secret-key") as client:
        wait_ready(client)
        token = {"Authorization": "Token secret-key"}
        assert client.post("/v1/speak", json={"text": "Hi."}, headers=token).status_code == 200
        refused = client.post("/v1/speak", json={"text": "Hi."}, headers={"Authorization": "Token wrong"})
        assert refused.status_code == 401
        with client.websocket_connect(URL, headers=token) as ws:
            assert ws.receive_json()["type"] == "Metadata"
        with client.websocket_connect(URL) as ws:
            refusal = ws.receive_json()
            with pytest.raises(WebSocketDisconnect):
                ws.receive_json()
        assert refusal["error"]["code"] == "invalid_api_key"


def test_a_full_server_refuses_the_post_with_503(tmp_path: Path) -> None:
    engine = FakeEngine(delay=0.2)
    with make_client(tmp_path, engine, max_inflight=1, max_waiting=0) as client:
        wait_ready(client)
        with client.websocket_connect("/v1/audio/speech/live") as live:
            live.send_json({"type": "input_text.append", "text": TEXT * 3})
            live.send_json({"type": "input_text.flush"})
            live.receive_json()  # its first audio: the one slot is taken
            response = client.post("/v1/speak", json={"text": "Hello."})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert np.frombuffer(b"", dtype="<i2").size == 0
