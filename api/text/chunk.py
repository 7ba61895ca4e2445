"""Packing phonemized words into model chunks by token count. Pure: no G2P, no model.

Targets: a normal chunk closes at a sentence end once it holds `target_min` tokens, or at a clause
boundary once it holds `target_max`; it never exceeds `hard_max` (cut at the last sentence end, clause
boundary or word boundary that fits), and so never exceeds the model's limit (510) either: a single
absurd word longer than `hard_max` is cut hard. The first chunk closes at the first sentence or clause
boundary after `first_budget` tokens, so the first audio is short and fast; a first sentence that runs
past `first_max` tokens without one is cut at a phrase break instead (a comma, else before a conjunction,
relative word or preposition such as "and", "that", "from", else the last word that fits), because the
first chunk's synthesis is the time to first audio. A later chunk that closes with fewer than `tail_min`
tokens of text after it takes that short tail in, within `hard_max`: a last sentence of a few words is
not a chunk of its own (each chunk costs the engine a fixed part, and its trimmed edges). Words are never
dropped or reordered.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from api.weights.layout import MAX_PHONEMES

SENTENCE_ENDS = frozenset(".!?…")
CLAUSE_ENDS = frozenset(",;:—–")
CLOSERS = frozenset("\"'”’)]»")
# English words a speaker may pause before, where a long first sentence is cut when it must be: clause
# openers first, then prepositions (not those that bind to the word before, like "of" or "than").
# fmt: off
CLAUSE_OPENERS = frozenset((
    "after", "although", "and", "as", "because", "before", "but", "if", "nor", "once", "or", "since", "so",
    "that", "though", "unless", "until", "when", "whenever", "where", "whereas", "wherever", "whether",
    "which", "while", "who", "whom", "whose", "yet",
))
PREPOSITIONS = frozenset((
    "about", "above", "across", "against", "along", "among", "around", "at", "behind", "below", "beneath",
    "beside", "besides", "between", "beyond", "by", "despite", "during", "except", "for", "from", "in",
    "inside", "into", "near", "on", "onto", "outside", "over", "past", "through", "throughout", "till",
    "to", "toward", "towards", "under", "underneath", "unlike", "upon", "via", "with", "within", "without",
))
# fmt: on


@dataclass(frozen=True)
class Word:
    """One G2P token: its text, its phonemes, whether whitespace follows it, and the [start, end) span of
    the user's input it came from (None until located, or when it cannot be)."""

    text: str
    phonemes: str
    space: bool = True
    origin: tuple[int, int] | None = None

    @property
    def size(self) -> int:
        return len(self.phonemes) + (1 if self.space else 0)


@dataclass(frozen=True)
class ChunkLimits:
    first_budget: int = 40
    target_min: int = 175
    target_max: int = 250
    hard_max: int = 450
    first_max: int | None = None  # None: the first chunk is bounded by hard_max only
    tail_min: int = 0  # 0: a later chunk closes as soon as it may, whatever is left after it

    def __post_init__(self) -> None:
        if not 0 < self.first_budget <= self.first_cap <= self.hard_max:
            raise ValueError("need 0 < first_budget <= first_max <= hard_max")
        if not 0 < self.target_min <= self.target_max <= self.hard_max <= MAX_PHONEMES:
            raise ValueError(f"need 0 < target_min <= target_max <= hard_max <= {MAX_PHONEMES}")
        if not 0 <= self.tail_min <= self.target_min:
            raise ValueError("need 0 <= tail_min <= target_min")

    @property
    def first_cap(self) -> int:
        return self.hard_max if self.first_max is None else self.first_max


def phoneme_words(phonemes: str) -> list[Word]:
    """A phoneme string's space-separated words, as G2P words whose text is their phonemes."""
    parts = phonemes.split()
    return [Word(part, part, index < len(parts) - 1) for index, part in enumerate(parts)]


def phonemes_of(words: Iterable[Word]) -> str:
    return "".join(word.phonemes + (" " if word.space else "") for word in words).strip()


def text_of(words: Iterable[Word]) -> str:
    return "".join(word.text + (" " if word.space else "") for word in words).strip()


def _ends(word: Word, marks: frozenset[str]) -> bool:
    stripped = word.phonemes.rstrip("".join(CLOSERS))
    return bool(stripped) and stripped[-1] in marks


class Ending(str, enum.Enum):
    """How a chunk ends, which decides the pause after it."""

    SENTENCE = "sentence"
    CLAUSE = "clause"
    NONE = "none"


def ending_of(chunk: list[Word]) -> Ending:
    last = next((word for word in reversed(chunk) if word.phonemes), None)
    if last is None:
        return Ending.NONE
    if is_sentence_end(last):
        return Ending.SENTENCE
    return Ending.CLAUSE if is_boundary(last) else Ending.NONE


def is_sentence_end(word: Word) -> bool:
    return _ends(word, SENTENCE_ENDS)


def is_boundary(word: Word) -> bool:
    return _ends(word, SENTENCE_ENDS | CLAUSE_ENDS)


