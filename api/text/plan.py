"""From request text to a stream of planned chunks (token ids) and pauses, phonemizing as it goes. Each
chunk also says, per G2P word, which of its tokens are that word's sounds and which span of the user's
input the word came from: word timings follow from the model's durations."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial

from api.text.chunk import Chunker, ChunkLimits, Ending, Word, ending_of
from api.text.pauses import Pause, split_pauses
from api.text.split import group_sentences
from api.text.tracked import Tracked

Span = tuple[int, int]


@dataclass(frozen=True)
class PlannedWord:
    """A G2P word of a chunk: the span of the input it came from (None when it could not be found) and
    the [first, last) range of the chunk's tokens that are its sounds (None for punctuation alone)."""

    origin: Span | None
    tokens: Span | None


@dataclass(frozen=True)
class PlannedChunk:
    """One model chunk: its token ids, how it ends (for the pause after it), its text (for logs) and its
    words (for timings)."""

    tokens: tuple[int, ...]
    ending: Ending
    text: str
    words: tuple[PlannedWord, ...] = ()
    voice: str | None = None  # None: the request's own voice
    rate: float = 1.0  # x the request's speed


@dataclass(frozen=True)
class PlanPart:
    """A stretch of text in one voice at one rate, with the G2P of its language; `word_text` says whether
    its G2P words are the text's own words (misaki's English tokens) or phoneme words (espeak-ng)."""

    text: Tracked
    words_of: WordsOf
    word_text: bool = True
    voice: str | None = None
    rate: float = 1.0


@dataclass(frozen=True)
class PlannedPause:
    seconds: float


Planned = PlannedChunk | PlannedPause
SILENT_SYMBOLS = frozenset(" .,!?;:—…\"()“”-'")
WordsOf = Callable[[str], Awaitable[list[Word]]]
# How far past the last word found the next G2P word's text is looked for in the normalized text.
SEARCH_WINDOW = 200


class Locator:
    """Finds G2P words, in order, in the normalized text, and returns the input span each came from."""

    def __init__(self, text: Tracked) -> None:
        self._text = text
        self._cursor = 0

    def word(self, needle: str) -> Span | None:
        """The next occurrence of `needle` near the cursor; None (cursor unmoved) when there is none."""
        if not needle.strip():
            return None
        limit = self._cursor + len(needle) + SEARCH_WINDOW
        at = self._text.text.find(needle, self._cursor, limit)
        if at < 0:
            return None
        self._cursor = at + len(needle)
        return self._text.span(at, self._cursor)

    def piece(self, piece: str) -> Span | None:
        """The input span of a whole G2P piece (for languages whose G2P words are not the text's)."""
        spans = [span for part in piece.split() if (span := self.word(part)) is not None]
        return (spans[0][0], spans[-1][1]) if spans else None


@dataclass(frozen=True)
class Planner:
    """Splits text at pause tags, groups sentences into G2P pieces (the first one short), and packs the
    phonemized words into chunks by token count; G2P happens piece by piece as the consumer pulls."""

    limits: ChunkLimits
    piece_chars: int
    first_piece_chars: int

    async def plan(
        self, text: str | Tracked, vocab: Mapping[str, int], words_of: WordsOf, *, word_text: bool = True
    ) -> AsyncIterator[Planned]:
        """The chunks and pauses of `text` in order, in one voice (`plan_parts` with one part)."""
        tracked = text if isinstance(text, Tracked) else Tracked.of(text)

        async def one() -> AsyncIterator[PlanPart]:
            yield PlanPart(tracked, words_of, word_text)

        async for planned in self.plan_parts(one(), vocab):
            yield planned

    async def plan_parts(
        self, parts: AsyncIterable[PlanPart], vocab: Mapping[str, int]
    ) -> AsyncIterator[Planned]:
        """The chunks and pauses of each part in order; no chunk spans two parts (two speakers or rates)."""
        chunker = Chunker(self.limits)
        first_piece = True
        async for part in parts:
            locator = Locator(part.text)
            chunk_of = partial(self._chunk, vocab=vocab, part=part)
            for segment in split_pauses(part.text.text):
                if isinstance(segment, Pause):
                    for planned in _planned(chunker.flush(), chunk_of):
                        yield planned
                    yield PlannedPause(segment.seconds)
                    continue
                limit = self.first_piece_chars if first_piece else self.piece_chars
                for piece in group_sentences(segment, self.piece_chars, limit):
                    first_piece = False
                    for word in _located(await part.words_of(piece), piece, locator, part.word_text):
                        for planned in _planned(chunker.push(word), chunk_of):
                            yield planned
            for planned in _planned(chunker.flush(), chunk_of):
                yield planned

    @staticmethod
    def _chunk(words: list[Word], *, vocab: Mapping[str, int], part: PlanPart) -> PlannedChunk | None:
        symbols = _symbols(words, vocab)
        if all(symbol in SILENT_SYMBOLS for symbol, _ in symbols):
            return None  # nothing but spaces and punctuation: nothing to speak
        tokens = tuple(vocab[symbol] for symbol, _ in symbols)
        sounds: list[list[int]] = [[] for _ in words]
        for position, (symbol, owner) in enumerate(symbols):
            if symbol not in SILENT_SYMBOLS:
                sounds[owner].append(position)
        planned = tuple(
            PlannedWord(word.origin, (own[0], own[-1] + 1) if own else None)
            for word, own in zip(words, sounds, strict=True)
        )
        text = " ".join(word.text for word in words)
        return PlannedChunk(tokens, ending_of(words), text, planned, voice=part.voice, rate=part.rate)


def _planned(
    chunks: Iterable[list[Word]], chunk_of: Callable[[list[Word]], PlannedChunk | None]
) -> Iterator[PlannedChunk]:
    for chunk in chunks:
        if planned := chunk_of(chunk):
            yield planned


def _symbols(words: list[Word], vocab: Mapping[str, int]) -> list[tuple[str, int]]:
    """`phonemes_of(words)`'s symbols that the model knows, each with the index of its word."""
    owned = [
        (symbol, index)
        for index, word in enumerate(words)
        for symbol in word.phonemes + (" " if word.space else "")
    ]
    start, end = 0, len(owned)
    while start < end and owned[start][0].isspace():
        start += 1
    while end > start and owned[end - 1][0].isspace():
        end -= 1
    return [(symbol, index) for symbol, index in owned[start:end] if symbol in vocab]


def _located(words: list[Word], piece: str, locator: Locator, word_text: bool) -> list[Word]:
    """The words with their input spans: each its own, or the whole piece's."""
    if word_text:
        return [dataclasses.replace(word, origin=locator.word(word.text)) for word in words]
    span = locator.piece(piece)
    return [dataclasses.replace(word, origin=span) for word in words]
