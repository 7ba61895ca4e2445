"""Word timestamps over HTTP (fake engine and phonemizer): Kokoro-FastAPI's /dev/captioned_speech shapes,
streamed and whole, SSE timestamps on /v1/audio/speech, subtitles, and the errors."""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.audio.joins import MARGIN_S
from api.server.app import create_app
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import make_settings, wait_ready

TEXT = "Hello there, world. It costs $5 today [pause:0.5s] and more tomorrow."
WORDS = ["Hello", "there,", "world.", "It", "costs", "$5", "today", "and", "more", "tomorrow."]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        yield client


def captioned(client: TestClient, **extra: Any) -> Any:
    body = {"input": TEXT, "voice": "af_heart", "response_format": "wav", **extra}
    return client.post("/dev/captioned_speech", json=body)


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as wav:
        return wav.getnframes() / wav.getframerate()


def check_words(timestamps: list[dict[str, Any]], duration: float) -> None:
    assert [item["word"] for item in timestamps] == WORDS
    for item in timestamps:
        assert set(item) == {"word", "start_time", "end_time"}
        assert 0 <= item["start_time"] <= item["end_time"] <= duration + 1e-3
    starts = [item["start_time"] for item in timestamps]
    assert starts == sorted(starts)


def test_whole_response_has_peer_shape_and_every_word(client: TestClient) -> None:
    response = captioned(client, stream=False)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["audio_format"] == "audio/wav"
    audio = base64.b64decode(body["audio"])
    check_words(body["timestamps"], wav_seconds(audio))
    # The pause tag's 0.5 s lies between "today" and "and" (the quiet margins kept around real speech
    # count toward it; a tone has none, so 2 x 0.04 s of it is tone here).
    by_word = {item["word"]: item for item in body["timestamps"]}
    assert by_word["and"]["start_time"] - by_word["today"]["end_time"] >= 0.5 - 2 * MARGIN_S - 0.002


def test_streamed_lines_carry_their_own_words_and_match_the_whole_response(client: TestClient) -> None:
    whole = captioned(client, stream=False).json()["timestamps"]
    response = captioned(client, response_format="pcm")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) >= 2
    assert all(line["audio_format"] == "audio/pcm" and line["audio"] for line in lines)
    streamed = [item for line in lines for item in line["timestamps"]]
    assert streamed == whole
    # A line's words were spoken before its audio ends.
    sent = 0.0
    for line in lines:
        sent += len(base64.b64decode(line["audio"])) / 2 / 24000
        assert all(item["end_time"] <= sent + 1e-3 for item in line["timestamps"])


def test_timestamps_can_be_left_out(client: TestClient) -> None:
    body = captioned(client, stream=False, return_timestamps=False).json()
    assert body["timestamps"] is None
    assert base64.b64decode(body["audio"])


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_come_with_the_audio(client: TestClient, fmt: str) -> None:
    body = captioned(client, stream=False, subtitle_format=fmt).json()
    subtitles = body["subtitles"]
    assert subtitles.startswith("WEBVTT" if fmt == "vtt" else "1\n")
    assert "-->" in subtitles
    text = [line for line in subtitles.split("\n") if line and "-->" not in line and not line.isdigit()]
    assert " ".join(text).removeprefix("WEBVTT ") == " ".join(WORDS)
    streamed = [json.loads(line) for line in captioned(client, subtitle_format=fmt).text.splitlines()]
    assert streamed[-1]["subtitles"] == subtitles
    assert streamed[-1]["audio"] == ""


def test_sse_events_carry_timestamps_when_asked(client: TestClient) -> None:
    body = {"input": TEXT, "voice": "af_heart", "response_format": "pcm", "stream_format": "sse"}
    plain = client.post("/v1/audio/speech", json=body)
    events = [json.loads(line[6:]) for line in plain.text.splitlines() if line.startswith("data: ")]
    assert all("timestamps" not in event for event in events)
    timed = client.post("/v1/audio/speech", json={**body, "return_timestamps": True})
    events = [json.loads(line[6:]) for line in timed.text.splitlines() if line.startswith("data: ")]
    deltas = [event for event in events if event["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done"
    words = [item for event in deltas for item in event["timestamps"]]
    audio = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    check_words(words, len(audio) / 2 / 24000)


def test_speed_scales_the_times(client: TestClient) -> None:
    normal = captioned(client, stream=False).json()["timestamps"]
    fast = captioned(client, stream=False, speed=2.0).json()["timestamps"]
    assert fast[-1]["end_time"] < 0.7 * normal[-1]["end_time"]


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/audio/speech", {"return_timestamps": True}, "return_timestamps"),
        ("/dev/captioned_speech", {"return_download_link": True}, "return_download_link"),
        ("/dev/captioned_speech", {"voice": "nobody"}, "voice"),
        ("/dev/captioned_speech", {"subtitle_format": "ass"}, None),
    ],
)
def test_bad_requests_get_clear_errors(
    client: TestClient, path: str, extra: dict[str, Any], param: str | None
) -> None:
    body = {"input": TEXT, "voice": "af_heart", **extra}
    response = client.post(path, json=body)
    assert response.status_code in (400, 404, 422)
    error = response.json()["error"]
    assert error["message"]
    if param is not None:
        assert error["param"] == param
