"""Prometheus metrics, one set per app, aggregated across worker processes in multiprocess mode.

`python -m api` sets PROMETHEUS_MULTIPROC_DIR before the workers start; each worker then writes its
samples there and /metrics merges them. Without it (tests, a bare ASGI app) each app has its own registry.
A worker that dies (and is replaced by uvicorn) leaves its files there: its counters and histograms still
count, its live gauges must not (`forget_dead_processes`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


def pid_alive(pid: int) -> bool:
    """Whether a process of ours still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A worker killed but not yet reaped by the supervisor is a zombie: gone for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal check
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def forget_dead_processes(directory: Path) -> list[int]:
    """Drops the live gauges (in flight, waiting, queue depth) of the processes that have exited, as
    prometheus-client's `mark_process_dead` does; returns their pids. uvicorn replaces a dead worker
    without telling anyone, so this runs before each render: the dead worker's requests are not in flight."""
    pids = {int(path.stem.rsplit("_", 1)[-1]) for path in directory.glob("gauge_live*_*.db")}
    dead = sorted(pid for pid in pids if not pid_alive(pid))
    for pid in dead:
        with contextlib.suppress(FileNotFoundError):  # another worker's render removed it first
            prometheus_multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
    return dead


class Metrics:
    """Every metric the server exports; the admission controller, scheduler and middleware feed it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kokoro_requests_total", "Speech requests by HTTP status.", ["status"], registry=self.registry
        )
        self.in_flight = Gauge(
            "kokoro_requests_in_flight",
            "Speech requests in synthesis.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.waiting = Gauge(
            "kokoro_requests_waiting",
            "Speech requests waiting for a slot.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.requests_by_key = Counter(
            "kokoro_requests_by_key_total",
            "Speech requests by API key label (never the key) and HTTP status.",
            ["key", "status"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "kokoro_requests_rejected_total",
            "Requests refused with 503 by admission control.",
            registry=self.registry,
        )
        self.key_limited = Counter(
            "kokoro_requests_key_limited_total",
            "Requests refused with 429 by a key's own limits, by key label and reason (concurrency, rate).",
            ["key", "reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "kokoro_engine_queue_depth",
            "Chunks waiting for the engine.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.batch_size = Histogram(
            "kokoro_engine_batch_size",
            "Chunks per engine call.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.time_to_first_audio = Histogram(
            "kokoro_time_to_first_audio_seconds",
            "From request start to the first body byte.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "kokoro_request_latency_seconds",
            "From request start to the last body byte.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "kokoro_audio_seconds_total", "Seconds of audio synthesized.", registry=self.registry
        )
        self.real_time_factor = Histogram(
            "kokoro_real_time_factor",
            "Engine wall time / audio time, per engine call.",
            buckets=RTF_BUCKETS,
            registry=self.registry,
        )
        self.model_loaded = Gauge(
            "kokoro_model_loaded",
            "Whether the worker's model is loaded (1) or not: starting, unloaded while idle, reloading, "
            "failed; summed over the workers.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.model_unloads = Counter(
            "kokoro_model_unloads_total",
            "Models freed after KOKORO_IDLE_UNLOAD_S without work.",
            registry=self.registry,
        )
        self.model_reload_seconds = Histogram(
            "kokoro_model_reload_seconds",
            "Time to load a model again after an unload (its _count: the reloads).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.book_units = Counter(
            "kokoro_book_units",
            "Book jobs' units this replica made: `kept` (committed) or `not_kept` (the job was cancelled or "
            "the unit taken over meanwhile, so its work was thrown away). Over every replica, the kept "
            "units of a job equal its units: none is made twice.",
            ["outcome"],
            registry=self.registry,
        )
        self.book_units_waiting = Gauge(
            "kokoro_book_units_waiting",
            "Book jobs' units planned and not yet made, over every replica on the same jobs store (each "
            "replica reports the whole queue: take the max, not the sum).",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self._add_live_metrics()

    def _add_live_metrics(self) -> None:
        """The live socket's (api/live/session.py): sessions, utterances, first audio, errors."""
        self.live_sessions = Gauge(
            "kokoro_live_sessions_open",
            "Live sessions (WebSockets at /v1/audio/speech/live) open.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.live_sessions_total = Counter(
            "kokoro_live_sessions_total",
            "Live sessions by outcome: accepted, or refused (full, or the model not ready).",
            ["outcome"],
            registry=self.registry,
        )
        self.live_utterances = Counter(
            "kokoro_live_utterances_total",
            "Live utterances by how they ended: done (input_text.done), cleared (barge-in), closed (the "
            "socket went first), refused (no slot).",
            ["end"],
            registry=self.registry,
        )
        self.live_first_audio = Histogram(
            "kokoro_live_first_audio_seconds",
            "From the text that completes a live utterance's first phrase to its first audio sent.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.live_errors = Counter(
            "kokoro_live_errors_total",
            "Error events sent to live clients, by code.",
            ["code"],
            registry=self.registry,
        )

    def render(self) -> tuple[bytes, str]:
        if multiprocess_enabled():
            forget_dead_processes(Path(os.environ[MULTIPROC_ENV]))
            registry = CollectorRegistry()
            prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
