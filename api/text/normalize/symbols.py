"""Symbols around words: optional plurals ('file(s)' -> 'files'), hashtags, and those left standing alone."""

from __future__ import annotations

import re
import unicodedata

from api.text.normalize.numbers import Context
from api.text.tracked import Tracked

_OPTIONAL_PLURAL = re.compile(r"(?<=[A-Za-z])\((s|es)\)", re.IGNORECASE)


def expand_optional_plurals(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_OPTIONAL_PLURAL, r"\1")


_HASHTAG = re.compile(r"(?<![\w&#])#(?P<tag>[A-Za-z]\w*)")
_MUSICAL_SHARP = re.compile(r"\b(?P<note>[A-G])#(?!\w)")
_PER = re.compile(r"(?<=\w)/(?=(?:month|year|day|week|hour|night|person|mo|yr|wk|hr)\b)")
_ARROW = re.compile(r"\s*(?:->|=>|→)\s*")
_SYMBOL_WORDS = {
    "&": "and", "@": "at", "+": "plus", "=": "equals", "%": "percent", "°": "degrees", "#": "number",
    "×": "times", "÷": "divided by", "<": "less than", ">": "greater than", "≤": "less than or equal to",
    "≥": "greater than or equal to", "≈": "approximately", "±": "plus or minus", "/": "slash",
}  # fmt: skip
_SYMBOL = re.compile("|".join(re.escape(symbol) for symbol in _SYMBOL_WORDS))
_DECORATION = re.compile(r"[~^*|\\_{}]")
_EMOJI_JOINERS = frozenset("\u200d\ufe0e\ufe0f\u20e3")


def expand_hashtags(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_HASHTAG, lambda m: f"hashtag {m['tag']}")


def _is_emoji(char: str) -> bool:
    return unicodedata.category(char) == "So" or char in _EMOJI_JOINERS or 0x1F3FB <= ord(char) <= 0x1F3FF


def replace_symbols(text: Tracked, ctx: Context) -> Tracked:
    """Leftover symbols become words ('R&D' -> 'R and D'), decorations go, emoji are removed."""
    text = text.sub(_MUSICAL_SHARP, r"\g<note> sharp")
    text = text.sub(_PER, " per ").sub(_ARROW, " to ")
    text = text.sub(_SYMBOL, lambda m: f" {_SYMBOL_WORDS[m.group()]} ")
    text = text.sub(_DECORATION, " ")
    return text.keep(lambda char: not _is_emoji(char))
