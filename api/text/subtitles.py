"""Subtitles from word timestamps: timed words become cues, rendered as SRT or WebVTT. Pure: no I/O.

Grouping words into cues (`group_cues`):

- Words are taken in order and never dropped, reordered or duplicated: joining every cue's lines with
  single spaces gives back the words joined with single spaces.
- A cue closes after a word that ends a sentence (its last character, past any closing quotes or
  brackets, is one of `. ! ? …`), and before a word that follows a silence of `PAUSE_SPLIT` seconds or
  more, so no text stays on screen over a pause.
- A cue also closes when the next word would not fit: the text would need more than `max_lines` lines
  of `max_line_chars`, or the cue would last longer than `max_duration` (first word's start to the next
  word's end). When it closes for either kind of length and a word ending in clause punctuation
  (`, ; : — –`) lies in the second half of its text, the words after the last such word move on to the
  next cue, so cues tend to end where a reader pauses.
- A single word longer than `max_duration` or `max_line_chars` still makes a cue (or a line) of its own;
  a word is never cut.
- Lines are balanced: a cue takes as few lines as greedy filling needs, and the break points are those
  that make the longest line shortest, the lower lines the fuller ones on a tie (the BBC's "bottom
  heavy" guideline). A word longer than `max_line_chars` gets a line of its own.
- Times: a cue starts at its first word's start and ends at its last word's end; a cue shorter than
  `min_duration` is extended, but never past the next cue's start. Cues never overlap, never start
  before 0, and are in increasing order (words that overlap in time are clipped to keep this so).

Rendering (`to_srt`, `to_vtt`): times are rounded half up to milliseconds and never written negative.
A cue line never holds `-->` (it would read as a timing line; it becomes `→`) and whitespace runs in a
line, newlines included, become one space, so a line can neither be empty nor end the cue early. WebVTT
escapes `&`, `<` and `>`, as its spec requires; SRT text is written as is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from api.text.chunk import CLAUSE_ENDS, CLOSERS, SENTENCE_ENDS

# A silence this long between two words is a pause worth clearing the screen for.
PAUSE_SPLIT = 1.0
# The cue timing separator: inside cue text a player would take the line for a timing line.
TIMING_ARROW = "-->"
SubtitleFormat = Literal["srt", "vtt"]


@dataclass(frozen=True)
class TimedWord:
    """One spoken word as the user wrote it (punctuation attached) and when it is heard, in seconds."""

    word: str
    start_time: float
    end_time: float

    def __post_init__(self) -> None:
        if not self.word.strip():
            raise ValueError("a timed word needs visible text")
        if self.end_time < self.start_time:
            raise ValueError(
                f"word {self.word!r} ends ({self.end_time}) before it starts ({self.start_time})"
            )


@dataclass(frozen=True)
class CueLimits:
    """How much text and time one cue may hold, and the least time it stays on screen."""

    max_line_chars: int = 42  # Netflix/BBC-style line length
    max_lines: int = 2
    max_duration: float = 7.0
    min_duration: float = 0.8

    def __post_init__(self) -> None:
        if self.max_lines <= 0 or self.max_duration <= 0 or self.min_duration <= 0:
            raise ValueError("max_lines, max_duration and min_duration must be positive")
        if self.max_line_chars < 10:
            raise ValueError(f"max_line_chars must be at least 10, got {self.max_line_chars}")
        if self.min_duration > self.max_duration:
            raise ValueError(f"min_duration ({self.min_duration}) exceeds max_duration ({self.max_duration})")


@dataclass(frozen=True)
class Cue:
    """One subtitle on screen: when it shows, when it goes, and its lines of text (at least one)."""

    start_time: float
    end_time: float
    lines: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.lines or not all(line.strip() for line in self.lines):
            raise ValueError("a cue needs at least one line and no blank line")
        if self.end_time < self.start_time:
            raise ValueError(f"cue ends ({self.end_time}) before it starts ({self.start_time})")


def group_cues(words: Sequence[TimedWord], limits: CueLimits = CueLimits()) -> list[Cue]:
    groups = _group_words(words, limits)
    spans = _spans(groups, limits.min_duration)
    return [
        Cue(start, end, _break_lines([word.word for word in group], limits))
        for group, (start, end) in zip(groups, spans, strict=True)
    ]


def to_srt(cues: Sequence[Cue]) -> str:
    blocks = [f"{number}\n{_cue_body(cue, ',', vtt=False)}" for number, cue in enumerate(cues, 1)]
    return "\n\n".join(blocks) + "\n" if blocks else ""


def to_vtt(cues: Sequence[Cue]) -> str:
    return "WEBVTT\n" + "".join(f"\n{_cue_body(cue, '.', vtt=True)}\n" for cue in cues)


_RENDERERS: dict[str, Callable[[Sequence[Cue]], str]] = {"srt": to_srt, "vtt": to_vtt}


def render(words: Sequence[TimedWord], fmt: SubtitleFormat, limits: CueLimits = CueLimits()) -> str:
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown subtitle format {fmt!r}; expected one of {sorted(_RENDERERS)}")
    return renderer(group_cues(words, limits))


# Grouping


def _group_words(words: Sequence[TimedWord], limits: CueLimits) -> list[list[TimedWord]]:
    groups: list[list[TimedWord]] = []
    cue: list[TimedWord] = []
    for word in words:
        if cue and _breaks_before(cue[-1], word):
            groups.append(cue)
            cue = []
        # Words carried over from a clause back-off may still not fit with this word: close again.
        while cue and not _fits([*cue, word], limits):
            kept, cue = _split_at_clause(cue)
            groups.append(kept)
        cue.append(word)
    if cue:
        groups.append(cue)
    return groups


def _breaks_before(previous: TimedWord, word: TimedWord) -> bool:
    return _ends_with(previous.word, SENTENCE_ENDS) or word.start_time - previous.end_time >= PAUSE_SPLIT


def _fits(group: Sequence[TimedWord], limits: CueLimits) -> bool:
    duration = group[-1].end_time - group[0].start_time
    lines = _fill([word.word for word in group], limits.max_line_chars)
    return duration <= limits.max_duration and len(lines) <= limits.max_lines


def _split_at_clause(cue: list[TimedWord]) -> tuple[list[TimedWord], list[TimedWord]]:
    """(words to close the cue with, words to carry to the next cue): cut after the last clause
    punctuation in the second half of the cue's text, else keep the whole cue."""
    lengths = [len(word.word) for word in cue]
    total = sum(lengths) + len(cue) - 1
    for index in range(len(cue) - 1, -1, -1):
        kept_chars = sum(lengths[: index + 1]) + index
        if 2 * kept_chars <= total:
            break
        if _ends_with(cue[index].word, CLAUSE_ENDS):
            return cue[: index + 1], cue[index + 1 :]
    return cue, []


