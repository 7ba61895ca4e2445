"""What the benchmarks that simulate the GPU share (`frontend`, `shared-engine`, `encoders`): the simulated
torch engine on CUDA, speech-like audio of the real model's length, and the ONNX engine's speech to calibrate
them with."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from api.engine.base import ChunkAudio
from scripts.bench.common import ROOT

SAMPLE_RATE = 24000
# Seconds of audio per phoneme token from the real model (af_heart, speed 1): the ONNX engine over the
# 20 built-in paragraphs as the server chunks them (--onnx-texts 20, 2026-11-23: 3029 tokens, 196.3 s).
SECONDS_PER_TOKEN = 0.0648
# An H100's batched forward, as `frontend` models it: fixed + padded tokens x per-token.
FIXED_S = 0.010
PER_TOKEN_S = 20e-6
ENCODE_PIECE_S = 3.0  # the audio the server hands an encoder at a time


@dataclass(frozen=True)
class GpuModel:
    """Batched forward time on the simulated GPU: fixed + padded tokens x per-token."""

    fixed_s: float = FIXED_S
    per_token_s: float = PER_TOKEN_S

    def batch_seconds(self, token_counts: Sequence[int]) -> float:
        if not token_counts:
            return 0.0
        return self.fixed_s + len(token_counts) * max(token_counts) * self.per_token_s

    def full_batch_rate(self, batch: int, tokens: int, seconds_per_token: float) -> float:
        """Audio seconds per second for back-to-back full batches of equal chunks."""
        return batch * tokens * seconds_per_token / self.batch_seconds([tokens] * batch)


class SimulatedGpuEngine:
    """The scheduler's view of the torch engine on CUDA (same vocabulary and batch policy), sleeping as the
    GPU model says instead of computing; its audio is slices of a speech-like signal of the real length."""

    name = "simulated-gpu"
    sample_rate = SAMPLE_RATE
    gives_durations = False

    def __init__(self, model: GpuModel, seconds_per_token: float, source: np.ndarray) -> None:
        from api.engine.torch_engine import GPU_BATCH_POLICY

        self.model = model
        self.seconds_per_token = seconds_per_token
        self.batch_defaults = GPU_BATCH_POLICY
        self._source = source
        config = json.loads((ROOT / "api" / "data" / "kokoro-82m-config.json").read_text())
        self._vocab = dict(config["vocab"])

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    def load(self) -> None:
        return None

    def synthesize(self, items: Sequence[Any], on_ready: Any = None) -> list[ChunkAudio]:
        time.sleep(self.model.batch_seconds([len(item.tokens) for item in items]))
        results = [ChunkAudio(self._audio(len(item.tokens), item.speed)) for item in items]
        if on_ready is not None:
            for index, audio in enumerate(results):
                on_ready(index, audio)
        return results

    def _audio(self, tokens: int, speed: float) -> np.ndarray:
        length = max(int(tokens * self.seconds_per_token / speed * SAMPLE_RATE), 1)
        start = (tokens * 7919) % len(self._source)
        if start + length <= len(self._source):
            return self._source[start : start + length].copy()
        return np.resize(self._source, length)  # longer than the source: repeated


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced-speech-like audio without the model: a gliding harmonic tone under a syllable-rate envelope
    with noise, so lossy encoders have real work (silence or a pure tone would flatter them)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    signal = 0.2 * envelope * voiced + 0.02 * rng.standard_normal(len(t))
    return np.clip(signal, -1, 1).astype(np.float32)


def pin_to_one_core() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def calibrate(texts: Sequence[str], weights: Path) -> dict[str, Any]:
    """Seconds of audio per token from the ONNX engine over whole paragraphs (the server's chunks)."""
    from api.engine.onnx_engine import OnnxEngine
    from api.engine.voices import VoiceStore
    from api.text.phonemize import Phonemizer
    from scripts.bench.measure import server_chunks

    engine = OnnxEngine(weights, threads=len(os.sched_getaffinity(0)), warmup=False)
    engine.load()
    pack = VoiceStore(weights / "voices").resolve("af_heart")
    phonemizer = Phonemizer()
    tokens = 0
    audio: list[np.ndarray] = []
    for text in texts:
        for item in server_chunks(text, engine.vocab, pack, phonemizer).items:
            tokens += len(item.tokens)
            audio.append(engine.synthesize([item])[0].samples)
    seconds = sum(len(piece) for piece in audio) / SAMPLE_RATE
    return {
        "texts": len(texts),
        "tokens": tokens,
        "audio_s": round(seconds, 2),
        "seconds_per_token": round(seconds / tokens, 5),
        "speech": np.concatenate(audio),
    }
