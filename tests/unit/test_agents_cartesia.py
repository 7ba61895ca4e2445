"""Cartesia's `/tts/websocket` and `/tts/bytes` (api/live/cartesia.py) over a fake engine: contexts and
their chunks, timestamps and done, cancel (barge-in), the output formats, bad messages, and keys in
Cartesia's header. The frameworks' real plugins run against the real model in
tests/integration/test_voice_agents.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketTestSession

from tests.unit.test_api import wait_ready
from tests.unit.test_live import TEXT, make_client

PATH = "/tts/websocket?cartesia_version=2025-04-16"
VOICE = {"mode": "id", "id": "f786b574-daa5-4673-aa0c-cbe3e8534c02"}
FORMAT = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as client:
        wait_ready(client)
        yield client


def message(context: str, transcript: str, *, more: bool = True, **fields: Any) -> dict[str, Any]:
    return {
        "model_id": "sonic-3",
        "voice": VOICE,
        "output_format": FORMAT,
        "context_id": context,
        "transcript": transcript,
        "continue": more,
        "add_timestamps": True,
        **fields,
    }


def until_done(ws: WebSocketTestSession, context: str) -> tuple[bytes, list[dict[str, Any]]]:
    audio = bytearray()
    stamps = []
    while (body := ws.receive_json())["type"] != "done":
        assert body["type"] != "error", body
        assert body["context_id"] == context
        if body["type"] == "chunk":
            audio += base64.b64decode(body["data"])
        elif body["type"] == "timestamps":
            stamps.append(body["word_timestamps"])
    assert body == {"type": "done", "context_id": context, "status_code": 200, "done": True}
    return bytes(audio), stamps


def test_a_context_streams_chunks_and_word_timestamps(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        for word in TEXT.split(" "):
            ws.send_json(message("a", word + " "))
        ws.send_json(message("a", "", more=False))
        audio, stamps = until_done(ws, "a")
        ws.send_json(message("b", "And again.", more=False))
        again, _ = until_done(ws, "b")
    assert audio
    assert again
    words = [word for stamp in stamps for word in stamp["words"]]
    assert words == TEXT.split()
    starts = [start for stamp in stamps for start in stamp["start"]]
    ends = [end for stamp in stamps for end in stamp["end"]]
    assert starts == sorted(starts)
    assert all(start <= end for start, end in zip(starts, ends, strict=True))
    assert ends[-1] <= len(audio) / 2 / 24000 + 0.01


def test_cancel_drops_the_context_at_once(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_json(message("long", TEXT * 6, more=False))
        assert ws.receive_json()["context_id"] == "long"
        ws.send_json({"context_id": "long", "cancel": True})
        ws.send_json(message("next", "Yes?", more=False))
        seen = []
        while (body := ws.receive_json())["type"] != "done":
            seen.append((body["context_id"], body["type"]))
        assert body["context_id"] == "next"
    long_chunks = [kind for context, kind in seen if context == "long" and kind == "chunk"]
    assert len(long_chunks) <= 3  # what was already on its way, of the dozen chunks it would have had
    assert ("next", "chunk") in seen


@pytest.mark.parametrize(
    ("encoding", "rate", "bytes_per_sample"),
    [("pcm_s16le", 16000, 2), ("pcm_f32le", 44100, 4), ("pcm_mulaw", 8000, 1), ("pcm_alaw", 8000, 1)],
)
def test_output_formats_over_the_socket_and_the_post(
    client: TestClient, encoding: str, rate: int, bytes_per_sample: int
) -> None:
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": rate}
    reference = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
    with client.websocket_connect(PATH) as ws:
        ws.send_json(message("a", TEXT, more=False, output_format=fmt))
        audio, _ = until_done(ws, "a")
        ws.send_json(message("b", TEXT, more=False, output_format=reference))
        pcm, _ = until_done(ws, "b")
    assert len(audio) // bytes_per_sample == round(len(pcm) // 2 * rate / 24000)
    body = {"model_id": "sonic-3", "transcript": TEXT, "voice": VOICE, "output_format": fmt}
    response = client.post("/tts/bytes", json=body, headers={"Cartesia-Version": "2025-04-16"})
    assert response.status_code == 200, response.text
    whole = client.post("/tts/bytes", json={**body, "output_format": reference}).content
    assert len(response.content) // bytes_per_sample == round(len(whole) // 2 * rate / 24000)
    if encoding == "pcm_f32le":
        assert np.abs(np.frombuffer(response.content, dtype="<f4")).max() <= 1.0


def test_wav_from_the_post(client: TestClient) -> None:
    fmt = {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 22050}
    body = {
        "model_id": "sonic-3",
        "transcript": TEXT,
        "voice": {"mode": "id", "id": "af_heart"},
        "output_format": fmt,
    }
    response = client.post("/tts/bytes", json=body)
    assert response.headers["content-type"] == "audio/wav"
    assert response.content[:4] == b"RIFF"


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"voice": {"mode": "id", "id": "nobody"}}, "voice_not_found"),
        (
            {"output_format": {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 24000}},
            "invalid_sample_rate",
        ),
        (
            {"output_format": {"container": "mp3", "encoding": "pcm_s16le", "sample_rate": 24000}},
            "invalid_parameter",
        ),
        ({"context_id": ""}, "invalid_event"),
    ],
)
def test_a_bad_message_is_an_error_and_the_socket_goes_on(
    client: TestClient, override: dict[str, Any], code: str
) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_json({**message("a", "Hello.", more=False), **override})
        error = ws.receive_json()
        assert error["type"] == "error"
        assert error["code"] == code
        ws.send_json(message("b", "Still here.", more=False))
        assert until_done(ws, "b")[0]


def test_text_for_an_ended_context_is_refused(client: TestClient) -> None:
    with client.websocket_connect(PATH) as ws:
        ws.send_json(message("a", TEXT * 3, more=False))
        ws.send_json(message("a", "More?"))
        messages = []
        while (body := ws.receive_json())["type"] != "done":
            messages.append(body)
    assert any(body["type"] == "error" and body["code"] == "context_closed" for body in messages)


def test_keys_come_in_cartesias_header(tmp_path: Path) -> None:
    with make_client(tmp_path, api_keys="ca:secret-key") as client:
        wait_ready(client)
        body = {"model_id": "sonic-3", "transcript": "Hi.", "voice": VOICE, "output_format": FORMAT}
        assert client.post("/tts/bytes", json=body, headers={"X-API-Key": "secret-key"}).status_code == 200
        assert client.post("/tts/bytes", json=body, headers={"X-API-Key": "wrong"}).status_code == 401
        with client.websocket_connect(PATH, headers={"X-API-Key": "secret-key"}) as ws:
            ws.send_json(message("a", "Hi.", more=False))
            assert until_done(ws, "a")[0]
