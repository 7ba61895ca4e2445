"""The worker board: every worker's engine state, so that /ready in any worker answers for all of them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.server.app import create_app
from api.server.workers import BOARD_ENV, WorkerBoard, WorkerCount, on_board
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import make_settings, wait_ready


@pytest.fixture
def other_worker() -> Iterator[int]:
    """A live process standing in for another worker."""
    process = subprocess.Popen(["sleep", "60"])
    yield process.pid
    process.kill()
    process.wait()


def test_counts_the_live_workers_that_are_ready(tmp_path: Path, other_worker: int) -> None:
    board = WorkerBoard.create(2, tmp_path)
    WorkerBoard(board.directory, pid=other_worker).record("starting")
    board.record("ready")
    assert board.count() == WorkerCount(ready=1, expected=2)
    assert not board.count().all_ready
    WorkerBoard(board.directory, pid=other_worker).record("ready")
    assert board.count().all_ready


def test_a_dead_workers_file_does_not_count(tmp_path: Path, other_worker: int) -> None:
    board = WorkerBoard.create(2, tmp_path)
    board.record("ready")
    WorkerBoard(board.directory, pid=other_worker).record("ready")
    os.kill(other_worker, 9)
    deadline = time.monotonic() + 10
    # Until the parent reaps it the process is a zombie: already not a worker.
    while board.count().ready != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert board.count() == WorkerCount(ready=1, expected=2)


def test_ready_answers_for_every_worker(
    tmp_path: Path, other_worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = WorkerBoard.create(2, tmp_path)
    monkeypatch.setenv(BOARD_ENV, str(board.directory))
    other = WorkerBoard(board.directory, pid=other_worker)
    other.record("starting")
    app = on_board(create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer()))  # type: ignore[arg-type]
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while board.count().ready < 1 and time.monotonic() < deadline:  # this worker, recorded by its watcher
            time.sleep(0.01)
        ready = client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["status"] == "starting"  # this worker's engine is ready; the other's is not
        assert (ready.json()["workers_ready"], ready.json()["workers"]) == (1, 2)
        other.record("ready")
        wait_ready(client)
        assert client.get("/ready").json() | {"in_flight": 0} == {
            "status": "ready",
            "engine": "fake",
            "model_loaded": True,
            "in_flight": 0,
            "waiting": 0,
            "workers_ready": 2,
            "workers": 2,
        }


def test_one_worker_has_no_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BOARD_ENV, raising=False)
    app = on_board(create_app(make_settings(tmp_path), engine=FakeEngine(), phonemizer=FakePhonemizer()))  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        assert "workers" not in client.get("/ready").json()
