"""What the scheduler reports as it works, as callbacks: the server records them into its metrics."""

from __future__ import annotations

from typing import Protocol


class SchedulerObserver(Protocol):
    """Told of the queue's depth, each engine call, and the model's loads and unloads (from the engine's
    threads: each method must be quick and thread-safe)."""

    def queue_changed(self, depth: int) -> None: ...

    def call_done(self, batch_size: int, wall_s: float, audio_s: float) -> None: ...

    def model_loaded(self, seconds: float, *, reload: bool) -> None: ...

    def model_unloaded(self) -> None: ...


class Unobserved:
    """The observer of a scheduler nobody watches (scripts, tests): it records nothing."""

    def queue_changed(self, depth: int) -> None:
        pass

    def call_done(self, batch_size: int, wall_s: float, audio_s: float) -> None:
        pass

    def model_loaded(self, seconds: float, *, reload: bool) -> None:
        pass

    def model_unloaded(self) -> None:
        pass
