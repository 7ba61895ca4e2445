"""The batch-forming decisions, pure: which entries run next, together, and what a failed batch retries."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from api.engine.base import BatchPolicy
from api.engine.scheduling.entries import BACKGROUND_PRIORITY, FIRST_CHUNK_PRIORITY, Entry, run_order


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
    candidates = sorted((entry for entry in entries if not entry.cancelled), key=run_order)
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
    best_active = min((entry for entry in active if not entry.cancelled), key=run_order, default=None)
    best_queued = min((entry for entry in queued if not entry.cancelled), key=run_order, default=None)
    if best_queued is not None and (best_active is None or run_order(best_queued) < run_order(best_active)):
        return StepDecision(entry=best_queued, started=True, dropped=dropped)
    return StepDecision(entry=best_active, started=False, dropped=dropped)


def retry_halves(failed: Sequence[Entry]) -> tuple[list[list[Entry]], list[Entry]]:
    """A failed batch of several chunks runs again as two halves of its live entries, so an error (out of
    memory included) only fails the chunks that fail on their own: the halves, and the entries skipped
    (their requests have gone)."""
    live = [entry for entry in failed if not entry.cancelled]
    skipped = [entry for entry in failed if entry.cancelled]
    half = (len(live) + 1) // 2
    return [part for part in (live[:half], live[half:]) if part], skipped


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
