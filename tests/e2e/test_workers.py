"""Worker processes: a killed worker is replaced while the other keeps serving; a worker slow to start is
not killed, a hung one is; `/ready` waits for every worker; SIGTERM drains the streams in flight before the
server exits. Real `uvicorn` worker processes over the tone engine."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.harness import Server, launch_server, running_server, stop_server, wait_ready
from tests.tone_server import HOLD_GIL_ENV

TEXT = " ".join(f"Sentence {i} of a request that takes a little while." for i in range(6))


def children(pid: int) -> set[int]:
    """The server's worker processes (multiprocessing also starts a resource tracker: not a worker)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    pids = {int(child) for child in path.read_text().split()} if path.exists() else set()
    return {child for child in pids if b"spawn_main" in _cmdline(child)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def ready(server: Server) -> httpx.Response:
    return httpx.get(f"{server.url}/ready", timeout=10)


def speak(server: Server, text: str = TEXT) -> httpx.Response:
    body = {"input": text, "voice": "af_heart", "response_format": "pcm"}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)


@pytest.fixture
def two_workers(random_weights: Path, tmp_path: Path) -> Iterator[Server]:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        TONE_ENGINE_DELAY_S="0.1",
    ) as server:
        yield server


def test_a_killed_worker_is_replaced_and_the_other_keeps_serving(two_workers: Server) -> None:
    workers = children(two_workers.process.pid)
    assert len(workers) == 2, workers
    results: list[int | str] = []

    def client() -> None:
        for _ in range(6):
            try:
                response = speak(two_workers)
            except httpx.TransportError as exc:  # a request on the killed worker may break
                results.append(type(exc).__name__)
                continue
            # The replacement answers 503 + Retry-After while its model loads: honest, not an error.
            loading = response.status_code == 503 and "retry-after" in response.headers
            results.append("503 loading" if loading else response.status_code)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    victim = sorted(workers)[0]
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ready(two_workers).status_code != 200:
        time.sleep(0.5)
    assert ready(two_workers).json()["workers_ready"] == 2
    replaced = children(two_workers.process.pid)
    assert len(replaced) == 2
    assert victim not in replaced
    broken = [result for result in results if isinstance(result, str) and result != "503 loading"]
    assert len(broken) <= 3, results  # at most the requests in flight on the killed worker (one per client)
    assert results.count(200) >= 3, results  # the surviving worker kept serving throughout
    allowed = (200, "503 loading", "RemoteProtocolError", "ReadError", "ConnectError")
    assert all(result in allowed for result in results), results
    assert "died" in two_workers.log()


def test_ready_counts_every_worker(two_workers: Server) -> None:
    assert ready(two_workers).json() | {"in_flight": 0} == {
        "status": "ready",
        "engine": "fake",
        "model_loaded": True,
        "in_flight": 0,
        "waiting": 0,
        "workers_ready": 2,
        "workers": 2,
    }


# Longer than uvicorn's own health-check timeout (5 s), well under the server's default (30 s).
SLOW_START_S = 7


def test_a_worker_slow_to_start_is_not_killed(random_weights: Path, tmp_path: Path) -> None:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        **{HOLD_GIL_ENV: str(SLOW_START_S)},
    ) as server:
        assert ready(server).json()["workers_ready"] == 2
        log = server.log()
        assert "died" not in log
        assert log.count("Started server process") == 2  # no worker was replaced


def test_the_same_start_under_uvicorns_timeout_is_killed(random_weights: Path, tmp_path: Path) -> None:
    """The control: what the server's setting prevents (uvicorn's 5 s kills the slow start)."""
    server = launch_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        KOKORO_WORKER_HEALTHCHECK_TIMEOUT_S="5",
        **{HOLD_GIL_ENV: str(SLOW_START_S)},
    )
    try:
        deadline = time.monotonic() + 60
        while "died" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert "died" in server.log()
    finally:
        stop_server(server)


def test_a_hung_worker_is_replaced(random_weights: Path, tmp_path: Path) -> None:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        # uvicorn's own default: with 2 s a loaded CI machine once had a healthy worker killed too, after
        # the replacement (workers_ready 1 right after /ready said 200).
        KOKORO_WORKER_HEALTHCHECK_TIMEOUT_S="5",
    ) as server:
        workers = children(server.process.pid)
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGSTOP)  # alive, but answers nothing: as a deadlock would leave it
        deadline = time.monotonic() + 60
        while victim in children(server.process.pid) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert victim not in children(server.process.pid)
        wait_ready(server)
        # Two separate looks (the board through /ready, the processes through /proc) agree once the server
        # is whole again; twice in clean clones they did not in the same instant (workers_ready 2, one
        # child listed; the logs were lost), so the test waits for both together, and says why if never.
        deadline = time.monotonic() + 60
        while ready(server).json()["workers_ready"] != 2 or len(children(server.process.pid)) != 2:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.25)
        assert "died" in server.log()


def test_sigterm_drains_the_streams_in_flight(random_weights: Path, tmp_path: Path) -> None:
    with running_server(
        random_weights, tmp_path / "server.log", module="tests.tone_server", TONE_ENGINE_DELAY_S="0.2"
    ) as server:
        expected = len(speak(server).content)
        received = bytearray()
        body = {"input": TEXT, "voice": "af_heart", "response_format": "pcm"}
        with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as response:
            chunks = response.iter_bytes()
            received += next(chunks)
            server.process.send_signal(signal.SIGTERM)
            for data in chunks:
                received += data
        assert len(received) == expected  # the whole stream, not a truncated one
        # uvicorn re-raises the signal once it has shut down, so the exit is "terminated by SIGTERM".
        assert server.process.wait(30) in (0, -signal.SIGTERM)
        assert "Finished server process" in server.log()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/health", timeout=2)
