"""Word timings in the words the user wrote.

The model says how many 25 ms frames each phoneme token gets; the planner says which tokens are each G2P
word's sounds and which span of the input each G2P word came from (through normalization: the nine spoken
words of '$3,497.50' all come from '$3,497.50'). Here a chunk's durations become times in the audio
actually sent, and timed G2P words become the input's words.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from api.engine.base import SAMPLES_PER_FRAME
from api.text.inline import BRACKET_TAG, MISAKI_LINK
from api.text.plan import PlannedWord, Span

# misaki's `[word](/phonemes/)` is one word, shown as its text; pause and voice tags are not words.
_INPUT_WORD = re.compile(rf"{MISAKI_LINK.pattern}|{BRACKET_TAG.pattern}|\S+", re.IGNORECASE)


@dataclass(frozen=True)
class WordTime:
    """One input word (or several, where the reading joined them) and when it is spoken, in seconds."""

    word: str
    start_time: float
    end_time: float


@dataclass(frozen=True)
class Timed:
    """A spoken G2P word: the input span it came from (None if unknown) and its time in the output."""

    origin: Span | None
    start: float
    end: float


def input_words(text: str) -> list[Span]:
    """The spans of the input's words: whitespace-separated, a misaki bracket form whole, no pause tags."""
    return [match.span() for match in _INPUT_WORD.finditer(text) if not BRACKET_TAG.fullmatch(match.group())]


def chunk_timings(
    words: Sequence[PlannedWord],
    durations: np.ndarray[Any, Any],
    *,
    trimmed: int,
    kept: int,
    offset: int,
    sample_rate: int,
    speed: float = 1.0,
    voiced: np.ndarray[Any, Any] | None = None,
) -> list[Timed]:
    """Times of a chunk's spoken words in the output: the model's audio starts `trimmed` samples before
    the shaped chunk, which keeps `kept` samples of it and starts `offset` samples into the output;
    `speed` is the one the chunk was made at; `voiced` says which of the model's samples are at speech
    level, where known."""
    # Frame k of the model's audio starts at sample k * SAMPLES_PER_FRAME; durations[0] is the boundary
    # token before the first phoneme.
    edges = (np.concatenate([[0], np.cumsum(durations)]) * SAMPLES_PER_FRAME).astype(np.int64)
    spoken = [
        (word.origin, int(edges[word.tokens[0] + 1]), int(edges[word.tokens[1] + 1]))
        for word in words
        if word.tokens is not None
    ]

    def seconds(sample: int) -> float:
        return (offset + min(max(sample - trimmed, 0), kept)) / sample_rate

    lead = round(sound_lead(speed) * sample_rate)
    onsets = None if voiced is None else _onsets_after_pauses(voiced, int(MIN_PAUSE_S * sample_rate))
    timed = []
    previous_end = 0
    said_until = 0  # where the previous word's time ends: an onset moved it later than its frames say
    for origin, frames_start, frames_end in spoken:
        start, end = max(frames_start - lead, 0), max(frames_end - lead, 0)
        if onsets is not None:
            # The last onset after a pause between the previous word's frames and this word's, if any.
            last = int(np.searchsorted(onsets, frames_start)) - 1
            if last >= 0 and onsets[last] >= previous_end:
                start = int(onsets[last])
        start = max(start, said_until)
        said_until = max(end, start)
        timed.append(Timed(origin, seconds(start), seconds(said_until)))
        previous_end = frames_end
    return timed


# The model's sound runs ahead of its frames: a word is heard from about 95 ms before its first phoneme's
# frames begin at speed 1, 104 ms at 0.8 and 87 ms at 1.3 (the onsets of fricatives in the audio, three
# voices, and a forced aligner; docs/api.md#word-timestamps): a fixed part and a part that stretches with
# the phonemes.
LEAD_FIXED_S = 0.060
LEAD_STRETCHED_S = 0.035


