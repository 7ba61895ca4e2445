"""The engine interface shared by every engine (PyTorch today, ONNX Runtime later) and the fakes."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from api.weights.layout import MAX_PHONEMES

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
# One predicted duration frame is 600 samples (25 ms) at 24 kHz.
SAMPLES_PER_FRAME = 600


@dataclass(frozen=True)
class SynthesisItem:
    """One chunk to synthesize: phoneme token ids (no boundary tokens), its style vector, its speed."""

    tokens: tuple[int, ...]
    style: np.ndarray[Any, Any]  # float32, shape (256,): the voice pack's row for this chunk's length
    speed: float

    def __post_init__(self) -> None:
        if not 0 < len(self.tokens) <= MAX_PHONEMES:
            raise ValueError(f"a chunk needs 1..{MAX_PHONEMES} tokens, got {len(self.tokens)}")
        if self.style.shape != (256,):
            raise ValueError(f"style must have shape (256,), got {self.style.shape}")


@dataclass(frozen=True)
class BatchPolicy:
    """How the scheduler groups chunks into one engine call.

    `max_batch_size` chunks at most; the first queued chunk waits at most `batch_timeout` seconds for
    company; `max_batch_tokens` bounds the padded cost (batch size x the largest cost, cost being tokens /
    speed), which bounds memory; `length_ratio` bounds largest / smallest cost, which bounds padding.
    `busy_timeout`, for lanes that run side by side on one device (a GPU's streams): while a call runs, a
    call beside it waits this long for company instead of `batch_timeout` (a request's first chunk never
    does), so that it starts with a batch worth its launch rather than with what arrived meanwhile.
    `launch_tokens`, for a device whose calls cost a fixed launch on the host (a GPU's kernels, launched by
    one Python thread): the padded cost the device runs in about the time a call's launch takes. Up to it a
    batch takes chunks beyond `length_ratio`: their padding fills time the device would otherwise idle
    waiting for the next launch. 0: the ratio always holds.
    """

    max_batch_size: int
    batch_timeout: float
    max_batch_tokens: int
    length_ratio: float
    busy_timeout: float = 0.0
    launch_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.batch_timeout < 0:
            raise ValueError(f"batch_timeout must not be negative, got {self.batch_timeout}")
        if self.busy_timeout < 0:
            raise ValueError(f"busy_timeout must not be negative, got {self.busy_timeout}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {self.max_batch_tokens}")
        if self.length_ratio < 1:
            raise ValueError(f"length_ratio must be at least 1, got {self.length_ratio}")
        if self.launch_tokens < 0:
            raise ValueError(f"launch_tokens must not be negative, got {self.launch_tokens}")


@dataclass(frozen=True, eq=False)
class ChunkAudio:
    """One chunk's result: its float32 mono samples and the 25 ms frames the model gave each token (the
    two boundary tokens included, so len(tokens) + 2 of them; the samples are their sum x
    SAMPLES_PER_FRAME long), from which word timings follow. `durations` is None for an engine whose
    model does not expose them."""

    samples: np.ndarray[Any, Any]
    durations: np.ndarray[Any, Any] | None = None


# Called with an item's index and its audio as soon as that item is done, before the whole call returns.
ReadyCallback = Callable[[int, ChunkAudio], None]


def usable_cores() -> int:
    """The cores this process may run on (its affinity; a container's cpuset narrows it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def warn_if_oversubscribed(engine: str, threads: int) -> None:
    """More engine threads than cores makes synthesis slower, not faster: on 2 cores ONNX Runtime ran
    1.7 to 2.1x slower with 4 threads and 3.0 to 4.6x slower with 8 than with 2 (docs/performance.md)."""
    cores = usable_cores()
    if threads > cores:
        logger.warning(
            "the %s engine has %d threads but this process may use %d cores: expect it to run slower "
            "than with %d threads (set OMP_NUM_THREADS or KOKORO_*_THREADS to at most the cores)",
            engine,
            threads,
            cores,
            cores,
        )


class EngineError(RuntimeError):
    """Synthesis failed inside the engine."""


# "Hello world." in the model's phoneme alphabet: the engines' short warm-up chunk.
WARMUP_PHONEMES = "həlˈO wˈɜɹld."


def warmup_item(vocab: Mapping[str, int]) -> SynthesisItem:
    tokens = tuple(vocab[p] for p in WARMUP_PHONEMES if p in vocab)
    return SynthesisItem(tokens=tokens, style=np.zeros(256, dtype=np.float32), speed=1.0)


def checked_audio(samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The samples, unless the model produced NaN or infinity (never passed on as audio)."""
    if not np.isfinite(samples).all():
        raise EngineError("the model produced non-finite audio")
    return samples


class Engine(Protocol):
    """Loads a model and synthesizes chunks. Every method is blocking and runs on the engine thread."""

    name: str
    sample_rate: int

    @property
    def vocab(self) -> Mapping[str, int]:
        """Phoneme symbol -> token id."""
        ...

    @property
    def gives_durations(self) -> bool:
        """Whether its results carry the model's durations (word timings need them)."""
        ...

    @property
    def batch_defaults(self) -> BatchPolicy:
        """The batching that suits this engine on its device; valid once `load` has returned."""
        ...

    def load(self) -> None:
        """Load the weights (and warm up when asked); called once, on the engine thread."""
        ...

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        """The audio for each item, in order; raises when any item fails (the scheduler splits
        the batch to find which). `on_ready` hears of each item as soon as its audio exists, so a batch's
        first chunks need not wait for its last."""
        ...


class ChunkRun(Protocol):
    """One chunk being synthesized in parts, so the engine thread can pause it between parts."""

    def step(self) -> ChunkAudio | None:
        """Run the next part; returns the chunk's audio after the last part, None before."""
        ...


@runtime_checkable
class SteppedEngine(Protocol):
    """An engine that runs one chunk at a time in parts: the scheduler runs a part of the most urgent
    chunk at each step, so a request's first chunk need not wait for a long chunk to finish."""

    def start(self, item: SynthesisItem) -> ChunkRun:
        """Begin a chunk; no work is done until its first `step`."""
        ...


@runtime_checkable
class LanedEngine(Protocol):
    """An engine whose calls may run side by side: the scheduler runs up to `lanes` calls at once. On a CPU
    each call runs on a share of the engine's threads, and a call with nothing beside it gets every thread;
    on a GPU each lane has its own CUDA stream; a remote engine keeps one call in flight per lane."""

    @property
    def lanes(self) -> int:
        """Calls that may run at once; 1 runs one at a time. Valid once `load` has returned."""
        ...

    @property
    def pooled_threads(self) -> bool:
        """Whether the lanes share one pool of CPU threads (the torch engine on a CPU): a call with nothing
        beside it then takes every thread and holds every lane, and the lanes' threads run nicer than the
        process. False where lanes are independent (CUDA streams, a remote engine's connections): a call
        never holds another lane back."""
        ...

    def claim_threads(self, every_thread: bool) -> None:
        """Called on the calling thread before each call: the engine's every thread, or the lane's share."""
        ...


@runtime_checkable
class PrioritizedEngine(Protocol):
    """An engine that queues chunks itself (the shared engine's proxy, api/engine/shared.py): the scheduler
    tells it each chunk's priority (lower runs first, api/engine/scheduling/entries.py), so that a request's
    first chunk keeps going ahead of other requests' later chunks there too."""

    def synthesize_prioritized(
        self, items: Sequence[SynthesisItem], priorities: Sequence[int], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        """`synthesize`, with a priority per item."""
        ...


@dataclass(frozen=True)
class KernelStatus:
    """Where a process's compiled kernels stand: `state` is "compiled" (every variant its calls asked for is
    in use), "compiling" (`pending` are being compiled in the background, their calls run eagerly meanwhile),
    or "eager" (not compiled: off, or compiling failed); `compiled` variants are in use, `failed` could not
    be compiled."""

    state: str
    compiled: int
    pending: int = 0
    failed: int = 0
    seconds: float | None = None  # since the first background request, while compiling or once all done

    def describe(self) -> str:
        if self.state == "compiling":
            return f"{self.compiled} compiled, {self.pending} compiling in the background (calls run eagerly)"
        return f"{self.compiled} compiled" + (f", {self.failed} failed (eager)" if self.failed else "")


@runtime_checkable
class CompilingEngine(Protocol):
    """An engine with compiled kernels, which may still be compiling them in the background (/ready tells)."""

    def kernel_status(self) -> KernelStatus | None:
        """Where its compiled kernels stand; None where it has none."""
        ...
