"""/metrics stays true when a worker dies under load: the requests the dead worker had in flight or
waiting leave the live gauges (api/metrics.py `forget_dead_processes`). Real uvicorn workers over the tone
engine, sharing one prometheus multiprocess directory that the test reads per worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from scripts.harness import Server, running_server
from tests.e2e.test_workers import TEXT, children

CLIENTS = 6
LIVE = ("kokoro_requests_in_flight", "kokoro_requests_waiting", "kokoro_engine_queue_depth")


def served(server: Server) -> dict[str, float]:
    """The live gauges as /metrics (in whichever worker answers) reports them."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return {name: values.get(name, 0.0) for name in LIVE}


def written_by(directory: Path, pid: int) -> dict[str, float]:
    """The live gauges one worker has written (its own file), read without going through the server."""
    files = [str(path) for path in directory.glob(f"gauge_livesum_{pid}.db")]
    merged = MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
    values = {sample.name: sample.value for metric in merged for sample in metric.samples}
    return {name: values.get(name, 0.0) for name in LIVE}


def requests(gauges: dict[str, float]) -> float:
    return gauges["kokoro_requests_in_flight"] + gauges["kokoro_requests_waiting"]


@pytest.fixture
def metrics_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "metrics"
    directory.mkdir()
    return directory


@pytest.fixture
def two_workers(random_weights: Path, tmp_path: Path, metrics_dir: Path) -> Iterator[Server]:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        TONE_ENGINE_DELAY_S="0.3",
        KOKORO_MAX_INFLIGHT="2",  # with 6 clients on 2 workers some wait: both live gauges are exercised
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
    ) as server:
        yield server


def stream(server: Server, outcomes: list[str]) -> None:
    body = {"input": TEXT, "voice": "af_heart", "response_format": "pcm"}
    try:
        with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as response:
            for _ in response.iter_bytes():
                pass
        outcomes.append(str(response.status_code))
    except httpx.TransportError as exc:  # a request on the killed worker breaks
        outcomes.append(type(exc).__name__)


def wait_for(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.1)
    assert condition(), "timed out"  # type: ignore[operator]


def test_a_killed_workers_requests_leave_the_live_gauges(two_workers: Server, metrics_dir: Path) -> None:
    workers = children(two_workers.process.pid)
    assert len(workers) == 2, workers
    outcomes: list[str] = []
    threads = [threading.Thread(target=stream, args=(two_workers, outcomes)) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    wait_for(lambda: requests(served(two_workers)) == CLIENTS)  # every request is in flight or waiting
    victim = max(workers, key=lambda pid: requests(written_by(metrics_dir, pid)))
    killed = requests(written_by(metrics_dir, victim))
    assert killed >= 1  # the victim had requests of its own: without the fix they would stay counted

    os.kill(victim, signal.SIGKILL)
    # At once (a second for the kill to land), while the survivor's requests still run.
    wait_for(lambda: requests(served(two_workers)) <= CLIENTS - killed, timeout=1.0)
    # The pod's preStop hook waits for the survivor's requests, and no longer (it would forever, were the
    # dead worker's still counted).
    drain = subprocess.Popen(
        [sys.executable, "-m", "api.server.drain", "--url", two_workers.url, "--timeout", "60"]
    )
    for thread in threads:
        thread.join()
    assert drain.poll() is None  # not done while requests ran (it needs 5 s of quiet after them)
    assert drain.wait(30) == 0

    assert sum(outcome == "200" for outcome in outcomes) >= CLIENTS - killed, outcomes
    assert served(two_workers) == dict.fromkeys(LIVE, 0.0)
    assert not list(metrics_dir.glob(f"gauge_livesum_{victim}.db"))
    assert list(metrics_dir.glob(f"counter_{victim}.db"))  # its counters still count
