"""Custom voices and idle unload in real server processes over the tone engine: an upload through one
worker is served by both workers of a `--workers 2` server (and its deletion refused by both), an upload
survives a restart, and an idle-unloaded worker reloads under a request with /ready and /metrics telling
the truth throughout."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from openai import OpenAI
from prometheus_client.multiprocess import MultiProcessCollector

from scripts.harness import Server, running_server
from tests.e2e.test_workers import children

VOICE = "af_shared"
TRIES = 80


def pack_file(value: float) -> bytes:
    buffer = io.BytesIO()
    torch.save(torch.full((510, 1, 256), value), buffer)
    return buffer.getvalue()


def upload(server: Server, name: str, data: bytes) -> httpx.Response:
    files = {"file": (f"{name}.pt", data)}
    return httpx.post(f"{server.url}/v1/audio/voices", data={"name": name}, files=files, timeout=30)


def speak(server: Server, voice: str) -> int:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm"}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30).status_code


def statuses_by_worker(directory: Path, workers: set[int]) -> dict[int, dict[str, float]]:
    """Each worker's kokoro_requests_total by status, read from its own multiprocess file."""
    counts: dict[int, dict[str, float]] = {}
    for pid in workers:
        files = [str(path) for path in directory.glob(f"counter_{pid}.db")]
        merged = MultiProcessCollector.merge(files) if files else []  # type: ignore[no-untyped-call]
        counts[pid] = {
            sample.labels["status"]: sample.value
            for metric in merged
            for sample in metric.samples
            if sample.name == "kokoro_requests_total"
        }
    return counts


def until_both_answered(server: Server, directory: Path, status: int, ask: Callable[[], int]) -> None:
    """Ask until each worker has answered `status` more often than before, every answer being `status`."""
    workers = children(server.process.pid)
    assert len(workers) == 2, workers
    before = statuses_by_worker(directory, workers)
    for _ in range(TRIES):
        assert ask() == status
        now = statuses_by_worker(directory, workers)
        key = str(status)
        if all(now[pid].get(key, 0) > before[pid].get(key, 0) for pid in workers):
            return
    raise AssertionError(f"one worker never answered in {TRIES} requests: {now}")


def test_an_upload_through_one_worker_is_served_by_both_and_so_is_its_deletion(
    random_weights: Path, tmp_path: Path
) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        KOKORO_CUSTOM_VOICES_DIR=str(tmp_path / "voices"),
        PROMETHEUS_MULTIPROC_DIR=str(metrics),
    ) as server:
        # Both workers look the voice up and miss first: neither may keep that answer.
        until_both_answered(server, metrics, 400, lambda: speak(server, VOICE))
        assert upload(server, VOICE, pack_file(0.4)).status_code == 201
        until_both_answered(server, metrics, 200, lambda: speak(server, VOICE))
        assert httpx.delete(f"{server.url}/v1/audio/voices/{VOICE}", timeout=10).status_code == 200
        until_both_answered(server, metrics, 400, lambda: speak(server, VOICE))


def test_an_upload_survives_a_restart(random_weights: Path, tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    server_env = {"module": "tests.tone_server", "KOKORO_CUSTOM_VOICES_DIR": str(voices)}
    with running_server(random_weights, tmp_path / "first.log", **server_env) as server:
        assert upload(server, "bm_kept", pack_file(0.7)).status_code == 201
    with running_server(random_weights, tmp_path / "second.log", **server_env) as server:
        listed = httpx.get(f"{server.url}/v1/audio/voices", timeout=10).json()["voices"]
        assert "bm_kept" in [voice["id"] for voice in listed]
        # The client users run speaks with it by name.
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        speech = client.audio.speech.create(
            model="kokoro", voice="bm_kept", input="Hello there.", response_format="pcm"
        )
        assert len(speech.content) > 0
        download = httpx.get(f"{server.url}/v1/audio/voices/bm_kept", timeout=10)
        assert torch.equal(
            torch.load(io.BytesIO(download.content), weights_only=True), torch.full((510, 1, 256), 0.7)
        )
        assert speak(server, "bm_kept") == 200


def metric(server: Server, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_an_idle_worker_unloads_and_a_request_waits_for_its_reload(
    random_weights: Path, tmp_path: Path
) -> None:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        KOKORO_IDLE_UNLOAD_S="1",
        TONE_ENGINE_LOAD_DELAY_S="1.5",  # each load, the reload too: long enough to watch it
    ) as server:
        assert speak(server, "af_heart") == 200
        deadline = time.monotonic() + 15
        while httpx.get(f"{server.url}/ready", timeout=5).json()["status"] != "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        ready = httpx.get(f"{server.url}/ready", timeout=5)
        assert ready.status_code == 200
        assert ready.json()["model_loaded"] is False
        assert metric(server, "kokoro_model_loaded") == 0
        assert metric(server, "kokoro_model_unloads_total") == 1
        answered: list[int] = []
        waiting = threading.Thread(target=lambda: answered.append(speak(server, "af_heart")))
        started = time.monotonic()
        waiting.start()
        seen: set[str] = set()
        while waiting.is_alive():
            probe = httpx.get(f"{server.url}/ready", timeout=5)
            assert probe.status_code == 200  # a probe never takes the worker out while it reloads
            seen.add(probe.json()["status"])
            time.sleep(0.05)
        waiting.join()
        assert answered == [200]
        assert time.monotonic() - started >= 1.5  # it waited for the reload
        assert "reloading" in seen
        assert metric(server, "kokoro_model_loaded") == 1
        assert metric(server, "kokoro_model_reload_seconds_count") == 1
        assert "engine fake unloaded after" in server.log()
