"""The engine thread: a bounded queue of chunk entries, one engine call at a time, results to futures."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from api.engine.base import Engine, SynthesisItem
from api.metrics import Metrics

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More chunks are waiting for the engine than the configured bound allows."""


class EngineState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass
class Entry:
    """One chunk waiting for the engine, with the future its request awaits."""

    item: SynthesisItem
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    request_id: str
    enqueued_at: float = field(default_factory=time.monotonic)

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()


class Scheduler:
    """Owns the engine and its thread: prepares (loads) the engine there, then runs queued entries.

    The asyncio side only calls `submit`, which never blocks; entries whose request has gone
    (future cancelled) are skipped.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued: int,
        prepare: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.engine = engine
        self.max_queued = max_queued
        self._prepare = prepare or engine.load
        self._metrics = metrics
        self._queue: queue.Queue[Entry | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.state = EngineState.STARTING
        self.failure: str | None = None
        self.chunks_done = 0
        self.chunks_skipped = 0

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.state = EngineState.STOPPED

    def submit(self, item: SynthesisItem, request_id: str) -> asyncio.Future[np.ndarray]:
        if self._queue.qsize() >= self.max_queued:
            raise QueueFullError(f"{self._queue.qsize()} chunks already queued")
        loop = asyncio.get_running_loop()
        entry = Entry(item=item, future=loop.create_future(), loop=loop, request_id=request_id)
        self._queue.put(entry)
        self._observe_queue()
        return entry.future

    def _run(self) -> None:
        if not self._load():
            self._fail_queued()
            return
        while (entry := self._queue.get()) is not None:
            self._observe_queue()
            if entry.cancelled:
                self.chunks_skipped += 1
                continue
            self._execute(entry)

    def _load(self) -> bool:
        started = time.monotonic()
        try:
            self._prepare()
        except Exception as exc:
            logger.exception("engine %s failed to load", self.engine.name)
            self.failure = f"{type(exc).__name__}: {exc}"
            self.state = EngineState.FAILED
            return False
        logger.info("engine %s ready in %.1f s", self.engine.name, time.monotonic() - started)
        self.state = EngineState.READY
        return True

    def _execute(self, entry: Entry) -> None:
        started = time.perf_counter()
        try:
            audio = self.engine.synthesize([entry.item])[0]
        except Exception as exc:
            logger.exception("synthesis failed for request %s", entry.request_id)
            _resolve(entry, error=exc)
            return
        self.chunks_done += 1
        self._observe_call(1, time.perf_counter() - started, len(audio) / self.engine.sample_rate)
        _resolve(entry, audio=audio)

    def _observe_queue(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(self._queue.qsize())

    def _observe_call(self, batch_size: int, wall_s: float, audio_s: float) -> None:
        if self._metrics is None:
            return
        self._metrics.batch_size.observe(batch_size)
        self._metrics.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self._metrics.real_time_factor.observe(wall_s / audio_s)

    def _fail_queued(self) -> None:
        while (entry := self._queue.get()) is not None:
            _resolve(entry, error=RuntimeError(f"engine failed to load: {self.failure}"))


def _resolve(entry: Entry, *, audio: np.ndarray | None = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if entry.future.done():
            return
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(audio)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        entry.loop.call_soon_threadsafe(settle)
