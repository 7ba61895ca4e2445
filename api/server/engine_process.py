"""The shared engine's process (`KOKORO_SHARED_ENGINE`, api/engine/shared.py): `python -m api` starts it with
`engine_process` beside its workers, and it runs `main`: the engine from the settings, one scheduler, and
`serve` answering every worker on a Unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from api.engine.compiled import KernelStores
from api.engine.scheduling.scheduler import Scheduler
from api.engine.shared import serve_until_stopped
from api.engine.torch_engine import SHARED_GPU_LANES
from api.metrics import Metrics
from api.server.app import batch_overrides, build_engine, resolve_engine
from api.server.engine_metrics import SchedulerMetrics
from api.server.logs import configure_logging
from api.settings import get_settings
from api.weights import ensure_weights

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m api.server.engine_process SOCKET`: the engine process (settings from the environment)."""
    (path,) = argv if argv is not None else sys.argv[1:]
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    settings = resolve_engine(settings)
    stores = KernelStores(background=settings.compile_in_background)
    engine = build_engine(settings, gpu_lanes=SHARED_GPU_LANES, kernel_stores=stores)

    def prepare() -> None:
        ensure_weights(settings)
        engine.load()

    # Each worker bounds its own queue; this one holds what they hand over.
    # Its batches are counted in the workers' /metrics (prometheus-client's multiprocess directory, which
    # `python -m api` sets before starting this process).
    scheduler = Scheduler(
        engine,
        max_queued=1_000_000,
        prepare=prepare,
        observer=SchedulerMetrics(Metrics()),
        overrides=batch_overrides(settings),
    )

    serve_until_stopped(scheduler, Path(path))


class EngineProcess:
    """The running engine process: its socket, and its exit status once it has died on its own."""

    def __init__(self, path: Path, process: subprocess.Popen[bytes]) -> None:
        self.path = path
        self.process = process
        self.died: int | None = None  # the exit status, when it exited without being asked to
        self.stopping = threading.Event()


@contextlib.contextmanager
def engine_process(
    on_death: Callable[[int], None], env: Mapping[str, str] | None = None
) -> Iterator[EngineProcess]:
    """Start the engine process (the workers find its socket in SOCKET_ENV). Should it die on its own, every
    worker's requests would fail: `on_death(status)` is called then (the launcher stops the server, so that
    whatever supervises it starts a new one)."""
    directory = Path(tempfile.mkdtemp(prefix="kokoro-engine-"))
    process = subprocess.Popen(
        [sys.executable, "-m", "api.server.engine_process", str(directory / "engine.sock")],
        env=dict(env or os.environ),
    )
    engine = EngineProcess(directory / "engine.sock", process)

    def watch() -> None:
        status = process.wait()
        if not engine.stopping.is_set():
            engine.died = status
            logger.error("the shared engine process exited with status %s: stopping the server", status)
            on_death(status)

    threading.Thread(target=watch, name="engine-watch", daemon=True).start()
    try:
        yield engine
    finally:
        engine.stopping.set()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
