"""Which of a multi-worker server's workers are ready, known to every one of them.

uvicorn's workers share one socket, so a request to `/ready` reaches one worker at random and that worker
alone knows its own engine's state. `python -m api --workers N` therefore makes a directory (the board)
and names it to its workers; each worker writes its engine's state there in a file named by its pid, and
`/ready` in any worker counts the live workers whose file says ready against the N expected. A worker that
dies leaves its file behind; it no longer counts once its pid has gone.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from api.metrics import pid_alive

if TYPE_CHECKING:
    from fastapi import FastAPI

BOARD_ENV = "KOKORO_WORKER_BOARD"
EXPECTED_FILE = "expected"
READY = "ready"
WATCH_INTERVAL_S = 0.25


@dataclass(frozen=True)
class WorkerCount:
    ready: int
    expected: int

    @property
    def all_ready(self) -> bool:
        return self.ready >= self.expected


class WorkerBoard:
    """A directory with one file per worker process (its engine's state) and the number of workers the
    server runs. Workers `record` their own state; any worker can `count` the ready ones."""

    def __init__(self, directory: Path, pid: int | None = None) -> None:
        self.directory = directory
        self.pid = pid or os.getpid()

    @classmethod
    def create(cls, workers: int, parent: Path | None = None) -> WorkerBoard:
        board = cls(Path(tempfile.mkdtemp(prefix="kokoro-workers-", dir=parent)))
        (board.directory / EXPECTED_FILE).write_text(str(workers))
        return board

    @classmethod
    def from_env(cls) -> WorkerBoard | None:
        directory = os.environ.get(BOARD_ENV)
        return cls(Path(directory)) if directory else None

    def record(self, state: str) -> None:
        # Written aside and renamed: a reader never sees half a file.
        path = self.directory / f"worker-{self.pid}"
        partial = path.with_suffix(".partial")
        partial.write_text(state)
        partial.replace(path)

    def count(self) -> WorkerCount:
        expected = int((self.directory / EXPECTED_FILE).read_text())
        ready = 0
        for path in self.directory.glob("worker-*"):
            if path.suffix == ".partial" or not pid_alive(int(path.name.removeprefix("worker-"))):
                continue
            ready += _read(path) == READY
        return WorkerCount(ready=ready, expected=expected)

    def watch(self, state: Callable[[], str]) -> threading.Thread:
        """Records `state()` now and whenever it changes, from a daemon thread, for the process's life."""

        def run() -> None:
            recorded = None
            stop = threading.Event()
            while not stop.wait(0 if recorded is None else WATCH_INTERVAL_S):
                current = state()
                if current != recorded:
                    self.record(current)
                    recorded = current

        thread = threading.Thread(target=run, name="worker-board", daemon=True)
        thread.start()
        return thread


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def on_board(app: FastAPI) -> FastAPI:
    """Puts `app`'s engine state on the board that `python -m api` named, if any (one worker of several)."""
    board = WorkerBoard.from_env()
    if board is not None:
        scheduler = app.state.speech.scheduler
        # Unloaded while idle still serves (the next request loads the model again): ready on the board.
        board.watch(lambda: READY if scheduler.serves else str(scheduler.state.value))
    app.state.workers = board
    return app
