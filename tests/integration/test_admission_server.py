"""Admission control in a real server process (tone engine, slowed down so requests overlap): 503 with
Retry-After beyond the limits, health never refused, slots released on finish, disconnect and error."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.harness import Server, running_server

LONG = " ".join(f"Sentence number {i} keeps the engine busy for a while." for i in range(12))


@pytest.fixture(scope="module")
def server(random_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("admission") / "server.log"
    with running_server(
        random_weights,
        log,
        module="tests.tone_server",
        KOKORO_MAX_INFLIGHT="1",
        KOKORO_MAX_WAITING="1",
        KOKORO_MAX_WAIT_S="60",
        KOKORO_FIRST_CHUNK_TOKENS="5",
        KOKORO_CHUNK_MIN_TOKENS="20",
        KOKORO_CHUNK_MAX_TOKENS="30",
        KOKORO_CHUNK_HARD_MAX_TOKENS="60",
        TONE_ENGINE_DELAY_S="0.25",
        TONE_ENGINE_FAIL_SYMBOL="ʒ",
    ) as running:
        yield running


def speak(server: Server, text: str = "Hello there.", **extra: object) -> httpx.Response:
    body = {"input": text, "voice": "af_heart", "response_format": "pcm", **extra}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120)


def gauge(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def wait_until_idle(server: Server, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while gauge(server, "kokoro_requests_in_flight") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gauge(server, "kokoro_requests_in_flight") == 0


def in_background(server: Server, text: str) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    result: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: result.setdefault("response", speak(server, text)))
    thread.start()
    return thread, result


def test_overload_gets_503_with_retry_after_and_health_stays_up(server: Server) -> None:
    wait_until_idle(server)
    first, first_result = in_background(server, LONG)
    time.sleep(0.5)
    second, second_result = in_background(server, LONG)  # waits in line
    time.sleep(0.5)
    assert gauge(server, "kokoro_requests_waiting") == 1
    refused = speak(server)
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["code"] == "overloaded"
    assert set(error) == {"message", "type", "param", "code"}
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/v1/audio/voices"):
        assert httpx.get(f"{server.url}{path}", timeout=5).status_code == 200, path
    first.join()
    second.join()
    assert first_result["response"].status_code == 200
    assert second_result["response"].status_code == 200  # the line moved on
    assert gauge(server, "kokoro_requests_rejected_total") >= 1
    wait_until_idle(server)


def test_slot_is_released_when_the_client_disconnects(server: Server) -> None:
    wait_until_idle(server)
    body = {"input": LONG, "voice": "af_heart", "response_format": "pcm"}
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()  # kept referenced: a collected iterator closes the response
        next(chunks)
        assert gauge(server, "kokoro_requests_in_flight") == 1
    wait_until_idle(server, timeout=10)  # long before the 12 sentences would have been synthesized
    assert speak(server).status_code == 200


def test_slot_is_released_after_an_error(server: Server) -> None:
    wait_until_idle(server)
    response = speak(server, "Measure the pleasure.", stream=False)  # ʒ makes the tone engine fail
    assert response.status_code == 500
    wait_until_idle(server, timeout=5)
    assert speak(server).status_code == 200


def test_metrics_count_requests_and_audio(server: Server) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    for name in (
        "kokoro_requests_total",
        "kokoro_time_to_first_audio_seconds",
        "kokoro_request_latency_seconds",
        "kokoro_audio_seconds_total",
        "kokoro_engine_batch_size",
        "kokoro_real_time_factor",
        "kokoro_engine_queue_depth",
    ):
        assert name in text, name
    assert 'kokoro_requests_total{status="200"}' in text
    assert 'kokoro_requests_total{status="503"}' in text  # admission's refusals are counted too
    assert gauge(server, "kokoro_audio_seconds_total") > 0


def test_the_openai_sdk_retries_a_503_after_retry_after(server: Server) -> None:
    from openai import OpenAI

    wait_until_idle(server)
    rejected_before = gauge(server, "kokoro_requests_rejected_total")
    busy = [in_background(server, LONG) for _ in range(2)]  # one in synthesis, one in line: full
    time.sleep(0.5)
    client = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=6)
    started = time.monotonic()
    speech = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", response_format="pcm")
    assert len(speech.content) > 0
    assert gauge(server, "kokoro_requests_rejected_total") > rejected_before  # it was refused first...
    assert time.monotonic() - started >= 1.0  # ...and waited at least one Retry-After before succeeding
    for thread, result in busy:
        thread.join()
        assert result["response"].status_code == 200
