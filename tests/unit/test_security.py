"""API keys, CORS, body limits and timeouts, control characters, JSON access logs, the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.server.app import create_app
from api.server.logs import JsonFormatter
from api.server.security import ApiKey, MissingKeysError, load_keys, match_key, parse_keys, required_keys
from api.text.normalize import normalize_text
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.conftest import StartClient
from tests.unit.test_api import make_settings

SPEECH = {"input": "Hello there.", "voice": "af_heart", "response_format": "pcm"}


@pytest.fixture
def make_client(tmp_path: Path, start_client: StartClient) -> Any:
    def make(**settings: Any) -> TestClient:
        app = create_app(
            make_settings(tmp_path, **settings), engine=FakeEngine(), phonemizer=FakePhonemizer()
        )  # type: ignore[arg-type]
        return start_client(app)

    return make


def test_keys_parse_with_labels_comments_and_hashed_labels(tmp_path: Path) -> None:
    file = tmp_path / "keys.txt"
    file.write_text("# team keys\nalice:sk-alice\n\n  sk-bare  \n")
    keys = load_keys("bob:sk-bob, sk-other", file)
    assert [key.label for key in keys][:1] == ["bob"]
    assert [key.secret for key in keys] == [b"sk-bob", b"sk-other", b"sk-alice", b"sk-bare"]
    assert keys[1].label.startswith("key-")
    assert "sk-other" not in keys[1].label
    assert parse_keys(["", "# only a comment"]) == []


def test_match_key_compares_every_key() -> None:
    keys = [ApiKey("a", b"one"), ApiKey("b", b"two")]
    assert match_key(keys, b"two") == keys[1]
    assert match_key(keys, b"tw") is None
    assert match_key(keys, b"") is None


def test_keys_off_by_default(make_client: Any) -> None:
    assert make_client().post("/v1/audio/speech", json=SPEECH).status_code == 200


def test_api_keys_guard_everything_but_health_and_ready(make_client: Any) -> None:
    client = make_client(api_keys="alice:sk-alice-123")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sk-alice-123"}):
        response = client.post("/v1/audio/speech", json=SPEECH, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/models").status_code == 401
    assert client.get("/health").status_code == 200
    assert client.get("/ready").status_code == 200
    good = {"Authorization": "Bearer sk-alice-123"}
    assert client.post("/v1/audio/speech", json=SPEECH, headers=good).status_code == 200
    assert client.get("/v1/audio/voices", headers=good).status_code == 200
    metrics = client.get("/metrics").text  # open unless metrics_require_key
    assert 'kokoro_requests_by_key_total{key="alice",status="200"} 1.0' in metrics
    assert "sk-alice-123" not in metrics


def test_the_voice_and_model_lists_are_open_to_reading_as_open_webui_reads_them(make_client: Any) -> None:
    client = make_client(api_keys="sk-1")
    voices = client.get("/v1/audio/voices")  # no key, as Open WebUI sends none for its menus
    assert voices.status_code == 200
    assert any(voice["id"] == voice["name"] == "af_heart" for voice in voices.json()["voices"])
    models = client.get("/v1/audio/models")
    assert models.status_code == 200
    assert {"id": "tts-1", "name": "tts-1"} in models.json()["models"]
    # Only reading them: an upload or a voice's download still needs a key.
    assert client.post("/v1/audio/voices", data={"name": "x", "voice": "af_heart"}).status_code == 401
    assert client.get("/v1/audio/voices/af_heart").status_code == 401
    closed = make_client(api_keys="sk-1", lists_require_key=True)
    assert closed.get("/v1/audio/voices").status_code == 401
    assert closed.get("/v1/audio/models").status_code == 401
    assert closed.get("/v1/audio/models", headers={"Authorization": "Bearer sk-1"}).status_code == 200


def test_metrics_can_require_a_key(make_client: Any) -> None:
    client = make_client(api_keys="sk-1", metrics_require_key=True)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer sk-1"}).status_code == 200


def test_the_openai_sdk_sends_its_api_key_as_a_bearer_token(make_client: Any) -> None:
    import openai

    client = make_client(api_keys="sk-sdk")  # a TestClient is an httpx.Client: the SDK sends through it
    sdk = openai.OpenAI(api_key="sk-sdk", base_url="http://testserver/v1", http_client=client)
    audio = sdk.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", response_format="pcm")
    assert len(audio.content) > 1000
    bad = openai.OpenAI(
        api_key="sk-wrong", base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        bad.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")


def test_cors_off_by_default_and_on_for_listed_origins(make_client: Any) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    off = make_client().options("/v1/audio/speech", headers=preflight)
    assert "access-control-allow-origin" not in off.headers
    client = make_client(cors_origins="https://app.example", api_keys="sk-1")
    on = client.options("/v1/audio/speech", headers=preflight)
    assert on.status_code == 200
    assert on.headers["access-control-allow-origin"] == "https://app.example"
    other = client.options("/v1/audio/speech", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    response = client.post(
        "/v1/audio/speech",
        json=SPEECH,
        headers={"Origin": "https://app.example", "Authorization": "Bearer sk-1"},
    )
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in response.headers["access-control-expose-headers"].lower()


def test_a_body_over_the_limit_is_refused_with_413(make_client: Any) -> None:
    client = make_client(max_body_bytes=4096)
    declared = client.post(
        "/v1/audio/speech", content=b"x" * 5000, headers={"Content-Type": "application/json"}
    )
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies as the bytes arrive
        yield b'{"input": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    streamed = client.post("/v1/audio/speech", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert streamed.json()["error"]["code"] == "request_too_large"


def test_the_default_limit_admits_the_longest_valid_input(make_client: Any) -> None:
    client = make_client(max_input_chars=2000)
    text = "\u00e9a" * 1000  # json.dumps escapes the é as \\u00e9: 6 bytes for one character
    body = json.dumps({**SPEECH, "input": text}).encode()
    response = client.post("/v1/audio/speech", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    too_big = client.post(
        "/v1/audio/speech", content=b" " * 100_000, headers={"Content-Type": "application/json"}
    )
    assert too_big.status_code == 413


def run_asgi(app: Any, scope: dict[str, Any], receive: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        await app(scope, receive, send)

    asyncio.run(main())
    return sent


def http_scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": "/v1/audio/speech",
        "raw_path": b"/v1/audio/speech",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1),
        "headers": [(b"content-type", b"application/json"), *headers],
    }


def test_a_huge_declared_body_is_refused_before_any_of_it_is_read(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 1_000_000, "more_body": True}

    sent = run_asgi(app, http_scope([(b"content-length", b"50000000")]), receive)
    assert sent[0]["status"] == 413
    assert reads == 0


def test_a_body_that_does_not_arrive_in_time_gets_408(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, body_timeout_s=0.2)
    app = create_app(settings, engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    messages = [{"type": "http.request", "body": b'{"input": ', "more_body": True}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(5)
        return {"type": "http.disconnect"}

    sent = run_asgi(app, http_scope([]), receive)
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["code"] == "timeout"


def test_control_and_format_characters_are_dropped_not_the_text() -> None:
    assert normalize_text("\u0000abc") == "abc"
    assert normalize_text("soft\u00adware zero\u200bwidth") == "software zerowidth"
    assert normalize_text("line\nbreak\ttab") == "line\nbreak tab"


def test_control_characters_do_not_swallow_speech_with_the_real_g2p() -> None:
    from api.text.phonemize import Phonemizer

    words = Phonemizer().words(normalize_text("\u0000abc"), "a")
    assert "".join(word.phonemes for word in words)


def test_access_log_lines_are_json_without_the_input(
    make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    with caplog.at_level(logging.INFO, logger="api.access"):
        response = client.post("/v1/audio/speech", json={**SPEECH, "input": "A secret sentence."})
    record = next(record for record in caplog.records if record.name == "api.access")
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == response.headers["x-request-id"]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/audio/speech", 200)
    assert line["duration_ms"] > 0
    assert line["audio_seconds"] > 0
    assert "secret" not in json.dumps(line)


def test_access_log_has_the_input_only_when_asked(make_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(log_input=True)
    with caplog.at_level(logging.INFO, logger="api.access"):
        client.post("/v1/audio/speech", json={**SPEECH, "input": "A secret sentence."})
    record = next(record for record in caplog.records if record.name == "api.access")
    assert json.loads(JsonFormatter().format(record))["input"] == "A secret sentence."


def test_openapi_tells_the_truth(make_client: Any) -> None:
    document = make_client().get("/openapi.json").json()
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert "422" not in operation["responses"], path
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert list(response["content"]) == ["application/json"], (path, status)
    speech = document["paths"]["/v1/audio/speech"]["post"]["responses"]
    assert {
        "audio/mpeg",
        "audio/ogg",
        "audio/aac",
        "audio/flac",
        "audio/wav",
        "audio/pcm",
        "text/event-stream",
    } <= set(speech["200"]["content"])
    assert {"400", "401", "404", "413", "503"} <= set(speech)
    assert "Retry-After" in speech["503"]["headers"]
    assert list(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_required_keys_refuse_to_start_with_none(tmp_path: Path) -> None:
    with pytest.raises(MissingKeysError, match="KOKORO_REQUIRE_API_KEYS"):
        required_keys("", None, required=True)
    empty = tmp_path / "keys"
    empty.write_text("# no keys yet\n")
    with pytest.raises(MissingKeysError):
        required_keys(" , ", empty, required=True)


def test_required_keys_pass_with_a_key_or_when_not_required(tmp_path: Path) -> None:
    assert [key.label for key in required_keys("ops:secret", None, required=True)] == ["ops"]
    listed = tmp_path / "keys"
    listed.write_text("alice:one\n")
    assert [key.label for key in required_keys("", listed, required=True)] == ["alice"]
    assert required_keys("", None, required=False) == []


def test_the_server_refuses_to_start_without_required_keys(tmp_path: Path) -> None:
    """`python -m api` exits at once with the reason, before loading any model."""
    env = {**os.environ, "KOKORO_REQUIRE_API_KEYS": "true", "KOKORO_API_KEYS": "", "HF_HUB_OFFLINE": "1"}
    env.pop("KOKORO_API_KEYS_FILE", None)
    done = subprocess.run(
        [sys.executable, "-m", "api", "--port", "1"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "no API key is set" in done.stderr
    assert "Application startup" not in done.stderr
