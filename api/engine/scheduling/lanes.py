"""Lane admission, pure like `next_batch`: which thread may start which call beside the calls running.

An engine with lanes (`LanedEngine`) runs up to `lanes` calls at once, one per lane thread. Where the lanes
share a pool of CPU threads, each call runs on its lane's share, and a call that starts with nothing running
and nothing else queued gets every thread and holds every lane. A request's first chunk does not wait for a
lane: when all are busy it starts at once beside them, on every thread, on a thread of its own that the OS
runs ahead of the lanes (api/engine/scheduling/niceness.py); one such call at a time. Where the threads are
pooled, a book's chunks run on threads of their own, one per lane, and start only while no request's call
runs or waits, and none has for BOOK_GRACE_S.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from api.engine.base import BatchPolicy
from api.engine.scheduling.batching import next_batch
from api.engine.scheduling.entries import BACKGROUND_PRIORITY, FIRST_CHUNK_PRIORITY, Entry

# The thread that runs a request's first chunk beside busy lanes, and the prefix of a book's threads.
URGENT = "engine-first-chunks"
BOOK_LANE = "engine-book-"
# A book's call starts only once no request's call has run or been queued for this long: a client that asks
# again at once (a conversation, a closed loop) does not find a book's call begun in between.
BOOK_GRACE_S = 0.5

# What a thread runs: a lane's calls, a first chunk beside busy lanes, or a book's chunks.
Role = Literal["lane", "urgent", "book"]


def role_of(thread: str) -> Role:
    """The role of the scheduler's thread named `thread`."""
    if thread == URGENT:
        return "urgent"
    return "book" if thread.startswith(BOOK_LANE) else "lane"


@dataclass(frozen=True)
class Call:
    """A batch a thread runs: `alone` on every thread, `urgent` a first chunk beside busy lanes,
    `background` a book's chunks."""

    batch: list[Entry]
    alone: bool
    urgent: bool
    background: bool = False


@dataclass(frozen=True)
class LaneUse:
    """What runs on the engine's lanes now: what admission decides from. A value; the scheduler replaces it
    under its lock as calls start (`started`) and end (`ended`)."""

    lanes: int = 1  # calls that may run at once
    pooled: bool = True  # whether the lanes share one pool of CPU threads (LanedEngine.pooled_threads)
    book_lanes: int = 0  # threads of their own for a book's chunks (pooled lanes only)
    running: int = 0  # calls in progress, a book's included
    background: int = 0  # of which calls of a book's chunks
    alone: bool = False  # whether a call in progress has every thread
    urgent: bool = False  # whether a first chunk runs beside full lanes
    request_seen: float = 0.0  # when a request's chunk was last queued or done (time.monotonic)

    @property
    def device_busy(self) -> bool:
        """Whether a call runs on a device of its own beside (not a share of pooled threads)."""
        return not self.pooled and self.running > 0

    @property
    def requests_running(self) -> int:
        """Calls that hold lanes: a book's on threads of their own hold none."""
        return self.running - (self.background if self.book_lanes else 0)

    def grace_left(self, now: float) -> float:
        return self.request_seen + BOOK_GRACE_S - now

    def started(self, call: Call) -> LaneUse:
        return dataclasses.replace(
            self,
            running=self.running + 1,
            background=self.background + int(call.background),
            alone=self.alone or call.alone,
            urgent=self.urgent or call.urgent,
        )

    def ended(self, call: Call, now: float) -> LaneUse:
        return dataclasses.replace(
            self,
            running=self.running - 1,
            background=self.background - int(call.background),
            alone=self.alone and not call.alone,
            urgent=self.urgent and not call.urgent,
            request_seen=self.request_seen if call.background else now,
        )


@dataclass(frozen=True)
class LaneDecision:
    """What a thread does next: run `call` (None: wait `wait` seconds, None until a call's end or a new
    entry notifies), and drop `skipped` either way."""

    call: Call | None
    skipped: list[Entry]
    wait: float | None


def next_call(
    queued: Sequence[Entry], now: float, policy: BatchPolicy, use: LaneUse, role: Role
) -> LaneDecision:
    """The call the thread of `role` starts now, if any: the batch `next_batch` forms of the entries that
    are its to run (a book's to its threads, the rest to the lanes, where a book has threads), when
    admission gives it room."""
    entries = queued
    if use.book_lanes:
        entries = [entry for entry in queued if (entry.priority == BACKGROUND_PRIORITY) == (role == "book")]
    decision = next_batch(entries, now, policy, busy=use.device_busy)
    if not decision.batch:
        return LaneDecision(call=None, skipped=decision.skipped, wait=decision.wait)
    room = admits_book(use, queued, now) if role == "book" else admits(use, decision.batch[0])
    if room == role:
        call = plan_call(use, decision.batch, entries, urgent=role == "urgent")
        return LaneDecision(call=call, skipped=decision.skipped, wait=None)
    grace = use.grace_left(now)
    wait = grace if role == "book" and grace > 0 else None
    return LaneDecision(call=None, skipped=decision.skipped, wait=wait)


def admits(use: LaneUse, head: Entry) -> Literal["lane", "urgent"] | None:
    """Whether a call led by `head` may start now: "lane" on a free lane, "urgent" for a first chunk
    beside busy lanes (or, without threads for a book's chunks, beside those only), None to wait. A
    call alone holds every lane; a book's chunks on their own threads hold none."""
    running = use.requests_running
    if running == 0:
        return "lane"
    if use.lanes == 1:
        return None
    first = head.priority == FIRST_CHUNK_PRIORITY and not use.urgent
    if first and not use.book_lanes and running == use.background:
        return "urgent"  # beside a book's chunks only: every thread, ahead of them, as with none
    busy = use.lanes if use.alone else running - int(use.urgent)
    if busy < use.lanes:
        return "lane"
    if first:
        return "urgent"
    return None


def admits_book(use: LaneUse, queued: Sequence[Entry], now: float) -> Literal["book"] | None:
    """Whether a book's chunk may start on a thread of its own: one per lane, and only while no request's
    call runs or waits and none has for BOOK_GRACE_S (one that starts later finds at most the ends of a
    book's calls)."""
    if use.background >= use.book_lanes or use.running > use.background:
        return None
    waiting = any(entry.priority != BACKGROUND_PRIORITY and not entry.cancelled for entry in queued)
    return None if waiting or use.grace_left(now) > 0 else "book"


def plan_call(use: LaneUse, batch: list[Entry], entries: Sequence[Entry], *, urgent: bool) -> Call:
    """The call `batch` makes when it starts beside what `use` runs, `entries` being what its thread saw."""
    background = batch[0].priority == BACKGROUND_PRIORITY
    # Alone where nothing else runs and nothing waits, or for a request's first chunk, where only later
    # chunks wait: they have playback time in hand, and wait for its few tokens on every thread rather
    # than halve its threads beside it (a live phrase's first audio: 0.45 s against 0.28 s at 1 client).
    first = batch[0].priority == FIRST_CHUNK_PRIORITY
    taken = set(batch)
    idle = use.requests_running == 0 and all(
        entry.cancelled or (first and entry.priority > FIRST_CHUNK_PRIORITY)
        for entry in entries
        if entry not in taken
    )
    # A book's chunks never take every thread: a chunk's audio then does not depend on what ran beside
    # it (its lane's thread count sets the order of its sums), so a job that resumes makes what an
    # uninterrupted one would have, bit for bit.
    alone = use.pooled and idle and not background
    return Call(batch, alone=alone, urgent=urgent, background=background)
