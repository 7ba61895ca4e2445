"""Joining chunk audio without clicks or uneven gaps: trim the model's own edge silence the same way
for every chunk, fade the edges, then pad with a pause that follows the chunk's last punctuation."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from api.text.chunk import Ending

# Below this fraction of the chunk's peak, edge samples count as silence.
SILENCE_RATIO = 0.02
# Kept around speech when trimming, so soft onsets and releases are not clipped.
MARGIN_S = 0.04
FADE_S = 0.005


PAUSE_AFTER_S = {Ending.SENTENCE: 0.30, Ending.CLAUSE: 0.15, Ending.NONE: 0.05}


def speech_level(samples: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Which samples are at speech level (a fraction of the peak); none of all-silent audio."""
    level = np.abs(samples)
    peak = float(level.max()) if len(level) else 0.0
    return level >= SILENCE_RATIO * peak if peak > 0.0 else np.zeros(len(samples), dtype=bool)


def trim_bounds(samples: np.ndarray[Any, Any], sample_rate: int) -> tuple[int, int]:
    """[start, end) of the samples kept when leading and trailing silence is cut, with a short margin;
    all of them for all-silent audio."""
    return _kept_bounds(speech_level(samples), sample_rate)


def _kept_bounds(voiced: np.ndarray[Any, Any], sample_rate: int) -> tuple[int, int]:
    positions = np.flatnonzero(voiced)
    if len(positions) == 0:
        return 0, len(voiced)
    margin = int(MARGIN_S * sample_rate)
    return max(int(positions[0]) - margin, 0), min(int(positions[-1]) + 1 + margin, len(voiced))


def trim_silence(samples: np.ndarray[Any, Any], sample_rate: int) -> np.ndarray[Any, Any]:
    """Cut leading and trailing silence, keeping a short margin; all-silent audio stays as it is."""
    start, end = trim_bounds(samples, sample_rate)
    return samples[start:end]


def fade_edges(samples: np.ndarray[Any, Any], sample_rate: int) -> np.ndarray[Any, Any]:
    """Short linear fades in and out, so a chunk starts and ends at zero."""
    length = min(int(FADE_S * sample_rate), len(samples) // 2)
    if length == 0:
        return samples
    faded = samples.astype(np.float32, copy=True)
    ramp = np.linspace(0.0, 1.0, length, endpoint=False, dtype=np.float32)
    faded[:length] *= ramp
    faded[-length:] *= ramp[::-1]
    return faded


def silence(seconds: float, sample_rate: int) -> np.ndarray[Any, Any]:
    return np.zeros(round(seconds * sample_rate), dtype=np.float32)


def shape_chunk(
    samples: np.ndarray[Any, Any], ending: Ending, sample_rate: int, *, speed: float = 1.0
) -> np.ndarray[Any, Any]:
    """A chunk ready to be joined: trimmed, faded, followed by the pause its ending calls for (shorter
    when the speech is faster)."""
    return shaped_chunk(samples, ending, sample_rate, speed=speed).samples


class ShapedChunk(NamedTuple):
    """A chunk's audio ready to be joined, the [start, end) of the model's samples it keeps, and which of
    the model's samples are at speech level."""

    samples: np.ndarray[Any, Any]
    start: int
    end: int
    voiced: np.ndarray[Any, Any]


def shaped_chunk(
    samples: np.ndarray[Any, Any], ending: Ending, sample_rate: int, *, speed: float = 1.0, pause: bool = True
) -> ShapedChunk:
    """`shape_chunk`'s audio (without the pause when `pause` is False: an explicit pause follows), with
    where it lies in the model's audio (a time in the model's audio is `start` samples earlier in it)."""
    voiced = speech_level(samples)
    start, end = _kept_bounds(voiced, sample_rate)
    shaped = fade_edges(samples[start:end], sample_rate)
    seconds = PAUSE_AFTER_S[ending] / speed if pause else 0.0
    return ShapedChunk(np.concatenate([shaped, silence(seconds, sample_rate)]), start, end, voiced)
