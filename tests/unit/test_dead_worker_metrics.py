"""A dead process's live gauges leave the multiprocess metrics; its counters stay."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector

from api.metrics import MULTIPROC_ENV, forget_dead_processes

# A process that counts one request, leaves it in flight, one waiting, two chunks queued, and exits.
WORKER = """
from api.metrics import Metrics
metrics = Metrics()
metrics.requests.labels(status="200").inc()
metrics.in_flight.inc()
metrics.waiting.inc()
metrics.queue_depth.inc(2)
"""


def samples(directory: Path) -> dict[str, float]:
    merged = MultiProcessCollector.merge([str(path) for path in directory.glob("*.db")])  # type: ignore[no-untyped-call]
    return {sample.name: sample.value for metric in merged for sample in metric.samples}


def run_worker(directory: Path) -> int:
    """Runs WORKER to its end; its pid, read from the file it left."""
    subprocess.run(
        [sys.executable, "-c", WORKER], env={**os.environ, MULTIPROC_ENV: str(directory)}, check=True
    )
    (path,) = directory.glob("gauge_livesum_*.db")
    return int(path.stem.rsplit("_", 1)[-1])


def test_a_dead_process_leaves_its_counters_and_drops_its_live_gauges(tmp_path: Path) -> None:
    dead = run_worker(tmp_path)
    # The same gauges under this (live) test process's pid: they must stay.
    shutil.copy(tmp_path / f"gauge_livesum_{dead}.db", tmp_path / f"gauge_livesum_{os.getpid()}.db")
    before = samples(tmp_path)
    assert before["kokoro_requests_in_flight"] == 2
    assert before["kokoro_engine_queue_depth"] == 4

    assert forget_dead_processes(tmp_path) == [dead]

    after = samples(tmp_path)
    assert after["kokoro_requests_in_flight"] == 1
    assert after["kokoro_requests_waiting"] == 1
    assert after["kokoro_engine_queue_depth"] == 2
    assert after["kokoro_requests_total"] == 1  # what the dead worker served still counts
    assert forget_dead_processes(tmp_path) == []