class Chunker:
    """The streaming form of the packing rules: push words one at a time, get chunks when they close. A
    later chunk that closes is held until `tail_min` tokens follow it, so that a short tail can join it."""

    def __init__(self, limits: ChunkLimits) -> None:
        self.limits = limits
        self._buffer: list[Word] = []
        self._size = 0
        self._first = True
        self._held: list[Word] = []

    def push(self, word: Word) -> list[list[Word]]:
        closed = []
        for piece in _split_giants([word], self.limits.hard_max):
            closed.extend(self._push_one(piece))
        return closed

    def flush(self) -> list[list[Word]]:
        """Close the chunk in progress (end of text, or a pause): what comes next starts afresh. A held
        chunk takes the words after it in when together they fit in hard_max."""
        held, self._held = self._held, []
        chunk, self._buffer, size, self._size = self._buffer, [], self._size, 0
        if held and chunk and sum(word.size for word in held) + size <= self.limits.hard_max:
            held, chunk = held + chunk, []
        if held or chunk:
            self._first = False
        return [closed for closed in (held, chunk) if closed]

    def _close(self) -> list[list[Word]]:
        """Close the chunk in progress at a boundary the targets chose: a later one is held when it may
        still take a tail in."""
        if self._first or not self.limits.tail_min:
            return self.flush()
        # Nothing is held now: a held chunk goes once tail_min (<= target_min) tokens follow it, before
        # the buffer can close again.
        self._held, self._buffer, self._size = self._buffer, [], 0
        return []

    def _push_one(self, word: Word) -> list[list[Word]]:
        closed = []
        self._buffer.append(word)
        self._size += word.size
        if self._held and self._size >= self.limits.tail_min:
            closed.append(self._held)
            self._held = []
        if self._first and self._size > self.limits.first_cap:
            cut = _first_cut(self._buffer, self.limits)
            closed.append(self._buffer[:cut])
            self._buffer, self._first = self._buffer[cut:], False
            self._size = sum(w.size for w in self._buffer)
        while self._size > self.limits.hard_max:
            cut = _best_cut(self._buffer, self.limits)
            closed.append(self._buffer[:cut])
            self._buffer, self._first = self._buffer[cut:], False
            self._size = sum(w.size for w in self._buffer)
        if _closes(word, self._size, self._first, self.limits):
            closed.extend(self._close())
        return closed


def chunk_words(words: Iterable[Word], limits: ChunkLimits | None = None) -> Iterator[list[Word]]:
    """Group words into chunks (see the module docstring). Streams: holds at most the chunk in progress
    and one closed chunk waiting for its tail."""
    chunker = Chunker(limits or ChunkLimits())
    for word in words:
        yield from chunker.push(word)
    yield from chunker.flush()


def _closes(word: Word, size: int, first: bool, limits: ChunkLimits) -> bool:
    if first:
        return size >= limits.first_budget and is_boundary(word)
    if size >= limits.target_max:
        return is_boundary(word)
    return size >= limits.target_min and is_sentence_end(word)


def _best_cut(buffer: list[Word], limits: ChunkLimits) -> int:
    """Where to cut an over-full buffer: after the last sentence end, then clause boundary, then word
    that keeps the chunk within hard_max; the chunk gets at least one word."""
    sizes = []
    total = 0
    for word in buffer:
        total += word.size
        sizes.append(total)
    fits = [i + 1 for i, s in enumerate(sizes) if s <= limits.hard_max]
    for test in (is_sentence_end, is_boundary):
        good = [cut for cut in fits if test(buffer[cut - 1]) and sizes[cut - 1] >= limits.target_min // 2]
        if good:
            return good[-1]
    return fits[-1] if fits else 1


def _first_cut(buffer: list[Word], limits: ChunkLimits) -> int:
    """Where to cut a first sentence that ran past first_max: after the last clause boundary, else before
    the last clause opener, else before the last preposition, else after the last word that fits; each
    cut leaves the first chunk at least half the first budget when it can."""
    sizes = []
    total = 0
    for word in buffer:
        total += word.size
        sizes.append(total)
    fits = [i + 1 for i, s in enumerate(sizes) if s <= limits.first_cap]
    if not fits:
        return 1
    spaced = [cut for cut in fits if cut < len(buffer) and buffer[cut - 1].space]
    sized = [cut for cut in spaced if sizes[cut - 1] >= limits.first_budget // 2] or spaced
    if good := [cut for cut in sized if is_boundary(buffer[cut - 1])]:
        return good[-1]
    for opener in (CLAUSE_OPENERS, PREPOSITIONS):
        if good := [cut for cut in sized if buffer[cut].text.lower().strip("\"'“‘(") in opener]:
            return good[-1]
    return sized[-1] if sized else fits[-1]


def _split_giants(words: Iterable[Word], limit: int) -> Iterator[Word]:
    """A word whose phonemes alone exceed the chunk limit is cut into pieces (the only hard cut)."""
    for word in words:
        if len(word.phonemes) <= limit:
            yield word
            continue
        pieces = [word.phonemes[i : i + limit] for i in range(0, len(word.phonemes), limit)]
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            yield Word(word.text if index == 0 else "", piece, word.space if last else False)
