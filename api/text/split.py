"""Sentence splitting and grouping into G2P pieces (text level). Nothing is ever dropped."""

from __future__ import annotations

import re
from collections.abc import Iterator

# A sentence ends after . ! ? … (and any closing quotes/brackets) followed by whitespace, after 。！？ (and
# closers; Japanese and Chinese put no space after them), or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|(?<=[。！？])[」』”’）)\]]*\s*|\s*\n\s*")
# Break preferences inside an over-long sentence: sentence ends, then clause punctuation, then spaces.
_BREAKS = (".!?…。！？", ",;:—–、，；：", " ")


def split_sentences(text: str) -> list[str]:
    parts = []
    position = 0
    for match in _SENTENCE_END.finditer(text):
        parts.append(text[position : match.start() + len(match.group().rstrip())].strip())
        position = match.end()
    parts.append(text[position:].strip())
    return [part for part in parts if part]


def split_long(sentence: str, limit: int) -> list[str]:
    """Cut a sentence longer than `limit` characters at clause punctuation or spaces."""
    pieces = []
    while len(sentence) > limit:
        cut = _best_cut(sentence, limit)
        pieces.append(sentence[:cut].strip())
        sentence = sentence[cut:].strip()
    if sentence:
        pieces.append(sentence)
    return [piece for piece in pieces if piece]


def group_sentences(text: str, target_chars: int, first_chars: int) -> Iterator[str]:
    """Pieces of whole sentences of about `target_chars`; the first piece at most `first_chars` when
    its first sentence allows, so the first audio comes early."""
    limit = first_chars
    current = ""
    for sentence in split_sentences(text):
        for part in split_long(sentence, 2 * target_chars):
            if current and len(current) + 1 + len(part) > limit:
                yield current
                current = ""
                limit = target_chars
            current = f"{current} {part}" if current else part
    if current:
        yield current


def _best_cut(text: str, limit: int) -> int:
    """An index in (0, limit] to cut `text` at: just after the last preferred boundary before `limit`."""
    window = text[: limit + 1]
    for marks in _BREAKS:
        cut = max(window.rfind(mark, 0, limit) for mark in marks)
        if cut > 0:
            return cut + 1
    return limit