def _ends_with(text: str, marks: frozenset[str]) -> bool:
    stripped = text.rstrip("".join(CLOSERS))
    return bool(stripped) and stripped[-1] in marks


def _spans(groups: Sequence[Sequence[TimedWord]], min_duration: float) -> list[tuple[float, float]]:
    if not groups:
        return []
    # Running maximum: a cue never starts before 0 or before the one ahead of it, whatever the input.
    starts = list(accumulate((group[0].start_time for group in groups), max, initial=0.0))[1:]
    next_starts = [*starts[1:], math.inf]
    spans = []
    for group, start, next_start in zip(groups, starts, next_starts, strict=True):
        end = max(group[-1].end_time, start, min(start + min_duration, next_start))
        spans.append((start, min(end, next_start)))
    return spans


# Line breaking


def _break_lines(texts: Sequence[str], limits: CueLimits) -> tuple[str, ...]:
    lines = _balanced(texts, limits.max_line_chars)
    return tuple(" ".join(line) for line in lines)


def _balanced(texts: Sequence[str], max_chars: int) -> list[list[str]]:
    """The fewest lines greedy filling needs, broken so the longest line is as short as it can be.

    Filling from the end at the narrowest width that still gives that many lines leaves the first line
    the short one on a tie. Single-word lines may exceed the width: such a word can go nowhere else.
    """
    count = len(_fill(texts, max_chars))
    for width in range(1, max_chars):
        lines = _fill_from_end(texts, width)
        if len(lines) <= count:
            return lines
    return _fill_from_end(texts, max_chars)


def _fill(texts: Sequence[str], width: int) -> list[list[str]]:
    """Greedy filling, which gives the fewest lines: a word joins the line while it fits."""
    lines: list[list[str]] = []
    length = 0
    for text in texts:
        if lines and length + 1 + len(text) <= width:
            lines[-1].append(text)
            length += 1 + len(text)
        else:
            lines.append([text])
            length = len(text)
    return lines


def _fill_from_end(texts: Sequence[str], width: int) -> list[list[str]]:
    return [line[::-1] for line in reversed(_fill(texts[::-1], width))]


# Rendering


def _cue_body(cue: Cue, decimal_mark: str, *, vtt: bool) -> str:
    timing = (
        f"{_timestamp(cue.start_time, decimal_mark)} {TIMING_ARROW} {_timestamp(cue.end_time, decimal_mark)}"
    )
    return "\n".join([timing, *(_clean_line(line, vtt=vtt) for line in cue.lines)])


def _timestamp(seconds: float, decimal_mark: str) -> str:
    # floor(x + 0.5) rounds half up; round() would round half to even.
    millis = max(0, math.floor(seconds * 1000 + 0.5))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_mark}{millis:03d}"


def _clean_line(line: str, *, vtt: bool) -> str:
    text = " ".join(line.split()).replace(TIMING_ARROW, "→")
    if vtt:
        text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text
