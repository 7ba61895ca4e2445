"""Fakes for the layers above the engine: a deterministic tone engine and a trivial phonemizer."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import resources

import numpy as np

from api.engine.base import (
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
    BatchPolicy,
    ChunkAudio,
    ReadyCallback,
    SynthesisItem,
)
from api.errors import InvalidRequestError
from api.text.chunk import Word

SAMPLES_PER_TOKEN = 1200  # two 25 ms frames, about what the real model predicts


def shipped_vocab() -> dict[str, int]:
    config = json.loads(resources.files("api").joinpath("data/kokoro-82m-config.json").read_text())
    return dict(config["vocab"])


class FakeEngine:
    """A tone per chunk: length proportional to tokens / speed, pitch from the style vector.

    `fail_token` makes any call with a chunk containing that token id raise (a whole batch fails, as a
    real batched forward would); `delay` slows every chunk down. The batching arguments make up
    `batch_defaults` (by default one chunk per call); `batches` records each call's chunks, `calls` every
    chunk synthesized.
    """

    name = "fake"
    sample_rate = SAMPLE_RATE
    gives_durations = True

    def __init__(
        self,
        *,
        delay: float = 0.0,
        fail_token: int | None = None,
        load_delay: float = 0.0,
        max_batch_size: int = 1,
        batch_timeout: float = 0.0,
        max_batch_tokens: int = 100_000,
        length_ratio: float = 2.0,
    ) -> None:
        self.delay = delay
        self.fail_token = fail_token
        self.load_delay = load_delay
        self.batch_defaults = BatchPolicy(
            max_batch_size=max_batch_size,
            batch_timeout=batch_timeout,
            max_batch_tokens=max_batch_tokens,
            length_ratio=length_ratio,
        )
        self.loaded = threading.Event()
        self.calls: list[SynthesisItem] = []
        self.batches: list[list[SynthesisItem]] = []
        self._vocab = shipped_vocab()

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    def load(self) -> None:
        time.sleep(self.load_delay)
        self.loaded.set()

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        self.batches.append(list(items))
        results = []
        for index, item in enumerate(items):
            results.append(self._tone(item))
            if on_ready is not None:
                on_ready(index, results[-1])
        return results

    def _tone(self, item: SynthesisItem) -> ChunkAudio:
        time.sleep(self.delay)
        self.calls.append(item)
        if self.fail_token is not None and self.fail_token in item.tokens:
            raise RuntimeError("fake engine failure")
        length = int(len(item.tokens) * SAMPLES_PER_TOKEN / item.speed)
        frequency = 200.0 + 100.0 * abs(float(item.style[0]))
        t = np.arange(length) / self.sample_rate
        samples = (0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
        return ChunkAudio(samples, fake_durations(len(item.tokens), length))


def fake_durations(tokens: int, samples: int) -> np.ndarray:
    """Frames per token (boundary tokens 0) spread evenly over the audio's length, as whole frames."""
    edges = np.round(np.linspace(0, samples / SAMPLES_PER_FRAME, tokens + 1)).astype(np.int64)
    return np.concatenate([[0], np.diff(edges), [0]])


class FakePhonemizer:
    """Lower-cases the text and keeps the characters the model's vocabulary knows."""

    languages = ("a", "b", "e", "f", "h", "i", "p")

    def __init__(self) -> None:
        self.vocab = shipped_vocab()

    def phonemize(self, text: str, lang_code: str) -> str:
        return "".join(ch for ch in text.lower() if ch in self.vocab or ch == " ")

    def words(self, text: str, lang_code: str) -> list[Word]:
        parts = text.split()
        return [
            Word(part, self.phonemize(part, lang_code), i < len(parts) - 1) for i, part in enumerate(parts)
        ]

    def gives_word_text(self, lang_code: str) -> bool:
        return True

    def check_language(self, lang_code: str, param: str = "lang_code") -> None:
        if lang_code not in self.languages:
            raise InvalidRequestError(
                f"Language '{lang_code}' is not supported.", param=param, code="unsupported_language"
            )


class FakeSteppedEngine(FakeEngine):
    """The tone engine run in `steps` parts per chunk, as the staged ONNX engine runs: `step_log` records
    the request order of every part run (by the chunk's first token), so tests can see who paused whom."""

    def __init__(self, *, steps: int = 4, step_delay: float = 0.0, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.steps = steps
        self.step_delay = step_delay
        self.step_log: list[int] = []

    def start(self, item: SynthesisItem) -> _FakeRun:
        return _FakeRun(self, item)


class _FakeRun:
    def __init__(self, engine: FakeSteppedEngine, item: SynthesisItem) -> None:
        self._engine = engine
        self._item = item
        self._done = 0

    def step(self) -> ChunkAudio | None:
        time.sleep(self._engine.step_delay)
        self._engine.step_log.append(self._item.tokens[0])
        self._done += 1
        if self._done < self._engine.steps:
            return None
        return self._engine._tone(self._item)


class FakeLanedEngine(FakeEngine):
    """The tone engine with lanes, as the torch engine has them on a CPU: `claims` records each call's
    `alone` (in call order), `events` each call's start and end as ("start" | "end", its first chunk's
    token count), `niceness` each call's thread's niceness by its first chunk's token count, `most_at_once`
    the most calls seen running side by side."""

    def __init__(self, *, lanes: int = 2, pooled_threads: bool = True, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lanes = lanes
        self.pooled_threads = pooled_threads
        self.claims: list[bool] = []
        self.events: list[tuple[str, int]] = []
        self.niceness: dict[int, int] = {}
        self.policies: dict[int, int] = {}  # each call's thread's scheduling policy, as niceness
        self.most_at_once = 0
        self._at_once = 0
        self._lock = threading.Lock()
        self._every_thread = threading.local()

    def claim_threads(self, every_thread: bool) -> None:
        self._every_thread.value = every_thread

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        with self._lock:
            self.claims.append(self._every_thread.value)
            self.events.append(("start", len(items[0].tokens)))
            self.niceness[len(items[0].tokens)] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            self.policies[len(items[0].tokens)] = os.sched_getscheduler(threading.get_native_id())
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
        try:
            return super().synthesize(items, on_ready)
        finally:
            with self._lock:
                self.events.append(("end", len(items[0].tokens)))
                self._at_once -= 1
