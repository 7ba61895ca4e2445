"""scripts/bench/frontend.py (and simulated.py): the simulated GPU's timing and audio, and the summary of
cores per part."""

from __future__ import annotations

import time

import numpy as np
import pytest

from api.engine.base import SynthesisItem
from scripts.bench import frontend as bench


def test_batch_time_is_fixed_plus_padded_tokens() -> None:
    model = bench.GpuModel(fixed_s=0.01, per_token_s=1e-5)
    assert model.batch_seconds([]) == 0.0
    assert model.batch_seconds([100]) == pytest.approx(0.011)
    # Padded: three chunks cost as much as three of the longest.
    assert model.batch_seconds([50, 100, 20]) == pytest.approx(0.01 + 3 * 100 * 1e-5)
    # Full batches amortize the fixed cost: 32 x 150 tokens at 0.07 s/token.
    assert model.full_batch_rate(32, 150, 0.07) == pytest.approx(32 * 150 * 0.07 / (0.01 + 0.048))


def test_simulated_engine_sleeps_and_returns_audio_of_the_model_length() -> None:
    model = bench.GpuModel(fixed_s=0.05, per_token_s=0.0)
    engine = bench.SimulatedGpuEngine(model, 0.07, bench.speech_like(5.0))
    assert engine.batch_defaults.max_batch_size > 1  # batches as the torch engine does on CUDA
    items = [
        SynthesisItem(tokens=(1,) * 100, style=np.zeros(256, np.float32), speed=1.0),
        SynthesisItem(tokens=(1,) * 40, style=np.zeros(256, np.float32), speed=2.0),
    ]
    ready: list[int] = []
    started = time.perf_counter()
    audio = engine.synthesize(items, on_ready=lambda index, _: ready.append(index))
    assert time.perf_counter() - started >= 0.05
    assert [len(piece.samples) for piece in audio] == [int(100 * 0.07 * 24000), int(40 * 0.07 / 2 * 24000)]
    assert ready == [0, 1]
    assert all(piece.samples.dtype == np.float32 and np.abs(piece.samples).max() > 0.05 for piece in audio)


def test_speech_like_audio_is_bounded_and_not_a_pure_tone() -> None:
    audio = bench.speech_like(2.0)
    assert len(audio) == 48000
    assert audio.dtype == np.float32
    assert np.abs(audio).max() <= 1.0
    spectrum = np.abs(np.fft.rfft(audio))
    assert (spectrum > spectrum.max() * 0.1).sum() > 10  # many strong components


def test_cores_summary_takes_the_fullest_server_level_per_format() -> None:
    report = {
        "g2p": {"cores_for_target": 12.5},
        "encode": {"pcm": {"cores_for_target": 0.1}, "mp3": {"cores_for_target": 3.0}},
        "server": [
            {"format": "pcm", "concurrency": 16, "cores_for_target": 30.0},
            {"format": "pcm", "concurrency": 64, "cores_for_target": 20.0},
            {"format": "mp3", "concurrency": 16, "cores_for_target": 40.0},
        ],
    }
    assert bench.cores_summary(report) == {
        "g2p": 12.5,
        "encode": {"pcm": 0.1, "mp3": 3.0},
        "server": {"pcm": 20.0, "mp3": 40.0},
    }