def sound_lead(speed: float) -> float:
    """How far, in seconds, a chunk made at `speed` sounds ahead of its frames."""
    return LEAD_FIXED_S + LEAD_STRETCHED_S / speed


# A word after a pause (the chunk's start, a comma's silence) sounds from the end of the silence on: there
# the audio's level says where it begins (20-140 ms before its frames, read from the audio's level), more
# exactly than the lead. A pause is 100 ms or more of silence, longer than a stop consonant's closure.
MIN_PAUSE_S = 0.1


def _onsets_after_pauses(voiced: np.ndarray[Any, Any], gap: int) -> np.ndarray[Any, Any]:
    """The samples at speech level that follow `gap` or more silent samples (or the start), in order."""
    positions = np.flatnonzero(voiced)
    silences = np.diff(positions, prepend=-1) - 1
    return positions[silences >= gap]


@dataclass
class _Item:
    first: int  # input word indices, inclusive
    last: int
    start: float
    end: float


class Captions:
    """Builds the caption items of one input from its spoken words, in order.

    An item is one input word, or several where one spoken word came from several (a date, a phone
    number); punctuation-only and unspoken input words join the item before them (the first item takes
    any before it). Every input word ends up in exactly one item, in order. An item is complete once a
    spoken word of a later input word arrives (`add`, or `close_before` when the next chunk is known)
    or at `finish`.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._spans = input_words(text)
        self._starts = [start for start, _ in self._spans]
        self._ends = [end for _, end in self._spans]
        self._open: _Item | None = None
        self._emitted = 0  # input words already in emitted items
        self._early: tuple[float, float] | None = None  # times of unplaced words before the first item

    def add(self, timed: Iterable[Timed]) -> list[WordTime]:
        """Take a chunk's spoken words; returns the items they complete."""
        done: list[WordTime] = []
        for word in timed:
            done += self._add(word)
        return done

    def close_before(self, origin: Span | None) -> list[WordTime]:
        """The open item, if the next spoken word (from `origin`) belongs to a later input word."""
        words = self._words_of(origin)
        if self._open is None or words is None or words[0] <= self._open.last:
            return []
        return [self._close(words[0] - 1)]

    def finish(self) -> list[WordTime]:
        """Whatever is left: the open item takes every input word after it."""
        if self._open is None:
            return []
        return [self._close(len(self._spans) - 1)]

    def _add(self, word: Timed) -> list[WordTime]:
        words = self._words_of(word.origin)
        item = self._open
        if words is None:
            if item is None:
                start, end = self._early or (word.start, word.end)
                self._early = (min(start, word.start), max(end, word.end))
            else:
                item.start, item.end = min(item.start, word.start), max(item.end, word.end)
            return []
        if item is not None and words[0] <= item.last:
            item.last = max(item.last, words[1])
            item.start, item.end = min(item.start, word.start), max(item.end, word.end)
            return []
        done = [self._close(words[0] - 1)] if item is not None else []
        start, end = word.start, word.end
        if self._early is not None:
            start, end = min(start, self._early[0]), max(end, self._early[1])
            self._early = None
        self._open = _Item(self._emitted if item is None else words[0], words[1], start, end)
        return done

    def _close(self, last: int) -> WordTime:
        item = self._open
        assert item is not None
        self._open = None
        self._emitted = last + 1
        start, end = self._spans[item.first][0], self._spans[max(last, item.last)][1]
        return WordTime(self._display(start, end), round(item.start, 3), round(max(item.end, item.start), 3))

    def _words_of(self, origin: Span | None) -> tuple[int, int] | None:
        """The indices of the first and last input words `origin` overlaps; None if none."""
        if origin is None:
            return None
        first = bisect_right(self._ends, origin[0])
        last = bisect_left(self._starts, origin[1]) - 1
        if first > last:
            return None
        return max(first, self._emitted), max(last, self._emitted)

    def _display(self, start: int, end: int) -> str:
        text = BRACKET_TAG.sub(" ", self._text[start:end])
        return " ".join(MISAKI_LINK.sub(r"\1", text).split())
