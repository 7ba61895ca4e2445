"""The engine's threads: a bounded queue of chunk entries, run in batches on lanes, results to futures."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from api.engine.base import (
    BatchPolicy,
    ChunkAudio,
    ChunkRun,
    Engine,
    LanedEngine,
    SteppedEngine,
    SynthesisItem,
)
from api.engine.memory import free_model_memory
from api.engine.scheduling.batching import BatchOverrides, StepDecision, effective_policy, next_step
from api.engine.scheduling.calls import BatchRunner
from api.engine.scheduling.entries import (
    BACKGROUND_PRIORITY,
    LATER_CHUNK_PRIORITY,
    Entry,
    QueueFullError,
    resolve,
)
from api.engine.scheduling.lanes import BOOK_LANE, URGENT, Call, LaneUse, Role, next_call, role_of
from api.engine.scheduling.lifecycle import SERVING_STATES, EngineState, UnloadedEngine, commits_unload
from api.engine.scheduling.niceness import LANE_NICENESS, lower_priority, run_when_idle
from api.engine.scheduling.observer import SchedulerObserver, Unobserved

logger = logging.getLogger(__name__)


class Scheduler:
    """Owns the engine and its threads: prepares (loads) the engine there, then runs batches of entries.

    The asyncio side only calls `submit`, which holds the lock briefly and never waits on the engine.
    The engine thread settles the batching policy once the engine has loaded (the engine's defaults
    for its device, under the operator's overrides); each thread asks `next_call` (batching and lane
    admission, api/engine/scheduling/lanes.py) what to run, drops entries whose request has gone (future
    cancelled), and runs the call through a `BatchRunner`, which splits a failing batch in halves. After a
    load failure or `stop`, every entry fails at once. An engine with lanes (`LanedEngine`) gets one thread
    per lane, one for first chunks beside busy lanes, and where its threads are pooled one per lane for a
    book's chunks. While idle, `unload` frees the model and the next chunk loads a new one (`rebuild`).
    The `observer` hears of the queue, the calls and the loads (the server's metrics).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_queued: int,
        prepare: Callable[[], None] | None = None,
        observer: SchedulerObserver | None = None,
        policy: BatchPolicy | None = None,
        overrides: BatchOverrides | None = None,
        rebuild: Callable[[], Engine] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.engine = engine
        self.max_queued = max_queued
        # Not `engine.load` itself: a bound method would keep the first engine alive after an unload.
        self._prepare = prepare or self._load_engine
        self._observer: SchedulerObserver = observer or Unobserved()
        self._base_policy = policy
        self._overrides = overrides or BatchOverrides()
        self._entries: list[Entry] = []
        self._condition = threading.Condition()
        self._refusal: str | None = None  # why new work fails at once: a load failure, or stop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._lane_threads: list[threading.Thread] = []
        self._use = LaneUse()  # what runs on the lanes (replaced under the lock)
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
    def lanes(self) -> int:
        """Calls that may run at once, known once the engine has loaded."""
        return self._use.lanes

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
            if self._entries or self._use.running:
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
                self._use = dataclasses.replace(self._use, request_seen=time.monotonic())
            self._entries.append(entry)
            self._observer.queue_changed(len(self._entries))
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

    # --- the engine thread: load, serve, unload, load again ------------------------------------------------

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
        self._observer.model_loaded(seconds, reload=reloading)
        return policy

    def _serve(self, policy: BatchPolicy) -> None:
        if isinstance(self.engine, SteppedEngine) and policy.max_batch_size == 1:
            self._run_stepped(self.engine)
            return
        laned = self.engine if isinstance(self.engine, LanedEngine) else None
        lanes = 1 if laned is None else max(1, laned.lanes)
        pooled = laned is None or laned.pooled_threads
        book_lanes = lanes if laned is not None and pooled else 0
        with self._condition:
            self._use = dataclasses.replace(self._use, lanes=lanes, pooled=pooled, book_lanes=book_lanes)
        roles = [f"engine-{lane}" for lane in range(1, lanes)]
        if lanes > 1:
            roles.append(URGENT)
        roles += [f"{BOOK_LANE}{lane}" for lane in range(book_lanes)]
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
        self._observer.model_unloaded()
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

    def _commit_unload(self) -> bool:
        """Under the lock: whether an unload is (now) committed. It is once asked for with no chunk queued
        and no call running; from then on every lane ends, and chunks submitted meanwhile wait for the
        reload that they cause."""
        wanted = self._unload_wanted
        if not self._unloading and commits_unload(
            wanted=wanted, queued=len(self._entries), running=self._use.running
        ):
            self._unloading = True
            self._condition.notify_all()
        return self._unloading

    # --- the lanes -----------------------------------------------------------------------------------------

    def _run_lane(self, policy: BatchPolicy, laned: LanedEngine | None, thread: str) -> None:
        """Run calls on this thread: a lane's (LANE_NICENESS steps nicer when there are several) or, as
        URGENT, the first chunks that start beside busy lanes, on every thread and at the process's own
        priority, so that the OS runs them ahead of the lanes' calls; or a book's, when the OS has nothing
        else to run."""
        role = role_of(thread)
        # The engine thread runs lane 0 again after each reload: its niceness is raised once.
        niced = thread == "engine-0" and self._engine_thread_niced
        if role == "book":
            run_when_idle()
        elif role == "lane" and self._use.lanes > 1 and self._use.pooled and not niced:
            lower_priority(LANE_NICENESS)
            self._engine_thread_niced = self._engine_thread_niced or thread == "engine-0"
        while (call := self._take_call(policy, role)) is not None:
            try:
                if laned is not None:
                    laned.claim_threads(call.alone or call.urgent)
                BatchRunner(self.engine, self._count, self._observer.call_done).run(call.batch)
            finally:
                with self._condition:
                    self._use = self._use.ended(call, time.monotonic())
                    self.last_active = self._clock()
                    self._condition.notify_all()

    def _take_call(self, policy: BatchPolicy, role: Role) -> Call | None:
        """The next call for a thread of `role`, waiting for a batch and for room to run it as long as it
        takes; None once refusing work."""
        with self._condition:
            while self._refusal is None and not self._unloading:
                decision = next_call(self._entries, time.monotonic(), policy, self._use, role)
                self._remove(decision.skipped)
                self.chunks_skipped += len(decision.skipped)
                if decision.call is not None:
                    self._remove(decision.call.batch)
                    self._use = self._use.started(decision.call)
                    return decision.call
                if self._commit_unload():
                    return None
                self._condition.wait(decision.wait)  # a call's end notifies
            return None

    # --- a stepped engine ----------------------------------------------------------------------------------

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
                resolve(entry, error=exc)
                continue
            begun = active[entry]
            begun.seconds += time.perf_counter() - started
            self.last_active = self._clock()
            if audio is not None:
                del active[entry]
                self.chunks_done += 1
                audio_s = len(audio.samples) / self.engine.sample_rate
                self._observer.call_done(1, begun.seconds, audio_s)
                resolve(entry, audio=audio)

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
                resolve(entry, error=RuntimeError(self._refusal))
            return None

    # --- under the lock ------------------------------------------------------------------------------------

    def _remove(self, taken: Iterable[Entry]) -> None:
        gone = set(taken)
        if gone:
            self._entries = [entry for entry in self._entries if entry not in gone]
            self._observer.queue_changed(len(self._entries))

    def _refuse(self, reason: str) -> None:
        """Fail everything queued and everything submitted from now on; wakes the engine thread to end."""
        with self._condition:
            if self._refusal is None:
                self._refusal = reason
            for entry in self._entries:
                resolve(entry, error=RuntimeError(self._refusal))
            self._remove(list(self._entries))
            self._condition.notify_all()

    def _count(self, done: int, skipped: int) -> None:
        with self._condition:  # lanes finish calls side by side
            self.chunks_done += done
            self.chunks_skipped += skipped


@dataclass
class _Begun:
    """A chunk the stepped engine has begun, and the engine time it has had so far."""

    run: ChunkRun
    seconds: float = 0.0
