"""Chunk joins: consistent trimming, fades, punctuation pauses, no click at the seams."""

from __future__ import annotations

import numpy as np
import pytest

from api.audio.joins import PAUSE_AFTER_S, fade_edges, shape_chunk, trim_silence
from api.text.chunk import Ending

RATE = 24000


def speechlike(seconds: float, lead: float = 0.2, tail: float = 0.3, seed: int = 0) -> np.ndarray:
    """A voiced burst (a few harmonics, enveloped) between stretches of near-silence."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    voiced = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) / k for k, f in enumerate((140, 280, 420), 1))
    voiced *= 0.3 * np.hanning(len(t)) ** 0.2
    quiet = lambda s: 0.001 * rng.standard_normal(int(s * RATE))  # noqa: E731
    return np.concatenate([quiet(lead), voiced, quiet(tail)]).astype(np.float32)


def test_trim_keeps_speech_and_a_margin() -> None:
    audio = speechlike(1.0, lead=0.5, tail=0.7)
    trimmed = trim_silence(audio, RATE)
    assert 1.0 <= len(trimmed) / RATE <= 1.0 + 2 * 0.04 + 0.01


def test_trim_is_consistent_across_chunks() -> None:
    """Different amounts of model silence come out as the same edges."""
    a = trim_silence(speechlike(1.0, lead=0.1, tail=0.2), RATE)
    b = trim_silence(speechlike(1.0, lead=0.4, tail=0.6), RATE)
    assert abs(len(a) - len(b)) < 0.01 * RATE


def test_silent_audio_is_left_alone() -> None:
    assert len(trim_silence(np.zeros(1000, np.float32), RATE)) == 1000


def test_fades_start_and_end_at_zero() -> None:
    faded = fade_edges(np.ones(2400, np.float32), RATE)
    assert faded[0] == 0.0
    assert abs(faded[-1]) < 0.01
    assert faded[1200] == 1.0


@pytest.mark.parametrize("ending", list(Ending))
def test_pause_follows_the_punctuation(ending: Ending) -> None:
    shaped = shape_chunk(speechlike(1.0), ending, RATE)
    trailing = len(shaped) - len(fade_edges(trim_silence(speechlike(1.0), RATE), RATE))
    assert trailing == round(PAUSE_AFTER_S[ending] * RATE)


def test_faster_speech_gets_shorter_pauses() -> None:
    normal = shape_chunk(speechlike(1.0), Ending.SENTENCE, RATE)
    fast = shape_chunk(speechlike(1.0), Ending.SENTENCE, RATE, speed=2.0)
    assert len(normal) - len(fast) == round(PAUSE_AFTER_S[Ending.SENTENCE] * RATE / 2)


def test_no_discontinuity_at_the_joins() -> None:
    """Chunks that start and end mid-waveform (the worst case) join without a spike in the first
    difference above what the signal itself has."""
    chunks = []
    for seed in range(4):
        burst = speechlike(0.6, lead=0.0, tail=0.0, seed=seed)
        chunks.append(shape_chunk(burst[1000:-1000], Ending.CLAUSE, RATE))  # cut mid-waveform
    joined = np.concatenate(chunks)
    steps = np.abs(np.diff(joined))
    seams = np.cumsum([len(chunk) for chunk in chunks])[:-1]
    seam_steps = [steps[max(seam - 48, 0) : seam + 48].max() for seam in seams]
    start_steps = [steps[max(seam - 48, 0) : seam + 48].max() for seam in [0]]
    signal_level = np.percentile(steps, 99)
    assert max(seam_steps + start_steps) <= signal_level
    # Without the fades the same cut would click: the test can tell.
    raw = np.concatenate([speechlike(0.6, 0, 0, seed)[1000:-1000] for seed in range(4)])
    raw_seams = np.cumsum([len(speechlike(0.6, 0, 0, s)[1000:-1000]) for s in range(4)])[:-1]
    assert max(np.abs(np.diff(raw))[seam - 1] for seam in raw_seams) > signal_level
