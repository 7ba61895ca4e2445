"""The queue's entries: one chunk waiting for the engine, its priority, and the future its request awaits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from api.engine.base import ChunkAudio, SynthesisItem

# Lower runs first: a request's first chunk decides its time to first audio, so it goes ahead of the
# later chunks of requests that are already playing.
FIRST_CHUNK_PRIORITY = 0
LATER_CHUNK_PRIORITY = 1
# A book job's chunks (api/books): they run where no request's chunk waits, and never in a batch with one,
# whose time to first audio or playback they would otherwise stretch; and always on a lane's share of the
# threads (api/engine/scheduling/lanes.py).
BACKGROUND_PRIORITY = 2


class QueueFullError(RuntimeError):
    """More chunks are waiting for the engine than the configured bound allows."""


# eq=False: entries are compared by identity (their items hold numpy arrays) and can go in sets.
@dataclass(eq=False)
class Entry:
    """One chunk waiting for the engine, with the future its request awaits."""

    item: SynthesisItem
    future: asyncio.Future[ChunkAudio]
    loop: asyncio.AbstractEventLoop
    request_id: str
    enqueued_at: float = field(default_factory=time.monotonic)
    priority: int = LATER_CHUNK_PRIORITY

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()

    @property
    def cost(self) -> float:
        # The model predicts frames in proportion to tokens / speed: the padded length in a batch.
        return len(self.item.tokens) / self.item.speed


def run_order(entry: Entry) -> tuple[int, float]:
    return entry.priority, entry.enqueued_at


def resolve(entry: Entry, *, audio: ChunkAudio | None = None, error: BaseException | None = None) -> None:
    """Settle the entry's future on its own loop, from any thread; a future already done stays as it is."""

    def settle() -> None:
        if entry.future.done():
            return
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(audio)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        entry.loop.call_soon_threadsafe(settle)
