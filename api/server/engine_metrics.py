"""The scheduler's reports (api/engine/scheduling/observer.py) recorded into the Prometheus metrics."""

from __future__ import annotations

from api.metrics import Metrics


class SchedulerMetrics:
    """A `SchedulerObserver` that records into `metrics`: the queue's depth, each call's batch size, audio
    seconds and real-time factor (unless `count_calls` is False: a remote engine's proxy, whose calls are
    handovers, while the engine process counts the batches), the model's loads, reloads and unloads."""

    def __init__(self, metrics: Metrics, *, count_calls: bool = True) -> None:
        self.metrics = metrics
        self.count_calls = count_calls

    def queue_changed(self, depth: int) -> None:
        self.metrics.queue_depth.set(depth)

    def call_done(self, batch_size: int, wall_s: float, audio_s: float) -> None:
        if not self.count_calls:
            return
        self.metrics.batch_size.observe(batch_size)
        self.metrics.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self.metrics.real_time_factor.observe(wall_s / audio_s)

    def model_loaded(self, seconds: float, *, reload: bool) -> None:
        self.metrics.model_loaded.set(1)
        if reload:
            self.metrics.model_reload_seconds.observe(seconds)

    def model_unloaded(self) -> None:
        self.metrics.model_loaded.set(0)
        self.metrics.model_unloads.inc()
