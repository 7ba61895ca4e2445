"""The shared engine's loop over the real torch engine (CPU, random weights), in this process: the pipelined
layout (two workers with several calls in flight each, the engine process's two lanes) gives the audio of
the sequential one (one call at a time on one lane), sample for sample.

Every call runs on one CPU thread in both: on a CPU a call alone gets every thread, and a kernel that splits
a sum between two threads may round it otherwise than one thread does (a few 1e-6 here), which is the CPU's
kernels, not the loop, whose work is handing each chunk's audio to its own caller unchanged."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api.engine.base import ChunkAudio, ReadyCallback, SynthesisItem
from api.engine.shared import RemoteEngine
from api.engine.torch_engine import TorchEngine
from scripts.harness import engine_process

LENGTHS = (3, 24, 60)
SPEEDS = (1.0, 1.25)


class OneThreadACall(TorchEngine):
    """The torch engine with every call on its lane's thread, never on every thread; it counts the most calls
    that ran at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counting = threading.Lock()
        self._running = 0
        self.most_at_once = 0

    def claim_threads(self, every_thread: bool) -> None:
        super().claim_threads(False)

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        with self._counting:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        try:
            return super().synthesize(items, on_ready)
        finally:
            with self._counting:
                self._running -= 1


def items(random_weights: Path, vocab: dict[str, int]) -> list[SynthesisItem]:
    """Chunks of several lengths, speeds and voices, as different requests would hand over."""
    symbols = [index for symbol, index in sorted(vocab.items()) if symbol.isalpha()]
    made = []
    for number, (length, speed) in enumerate((length, speed) for length in LENGTHS for speed in SPEEDS):
        name = ("af_heart", "am_adam")[number % 2]
        pack = torch.load(random_weights / "voices" / f"{name}.pt").reshape(510, 256).numpy()
        tokens = tuple((symbols[number:] + symbols * 20)[:length])
        made.append(SynthesisItem(tokens=tokens, style=pack[length - 1], speed=speed))
    return made


def through_the_loop(
    random_weights: Path, path: Path, *, lanes: int, workers: int, calls: int
) -> tuple[list[ChunkAudio], int]:
    """Every chunk synthesized through `serve` over a torch engine with `lanes`, handed over by `workers`
    RemoteEngines with `calls` in flight each, all at once; the audio in the chunks' order, and the most
    engine calls that ran at once."""
    engine = OneThreadACall(
        random_weights, device="cpu", threads=lanes, compile=False, warmup=False, lanes=lanes
    )
    with engine_process(engine, path):
        remotes = [RemoteEngine(path, calls=calls, connect_timeout=120) for _ in range(workers)]
        for remote in remotes:
            remote.load()
        chunks = items(random_weights, dict(remotes[0].vocab))
        with ThreadPoolExecutor(workers * calls) as pool:
            futures = [
                pool.submit(remotes[number % workers].synthesize, [chunk])
                for number, chunk in enumerate(chunks)
            ]
            audio = [future.result(timeout=300)[0] for future in futures]
        for remote in remotes:
            remote.close()
    return audio, engine.most_at_once


def test_the_pipelined_loop_gives_the_sequential_audio_bit_for_bit(
    random_weights: Path, tmp_path: Path
) -> None:
    sequential, sequential_at_once = through_the_loop(
        random_weights, tmp_path / "sequential.sock", lanes=1, workers=1, calls=1
    )
    pipelined, pipelined_at_once = through_the_loop(
        random_weights, tmp_path / "pipelined.sock", lanes=2, workers=2, calls=4
    )
    assert (sequential_at_once, pipelined_at_once) == (1, 2)
    assert len(sequential) == len(pipelined) == len(LENGTHS) * len(SPEEDS)
    for number, (alone, beside) in enumerate(zip(sequential, pipelined, strict=True)):
        assert len(alone.samples) > 0
        np.testing.assert_array_equal(beside.samples, alone.samples, err_msg=f"chunk {number}")
        assert alone.durations is not None
        assert beside.durations is not None
        np.testing.assert_array_equal(beside.durations, alone.durations, err_msg=f"chunk {number}")
