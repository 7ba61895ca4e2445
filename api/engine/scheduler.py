"""The engine thread: a bounded queue of chunk entries, grouped into batches, results to futures."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from api.engine.base import (
    BatchPolicy,
    ChunkAudio,
    ChunkRun,
    Engine,
    EngineError,
    LanedEngine,
    PrioritizedEngine,
    ReadyCallback,
    SteppedEngine,
    SynthesisItem,
)
from api.engine.memory import free_model_memory
from api.metrics import Metrics

logger = logging.getLogger(__name__)

# Lower runs first: a request's first chunk decides its time to first audio, so it goes ahead of the
# later chunks of requests that are already playing.
FIRST_CHUNK_PRIORITY = 0
LATER_CHUNK_PRIORITY = 1
# A book job's chunks (api/books): they run where no request's chunk waits, and never in a batch with one,
# whose time to first audio or playback they would otherwise stretch; and always on a lane's share of the
# threads (see `_take_batch`).
BACKGROUND_PRIORITY = 2
# With several lanes, their threads run this much nicer than the process, and a first chunk that starts
# beside busy lanes runs on a thread of the process's own niceness: the OS gives it the cores, and the
# lanes' calls go on when it is done (a thread may raise its niceness but not lower it again, hence a thread
# of its own). Measured: first audio p50 2.36 s with the first chunk on a lane's share, 1.35 s this way.
LANE_NICENESS = 10
URGENT = "engine-first-chunks"
# Where the engine's threads are pooled (the torch engine on a CPU), a book's chunks run on threads of their
# own, one per lane, under Linux's SCHED_IDLE, and start only while no request's call runs or waits: the OS
# gives the cores to a request's call that starts beside a book's, and no new one starts until the requests
# are done. With SCHED_IDLE alone, a request's first audio at 1 client came 1.33x later with a book running
# than without, and at niceness 19 alone 1.52x (docs/journal/books.md, entry 48).
BOOK_LANE = "engine-book-"
BOOK_NICENESS = 19  # where SCHED_IDLE is not to be had
# ... and only once no request's call has run or been queued for this long: a client that asks again at once
# (a conversation, a closed loop) does not find a book's call begun in between.
BOOK_GRACE_S = 0.5


class QueueFullError(RuntimeError):
    """More chunks are waiting for the engine than the configured bound allows."""


class EngineState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    UNLOADED = "unloaded"  # the model was freed while idle; the next request loads it again
    RELOADING = "reloading"
    FAILED = "failed"
    STOPPED = "stopped"


# A worker in these states serves requests (an unloaded one after loading its model again): /ready says so.
SERVING_STATES = frozenset({EngineState.READY, EngineState.UNLOADED, EngineState.RELOADING})


class UnloadedEngine:
    """What the scheduler shows of an engine whose model it has freed: its name, vocabulary and abilities,
    so that the routes answer as before; nothing to synthesize with until a new engine is loaded."""

    def __init__(self, engine: Engine) -> None:
        self.name = engine.name
        self.sample_rate = engine.sample_rate
        self.vocab: Mapping[str, int] = dict(engine.vocab)
        self.gives_durations = engine.gives_durations
        self.batch_defaults = engine.batch_defaults

    def load(self) -> None:
        raise EngineError("an unloaded engine is replaced by a new one, not loaded again")

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        raise EngineError("the model is unloaded")


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


@dataclass(frozen=True)
class BatchDecision:
    """What the engine thread does next: run `batch` now (when not empty), drop `skipped`, and when
    nothing runs, wait `wait` seconds (None: until a new entry arrives) before asking again."""

    batch: list[Entry]
    skipped: list[Entry]
    wait: float | None


@dataclass(frozen=True)
class BatchOverrides:
    """Operator settings over the engine's batching defaults; None keeps the engine's value."""

    max_batch_size: int | None = None
    batch_timeout: float | None = None
    max_batch_tokens: int | None = None
    launch_tokens: int | None = None


def effective_policy(defaults: BatchPolicy, overrides: BatchOverrides) -> BatchPolicy:
    changes = {name: value for name, value in dataclasses.asdict(overrides).items() if value is not None}
    return dataclasses.replace(defaults, **changes)


def next_batch(
    entries: Sequence[Entry], now: float, policy: BatchPolicy, *, busy: bool = False
) -> BatchDecision:
    """Decide the next engine call from the queue and the clock; pure, so tests pass a fake clock.

    Candidates (entries not cancelled) run in (priority, enqueued_at) order. The head always joins the
    batch; each later candidate joins while the batch stays within the policy's length ratio and token
    budget, so a lone oversize chunk still runs; then, whatever the ratio, later candidates top the batch
    up to the policy's launch tokens. The batch runs when full, or once the oldest candidate
    has waited `batch_timeout` (not only the head: a fresh first chunk must not hold back overdue
    ones); a timeout of 0 runs whatever is queued at once. `busy`: a call is running beside, on the same
    device; then the policy's `busy_timeout` applies instead, unless a request's first chunk leads.
    """
    skipped = [entry for entry in entries if entry.cancelled]
    candidates = sorted((entry for entry in entries if not entry.cancelled), key=_run_order)
    if not candidates:
        return BatchDecision(batch=[], skipped=skipped, wait=None)
    batch = _fill(candidates, policy)
    timeout = policy.batch_timeout
    if busy and batch[0].priority != FIRST_CHUNK_PRIORITY:
        timeout = max(timeout, policy.busy_timeout)
    due = min(entry.enqueued_at for entry in candidates) + timeout
    if len(batch) >= policy.max_batch_size or now >= due:
        return BatchDecision(batch=batch, skipped=skipped, wait=None)
    return BatchDecision(batch=[], skipped=skipped, wait=due - now)


@dataclass(frozen=True)
class StepDecision:
    """What the engine thread of a stepped engine does next: advance `entry` by one step (None: wait for
    work), taking it from the queue first when `started`; forget `dropped`, whose requests have gone."""

    entry: Entry | None
    started: bool
    dropped: list[Entry]


def next_step(active: Sequence[Entry], queued: Sequence[Entry]) -> StepDecision:
    """The most urgent live chunk in (priority, enqueued_at) order, among those already begun (`active`)
    and those waiting; pure. A waiting chunk begins only when it is more urgent than every begun one, so
    a first chunk pauses a long later chunk, and later chunks still finish in the order they came."""
    dropped = [entry for entry in (*active, *queued) if entry.cancelled]
    best_active = min((entry for entry in active if not entry.cancelled), key=_run_order, default=None)
    best_queued = min((entry for entry in queued if not entry.cancelled), key=_run_order, default=None)
    if best_queued is not None and (best_active is None or _run_order(best_queued) < _run_order(best_active)):
        return StepDecision(entry=best_queued, started=True, dropped=dropped)
    return StepDecision(entry=best_active, started=False, dropped=dropped)


def _run_order(entry: Entry) -> tuple[int, float]:
    return entry.priority, entry.enqueued_at


def _fill(candidates: Sequence[Entry], policy: BatchPolicy) -> list[Entry]:
    if candidates[0].priority != BACKGROUND_PRIORITY:
        candidates = [entry for entry in candidates if entry.priority != BACKGROUND_PRIORITY]
    batch = [candidates[0]]
    low = high = candidates[0].cost
    for entry in candidates[1:]:
        if len(batch) == policy.max_batch_size:
            break
        new_low, new_high = min(low, entry.cost), max(high, entry.cost)
        within_ratio = new_high <= policy.length_ratio * new_low
        if within_ratio and (len(batch) + 1) * new_high <= policy.max_batch_tokens:
            batch.append(entry)
            low, high = new_low, new_high
    # Below the launch's worth of device time, padding costs nothing: top up in run order, whatever the ratio.
    budget = min(policy.launch_tokens, policy.max_batch_tokens)
    taken = set(batch)
    for entry in candidates[1:]:
        if len(batch) == policy.max_batch_size or len(batch) * high >= budget:
            break
        if entry not in taken and (len(batch) + 1) * max(high, entry.cost) <= budget:
            batch.append(entry)
            high = max(high, entry.cost)
    return batch


class Scheduler:
    """Owns the engine and its thread: prepares (loads) the engine there, then runs batches of entries.

    The asyncio side only calls `submit`, which holds the lock briefly and never waits on the engine.
    The engine thread settles the batching policy once the engine has loaded (the engine's defaults
    for its device, under the operator's overrides), asks `next_batch` what to run, drops entries whose
    request has gone (future cancelled), and splits a failing batch in halves until the failure rests
    on the chunks that fail alone. After a load failure or `stop`, every entry fails at once.

    An engine with lanes (`LanedEngine`) gets one thread per lane, and one more: up to `lanes` calls run at
    once. Where the lanes share a pool of CPU threads, each call runs on its lane's share, and a call that
    starts with nothing running and nothing else queued gets every thread and holds every lane. A request's
    first chunk does not wait for a lane: when all are busy it starts at once beside them, on every thread,
    on the one more thread, which the OS runs ahead of the lanes (LANE_NICENESS); one such call at a time
    (see `_admits`).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued: int,
        prepare: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
        policy: BatchPolicy | None = None,
        overrides: BatchOverrides | None = None,
        observe_calls: bool = True,
        rebuild: Callable[[], Engine] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.engine = engine
        self.max_queued = max_queued
        # Not `engine.load` itself: a bound method would keep the first engine alive after an unload.
        self._prepare = prepare or self._load_engine
        self._metrics = metrics
        # False for a remote engine's proxy: its calls are handovers, and the engine process counts batches.
        self._observe_calls = observe_calls
        self._base_policy = policy
        self._overrides = overrides or BatchOverrides()
        self._entries: list[Entry] = []
        self._condition = threading.Condition()
        self._refusal: str | None = None  # why new work fails at once: a load failure, or stop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._lane_threads: list[threading.Thread] = []
        self._running = 0  # engine calls in progress
        self._background = 0  # of which calls of a book's chunks
        self._book_lanes = 0  # threads of their own for a book's chunks (pooled lanes only)
        self._request_seen = 0.0  # when a request's chunk was last queued or done (time.monotonic)
        self._alone = False  # whether a call in progress has every thread
        self._urgent = False  # whether a first chunk runs beside full lanes
        self.lanes = 1  # calls that may run at once, known once the engine has loaded
        self._pooled = True  # whether the lanes share one pool of CPU threads (LanedEngine.pooled_threads)
        self.state = EngineState.STARTING
        self.stage = "starting"  # what the start is doing, in words (set by `prepare`; /ready shows it)
        self.failure: str | None = None
        self.policy: BatchPolicy | None = None  # the effective policy, known once the engine has loaded
        self.chunks_done = 0
        self.chunks_skipped = 0
        # Idle unload: `rebuild` makes a new, unloaded engine of the same kind (None: this one is never
        # unloaded); `unload()` asks for it, and the engine thread commits once nothing is queued or running.
        self._rebuild = rebuild
        self._clock = clock
        self.last_active = clock()  # the last submit, call end or `touch`
        self._unload_wanted = False
        self._unloading = False  # committed: the lanes end, the engine thread frees the model
        self._reload_wanted = False
        self.unloads = 0
        self.reloads = 0
        self._engine_thread_niced = False

    @property
    def queued(self) -> int:
        return len(self._entries)

    @property
    def serves(self) -> bool:
        """Whether this worker takes requests: its model is loaded, or will be at the next request."""
        return self.state in SERVING_STATES

    @property
    def can_unload(self) -> bool:
        return self._rebuild is not None

    def touch(self) -> None:
        """A request is about to use the engine: the idle clock starts again."""
        self.last_active = self._clock()

    def idle_s(self) -> float:
        """Seconds since the engine last had work; 0 while a chunk is queued or running."""
        with self._condition:
            if self._entries or self._running:
                return 0.0
            return self._clock() - self.last_active

    def unload(self) -> bool:
        """Free the model once nothing is queued or running (the engine thread does it); the next request,
        or `reload()`, loads a new one. False where this engine cannot be unloaded or is not loaded."""
        if self._rebuild is None or self.state is not EngineState.READY:
            return False
        with self._condition:
            self._unload_wanted = True
            self._condition.notify_all()
        return True

    def reload(self) -> None:
        """Load the model again if it was unloaded (on the engine thread; returns at once)."""
        with self._condition:
            self._reload_wanted = True
            self._unload_wanted = False
            self._condition.notify_all()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._refuse("the engine has stopped")
        deadline = time.monotonic() + timeout
        for thread in (self._thread, *self._lane_threads):
            if thread.is_alive():
                thread.join(max(deadline - time.monotonic(), 0.0))
        self.state = EngineState.STOPPED

    def submit(
        self, item: SynthesisItem, request_id: str, *, priority: int = LATER_CHUNK_PRIORITY
    ) -> asyncio.Future[ChunkAudio]:
        loop = asyncio.get_running_loop()
        entry = Entry(
            item=item, future=loop.create_future(), loop=loop, request_id=request_id, priority=priority
        )
        with self._condition:
            if self._refusal is not None:
                entry.future.set_exception(RuntimeError(self._refusal))
                return entry.future
            if len(self._entries) >= self.max_queued:
                raise QueueFullError(f"{len(self._entries)} chunks already queued")
            self._unload_wanted = False
            self.last_active = self._clock()
            if priority != BACKGROUND_PRIORITY:
                self._request_seen = time.monotonic()
            self._entries.append(entry)
            self._observe_queue()
            self._condition.notify_all()  # every idle lane: the one that wakes may be held back
        return entry.future

    def drop_cancelled(self) -> int:
        """Take the chunks whose requests are gone out of the queue now, rather than when the engine next
        looks (a live client's barge-in frees its place at once); returns how many."""
        with self._condition:
            gone = [entry for entry in self._entries if entry.cancelled]
            self._remove(gone)
            self.chunks_skipped += len(gone)
        return len(gone)

    def _run(self) -> None:
        """Load, serve until stopped or until an unload is committed; then free the model, wait for
        demand, load a new engine and serve again."""
        prepare = self._prepare
        while True:
            policy = self._load(prepare)
            if policy is None:
                self._refuse(f"engine failed to load: {self.failure}")
                return
            self._serve(policy)
            if self._refusal is not None:
                return
            self._unload()
            if not self._await_demand():
                return
            prepare = self._load_new_engine

    def _serve(self, policy: BatchPolicy) -> None:
        if isinstance(self.engine, SteppedEngine) and policy.max_batch_size == 1:
            self._run_stepped(self.engine)
            return
        laned = self.engine if isinstance(self.engine, LanedEngine) else None
        self.lanes = 1 if laned is None else max(1, laned.lanes)
        self._pooled = laned is None or laned.pooled_threads
        roles = [f"engine-{lane}" for lane in range(1, self.lanes)]
        if self.lanes > 1:
            roles.append(URGENT)
        self._book_lanes = self.lanes if laned is not None and self._pooled else 0
        roles += [f"{BOOK_LANE}{lane}" for lane in range(self._book_lanes)]
        for role in roles:
            thread = threading.Thread(
                target=self._run_lane, args=(policy, laned, role), name=role, daemon=True
            )
            self._lane_threads.append(thread)
            thread.start()
        self._run_lane(policy, laned, "engine-0")
        for thread in self._lane_threads:
            thread.join()
        self._lane_threads = []

    def _unload(self) -> None:
        """Replace the engine by its unloaded stand-in and give the model's memory back (the lanes have
        ended: nothing else holds the engine)."""
        idle = self._clock() - self.last_active
        self.engine = UnloadedEngine(self.engine)
        free_model_memory()
        self.state = EngineState.UNLOADED
        self.unloads += 1
        if self._metrics is not None:
            self._metrics.model_loaded.set(0)
            self._metrics.model_unloads.inc()
        logger.info("engine %s unloaded after %.1f s without work", self.engine.name, idle)

    def _await_demand(self) -> bool:
        """Until a chunk is queued or a reload is asked for (True), or work is refused (False)."""
        with self._condition:
            while self._refusal is None and not self._entries and not self._reload_wanted:
                self._condition.wait()
            if self._refusal is not None:
                return False
            self._reload_wanted = self._unload_wanted = self._unloading = False
        self.state = EngineState.RELOADING
        return True

    def _load_engine(self) -> None:
        self.engine.load()

    def _load_new_engine(self) -> None:
        assert self._rebuild is not None
        engine = self._rebuild()
        engine.load()
        self.engine = engine
        self.reloads += 1

    def _run_lane(self, policy: BatchPolicy, laned: LanedEngine | None, role: str) -> None:
        """Run calls on this thread: a lane's (LANE_NICENESS steps nicer when there are several) or, as
        URGENT, the first chunks that start beside busy lanes, on every thread and at the process's own
        priority, so that the OS runs them ahead of the lanes' calls."""
        # The engine thread runs lane 0 again after each reload: its niceness is raised once.
        niced = role == "engine-0" and self._engine_thread_niced
        book = role.startswith(BOOK_LANE)
        if book:
            run_when_idle()
        elif role != URGENT and self.lanes > 1 and self._pooled and not niced:
            lower_priority(LANE_NICENESS)
            self._engine_thread_niced = self._engine_thread_niced or role == "engine-0"
        while (call := self._take_batch(policy, urgent=role == URGENT, book=book)) is not None:
            try:
                if laned is not None:
                    laned.claim_threads(call.alone or call.urgent)
                self._execute(call.batch)
            finally:
                with self._condition:
                    self._running -= 1
                    self._background -= int(call.background)
                    if not call.background:
                        self._request_seen = time.monotonic()
                    self.last_active = self._clock()
                    self._alone = self._alone and not call.alone
                    self._urgent = self._urgent and not call.urgent
                    self._condition.notify_all()

    def _run_stepped(self, engine: SteppedEngine) -> None:
        """One step of the most urgent chunk at a time (see `next_step`), until work is refused."""
        active: dict[Entry, _Begun] = {}
        while (decision := self._take_step(active)) is not None:
            entry = decision.entry
            assert entry is not None
            started = time.perf_counter()
            try:
                if decision.started:
                    active[entry] = _Begun(engine.start(entry.item))
                audio = active[entry].run.step()
            except Exception as exc:
                active.pop(entry, None)
                logger.error("synthesis failed for request %s", entry.request_id, exc_info=exc)
                _resolve(entry, error=exc)
                continue
            begun = active[entry]
            begun.seconds += time.perf_counter() - started
            self.last_active = self._clock()
            if audio is not None:
                del active[entry]
                self.chunks_done += 1
                self._observe_call(1, begun.seconds, len(audio.samples) / self.engine.sample_rate)
                _resolve(entry, audio=audio)

    def _take_step(self, active: dict[Entry, _Begun]) -> StepDecision | None:
        """The next step to run, waiting for work as long as it takes; None once refusing work (the
        chunks already begun then fail too)."""
        with self._condition:
            while self._refusal is None and not self._unloading:
                decision = next_step(list(active), self._entries)
                for entry in decision.dropped:
                    active.pop(entry, None)
                self.chunks_skipped += len(decision.dropped)
                self._remove(decision.dropped)
                if decision.entry is not None:
                    if decision.started:
                        self._remove([decision.entry])
                    return decision
                if not active and self._commit_unload():
                    return None
                self._condition.wait()
            if self._refusal is None:
                return None  # unloading, with nothing begun
            for entry in active:
                _resolve(entry, error=RuntimeError(self._refusal))
            return None

    def _load(self, prepare: Callable[[], None]) -> BatchPolicy | None:
        started = time.monotonic()
        reloading = self.state is EngineState.RELOADING
        try:
            prepare()
            policy = effective_policy(self._base_policy or self.engine.batch_defaults, self._overrides)
        except Exception as exc:
            logger.exception("engine %s failed to load", self.engine.name)
            self.failure = f"{type(exc).__name__}: {exc}"
            self.state = EngineState.FAILED
            return None
        seconds = time.monotonic() - started
        logger.info("engine %s ready in %.1f s; batching: %s", self.engine.name, seconds, policy)
        self.policy = policy
        self.last_active = self._clock()
        self.stage = "ready"
        self.state = EngineState.READY
        if self._metrics is not None:
            self._metrics.model_loaded.set(1)
            if reloading:
                self._metrics.model_reload_seconds.observe(seconds)
        return policy

    def _take_batch(self, policy: BatchPolicy, *, urgent: bool = False, book: bool = False) -> _Call | None:
        """The next call for a lane (or, `urgent`, for the thread of first chunks beside busy lanes; `book`,
        for a thread of a book's chunks), waiting for a batch and for room to run it as long as it takes;
        None once refusing work."""
        with self._condition:
            while self._refusal is None and not self._unloading:
                busy = not self._pooled and self._running > 0
                entries = self._entries
                if self._book_lanes:  # a book's chunks to its threads, the rest to the lanes
                    entries = [entry for entry in entries if (entry.priority == BACKGROUND_PRIORITY) == book]
                decision = next_batch(entries, time.monotonic(), policy, busy=busy)
                self._remove(decision.skipped)
                self.chunks_skipped += len(decision.skipped)
                if not decision.batch and self._commit_unload():
                    return None
                room = None
                if decision.batch:
                    room = self._admits_book() if book else self._admits(decision.batch[0])
                wanted = "book" if book else "urgent" if urgent else "lane"
                if room == wanted:
                    return self._start(decision.batch, entries, urgent=urgent)
                timeout = None if decision.batch else decision.wait
                if book and decision.batch and self._book_grace_left() > 0:
                    timeout = self._book_grace_left()
                self._condition.wait(timeout)  # a call's end notifies
            return None

    def _start(self, batch: list[Entry], entries: Sequence[Entry], *, urgent: bool) -> _Call:
        """Under the lock: `batch` taken from the queue and counted as running."""
        self._remove(batch)
        self._running += 1
        background = batch[0].priority == BACKGROUND_PRIORITY
        self._background += int(background)
        others = self._running - 1 - (self._background - int(background) if self._book_lanes else 0)
        # Alone where nothing else runs and nothing waits, or for a request's first chunk, where only later
        # chunks wait: they have playback time in hand, and wait for its few tokens on every thread rather
        # than halve its threads beside it (a live phrase's first audio: 0.45 s against 0.28 s at 1 client).
        first = batch[0].priority == FIRST_CHUNK_PRIORITY
        idle = others == 0 and all(
            entry.cancelled or (first and entry.priority > FIRST_CHUNK_PRIORITY)
            for entry in entries
            if entry not in batch
        )
        # A book's chunks never take every thread: a chunk's audio then does not depend on what ran beside
        # it (its lane's thread count sets the order of its sums), so a job that resumes makes what an
        # uninterrupted one would have, bit for bit.
        alone = self._pooled and idle and not background
        self._alone, self._urgent = self._alone or alone, self._urgent or urgent
        return _Call(batch, alone=alone, urgent=urgent, background=background)

    def _commit_unload(self) -> bool:
        """Under the lock: whether an unload is (now) committed. It is once asked for with no chunk queued
        and no call running; from then on every lane ends, and chunks submitted meanwhile wait for the
        reload that they cause."""
        if not self._unloading and self._unload_wanted and not self._entries and self._running == 0:
            self._unloading = True
            self._condition.notify_all()
        return self._unloading

    def _admits(self, head: Entry) -> Literal["lane", "urgent"] | None:
        """Whether a call led by `head` may start now: "lane" on a free lane, "urgent" for a first chunk
        beside busy lanes (or, without threads for a book's chunks, beside those only), None to wait. A
        call alone holds every lane; a book's chunks on their own threads hold none."""
        running = self._running - (self._background if self._book_lanes else 0)
        if running == 0:
            return "lane"
        if self.lanes == 1:
            return None
        first = head.priority == FIRST_CHUNK_PRIORITY and not self._urgent
        if first and not self._book_lanes and running == self._background:
            return "urgent"  # beside a book's chunks only: every thread, ahead of them, as with none
        busy = self.lanes if self._alone else running - int(self._urgent)
        if busy < self.lanes:
            return "lane"
        if first:
            return "urgent"
        return None

    def _admits_book(self) -> Literal["book"] | None:
        """Whether a book's chunk may start on a thread of its own: one per lane, and only while no
        request's call runs or waits and none has for BOOK_GRACE_S (one that starts later finds at most
        the ends of a book's calls)."""
        if self._background >= self._book_lanes or self._running > self._background:
            return None
        waiting = any(
            entry.priority != BACKGROUND_PRIORITY and not entry.cancelled for entry in self._entries
        )
        return None if waiting or self._book_grace_left() > 0 else "book"

    def _book_grace_left(self) -> float:
        return self._request_seen + BOOK_GRACE_S - time.monotonic()

    def _remove(self, taken: Iterable[Entry]) -> None:
        gone = set(taken)
        if gone:
            self._entries = [entry for entry in self._entries if entry not in gone]
            self._observe_queue()

    def _refuse(self, reason: str) -> None:
        """Fail everything queued and everything submitted from now on; wakes the engine thread to end."""
        with self._condition:
            if self._refusal is None:
                self._refusal = reason
            for entry in self._entries:
                _resolve(entry, error=RuntimeError(self._refusal))
            self._remove(list(self._entries))
            self._condition.notify_all()

    def _execute(self, batch: list[Entry]) -> None:
        """Run one batch; each chunk's future is resolved as soon as the engine has its audio."""
        started = time.perf_counter()
        delivered: set[int] = set()

        def ready(index: int, chunk: ChunkAudio) -> None:
            delivered.add(index)
            _resolve(batch[index], audio=chunk)

        try:
            audio = self._synthesize(batch, ready)
        except Exception as exc:
            self._count(done=len(delivered))
            rest = [entry for i, entry in enumerate(batch) if i not in delivered]
            if rest:
                self._retry_apart(rest, exc)
            return
        self._count(done=len(batch))
        audio_s = sum(len(chunk.samples) for chunk in audio) / self.engine.sample_rate
        self._observe_call(len(batch), time.perf_counter() - started, audio_s)
        for index, (entry, chunk) in enumerate(zip(batch, audio, strict=True)):
            if index not in delivered:
                _resolve(entry, audio=chunk)

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
        """A failed batch runs again in halves, so an error (out of memory included) only fails the
        chunks that fail on their own."""
        if len(batch) == 1:
            logger.error("synthesis failed for request %s", batch[0].request_id, exc_info=error)
            _resolve(batch[0], error=error)
            return
        logger.warning(
            "a batch of %d chunks failed (%s: %s); running it in halves",
            len(batch),
            type(error).__name__,
            error,
        )
        live = [entry for entry in batch if not entry.cancelled]
        self._count(skipped=len(batch) - len(live))
        half = (len(live) + 1) // 2
        for part in (live[:half], live[half:]):
            if part:
                self._execute(part)

    def _count(self, *, done: int = 0, skipped: int = 0) -> None:
        with self._condition:  # lanes finish calls side by side
            self.chunks_done += done
            self.chunks_skipped += skipped

    def _observe_queue(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(len(self._entries))

    def _observe_call(self, batch_size: int, wall_s: float, audio_s: float) -> None:
        if self._metrics is None or not self._observe_calls:
            return
        self._metrics.batch_size.observe(batch_size)
        self._metrics.audio_seconds.inc(audio_s)
        if audio_s > 0:
            self._metrics.real_time_factor.observe(wall_s / audio_s)


@dataclass(frozen=True)
class _Call:
    """A batch a lane runs: `alone` on every thread, `urgent` a first chunk beside busy lanes."""

    batch: list[Entry]
    alone: bool
    urgent: bool
    background: bool = False  # a book's chunks


@dataclass
class _Begun:
    """A chunk the stepped engine has begun, and the engine time it has had so far."""

    run: ChunkRun
    seconds: float = 0.0


def run_when_idle() -> None:
    """Put the calling thread (and the threads it starts) under SCHED_IDLE (Linux): it runs only on a core
    no other thread wants. Elsewhere, or where that is refused, as nice as a thread gets."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        logger.info("a book's chunks run at niceness %d, not SCHED_IDLE (%s)", BOOK_NICENESS, exc)
        lower_priority(BOOK_NICENESS)


def lower_priority(steps: int) -> None:
    """Raise the calling thread's niceness by `steps` (Linux: per thread); elsewhere nothing."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(os.getpriority(os.PRIO_PROCESS, thread) + steps, 19))
    except (AttributeError, OSError) as exc:
        logger.info("engine lanes keep the process's priority (%s)", exc)


def _resolve(entry: Entry, *, audio: ChunkAudio | None = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if entry.future.done():
            return
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(audio)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        entry.loop.call_soon_threadsafe(settle)
