"""One engine call over a batch: each chunk's future resolved as soon as its audio exists, a failing batch
run again in halves until the failure rests on the chunks that fail alone."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from api.engine.base import ChunkAudio, Engine, EngineError, PrioritizedEngine, ReadyCallback
from api.engine.scheduling.batching import retry_halves
from api.engine.scheduling.entries import Entry, resolve

logger = logging.getLogger(__name__)


class BatchRunner:
    """Runs batches on `engine`, settling each entry's future; tells `count` of the chunks done and
    skipped, and `observe` of each call that succeeded (its batch size, wall and audio seconds)."""

    def __init__(
        self,
        engine: Engine,
        count: Callable[[int, int], None],
        observe: Callable[[int, float, float], None],
    ) -> None:
        self.engine = engine
        self._count = count
        self._observe = observe

    def run(self, batch: list[Entry]) -> None:
        started = time.perf_counter()
        delivered: set[int] = set()

        def ready(index: int, chunk: ChunkAudio) -> None:
            delivered.add(index)
            resolve(batch[index], audio=chunk)

        try:
            audio = self._synthesize(batch, ready)
        except Exception as exc:
            self._count(len(delivered), 0)
            rest = [entry for i, entry in enumerate(batch) if i not in delivered]
            if rest:
                self._retry_apart(rest, exc)
            return
        self._count(len(batch), 0)
        audio_s = sum(len(chunk.samples) for chunk in audio) / self.engine.sample_rate
        self._observe(len(batch), time.perf_counter() - started, audio_s)
        for index, (entry, chunk) in enumerate(zip(batch, audio, strict=True)):
            if index not in delivered:
                resolve(entry, audio=chunk)

    def _synthesize(self, batch: Sequence[Entry], ready: ReadyCallback) -> list[ChunkAudio]:
        items = [entry.item for entry in batch]
        if isinstance(self.engine, PrioritizedEngine):
            audio = self.engine.synthesize_prioritized(items, [entry.priority for entry in batch], ready)
        else:
            audio = self.engine.synthesize(items, ready)
        if len(audio) != len(batch):
            raise EngineError(f"the engine returned {len(audio)} results for {len(batch)} chunks")
        return audio

    def _retry_apart(self, batch: list[Entry], error: Exception) -> None:
        if len(batch) == 1:
            logger.error("synthesis failed for request %s", batch[0].request_id, exc_info=error)
            resolve(batch[0], error=error)
            return
        logger.warning(
            "a batch of %d chunks failed (%s: %s); running it in halves",
            len(batch),
            type(error).__name__,
            error,
        )
        halves, skipped = retry_halves(batch)
        self._count(0, len(skipped))
        for part in halves:
            self.run(part)
