"""Text that remembers where each of its characters came from in the text the user sent.

Normalization rewrites text many times ('$3,497.50' becomes 'three thousand four hundred ninety-seven
dollars and fifty cents'); captions must name the words the user wrote. Every rewrite goes through
`Tracked.sub`, which gives each new character the span of the original text it replaces, so any stretch
of the final text maps back to the input exactly.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

_WORD = re.compile(r"\S+")
Replacement = str | Callable[[re.Match[str]], str]


@dataclass(frozen=True)
class Tracked:
    """A string plus, per character, the [start, end) span of the original text it stands for.

    Characters a rule left alone keep their own one-character span; characters a rule wrote get the
    span of what they replaced, narrowed to the replaced word when the rule kept the words around it
    ('Henry VIII' -> 'Henry the eighth': 'Henry' keeps its span, 'the eighth' gets the span of 'VIII').
    """

    text: str
    starts: np.ndarray[Any, Any]  # int64, one per character
    ends: np.ndarray[Any, Any]

    @classmethod
    def of(cls, text: str, offset: int = 0) -> Tracked:
        """`text` as it stands, its characters at `offset`, `offset` + 1, ... of the original."""
        positions = np.arange(offset, offset + len(text), dtype=np.int64)
        return cls(text, positions, positions + 1)

    def __post_init__(self) -> None:
        if not len(self.text) == len(self.starts) == len(self.ends):
            raise ValueError("a tracked text needs one origin span per character")

    def __str__(self) -> str:
        return self.text

    def __len__(self) -> int:
        return len(self.text)

    def span(self, start: int, end: int) -> tuple[int, int] | None:
        """The original span that text[start:end] came from; None for an empty stretch."""
        if end <= start:
            return None
        return int(self.starts[start:end].min()), int(self.ends[start:end].max())

    def sub(self, pattern: re.Pattern[str], replacement: Replacement) -> Tracked:
        """`pattern.sub(replacement, text)`, with origins carried along."""
        texts: list[str] = []
        starts: list[np.ndarray[Any, Any]] = []
        ends: list[np.ndarray[Any, Any]] = []
        position = 0
        for match in pattern.finditer(self.text):
            new = replacement(match) if callable(replacement) else match.expand(replacement)
            if new == match.group():
                continue
            start, end = match.span()
            texts += [self.text[position:start], new]
            new_starts, new_ends = self._origins_of(start, end, new)
            starts += [self.starts[position:start], new_starts]
            ends += [self.ends[position:start], new_ends]
            position = end
        if not texts:
            return self
        texts.append(self.text[position:])
        starts.append(self.starts[position:])
        ends.append(self.ends[position:])
        return Tracked("".join(texts), np.concatenate(starts), np.concatenate(ends))

    def keep(self, wanted: Callable[[str], bool]) -> Tracked:
        """Only the characters `wanted` accepts."""
        mask = np.fromiter((wanted(char) for char in self.text), dtype=bool, count=len(self.text))
        if mask.all():
            return self
        text = "".join(char for char, kept in zip(self.text, mask, strict=True) if kept)
        return Tracked(text, self.starts[mask], self.ends[mask])

    def strip(self) -> Tracked:
        stripped = self.text.lstrip()
        start = len(self.text) - len(stripped)
        end = start + len(stripped.rstrip())
        if start == 0 and end == len(self.text):
            return self
        return Tracked(self.text[start:end], self.starts[start:end], self.ends[start:end])

    def _origins_of(
        self, start: int, end: int, new: str
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Origins for `new`, which replaces text[start:end]: the whole replaced span, except for words
        that `new` keeps from the replaced text (their own spans) and words that stand for one
        stretch of replaced words (that stretch's span)."""
        whole = self.span(start, end) or (int(self.starts[start - 1]) if start else 0,) * 2
        new_starts = np.full(len(new), whole[0], dtype=np.int64)
        new_ends = np.full(len(new), whole[1], dtype=np.int64)
        old_words = [
            (m.start() + start, m.end() + start, m.group()) for m in _WORD.finditer(self.text[start:end])
        ]
        new_words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(new)]
        if len(old_words) < 2 and len(new_words) < 2:
            return new_starts, new_ends
        matcher = difflib.SequenceMatcher(
            None, [word for *_, word in old_words], [word for *_, word in new_words], autojunk=False
        )
        for tag, old_first, old_last, new_first, new_last in matcher.get_opcodes():
            if tag == "delete" or old_first == old_last:
                continue
            if tag == "equal":
                for old, new_word in zip(
                    old_words[old_first:old_last], new_words[new_first:new_last], strict=True
                ):
                    new_starts[new_word[0] : new_word[1]] = self.starts[old[0] : old[1]]
                    new_ends[new_word[0] : new_word[1]] = self.ends[old[0] : old[1]]
                continue
            origin = self.span(old_words[old_first][0], old_words[old_last - 1][1])
            assert origin is not None
            first, last = new_words[new_first][0], new_words[new_last - 1][1]
            new_starts[first:last], new_ends[first:last] = origin
        return new_starts, new_ends
