"""From request text to a stream of planned chunks (token ids) and pauses, phonemizing as it goes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from api.text.chunk import Chunker, ChunkLimits, Ending, Word, ending_of, phonemes_of
from api.text.pauses import Pause, split_pauses
from api.text.split import group_sentences


@dataclass(frozen=True)
class PlannedChunk:
    """One model chunk: its token ids, how it ends (for the pause after it) and its text (for logs)."""

    tokens: tuple[int, ...]
    ending: Ending
    text: str


@dataclass(frozen=True)
class PlannedPause:
    seconds: float


Planned = PlannedChunk | PlannedPause
SILENT_SYMBOLS = frozenset(" .,!?;:—…\"()“”-'")
WordsOf = Callable[[str], Awaitable[list[Word]]]


@dataclass(frozen=True)
class Planner:
    """Splits text at pause tags, groups sentences into G2P pieces (the first one short), and packs the
    phonemized words into chunks by token count; G2P happens piece by piece as the consumer pulls."""

    limits: ChunkLimits
    piece_chars: int
    first_piece_chars: int

    async def plan(self, text: str, vocab: Mapping[str, int], words_of: WordsOf) -> AsyncIterator[Planned]:
        chunker = Chunker(self.limits)
        first_piece = True
        for segment in split_pauses(text):
            if isinstance(segment, Pause):
                for chunk in chunker.flush():
                    if planned := self._chunk(chunk, vocab):
                        yield planned
                yield PlannedPause(segment.seconds)
                continue
            limit = self.first_piece_chars if first_piece else self.piece_chars
            for piece in group_sentences(segment, self.piece_chars, limit):
                first_piece = False
                for word in await words_of(piece):
                    for chunk in chunker.push(word):
                        if planned := self._chunk(chunk, vocab):
                            yield planned
        for chunk in chunker.flush():
            if planned := self._chunk(chunk, vocab):
                yield planned

    @staticmethod
    def _chunk(words: list[Word], vocab: Mapping[str, int]) -> PlannedChunk | None:
        symbols = [symbol for symbol in phonemes_of(words) if symbol in vocab]
        if all(symbol in SILENT_SYMBOLS for symbol in symbols):
            return None  # nothing but spaces and punctuation: nothing to speak
        tokens = tuple(vocab[symbol] for symbol in symbols)
        return PlannedChunk(tokens, ending_of(words), " ".join(word.text for word in words))
