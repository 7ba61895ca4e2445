"""Numbers still written in digits: unicode forms, ordinals, versions and IP addresses, every other number."""

from __future__ import annotations

import re
import unicodedata

from api.text.normalize.numbers import SIGNED, Context, digits_of, number_words, ordinal, paired, whole_number
from api.text.tracked import Tracked

_VULGAR_FRACTION = re.compile(r"(\d?)([\u00bc-\u00be\u2150-\u215e])")
_MINUS_SIGN = re.compile("−")


def expand_unicode_numbers(text: Tracked, ctx: Context) -> Tracked:
    """'2½' -> '2 1/2', '−5' (minus sign) -> '-5'."""

    def ascii_fraction(match: re.Match[str]) -> str:
        fraction = unicodedata.normalize("NFKC", match.group(2)).replace("\u2044", "/")
        return f"{match.group(1)} {fraction}" if match.group(1) else fraction

    return text.sub(_VULGAR_FRACTION, ascii_fraction).sub(_MINUS_SIGN, "-")


_ORDINAL = re.compile(r"(?<![\w.,])(?P<num>\d{1,3}(?:,\d{3})+|\d+)(?:st|nd|rd|th)\b", re.IGNORECASE)
_VERSION = re.compile(r"(?<![\w.])(?:(?P<v>v)|(?P<word>[Vv]ersion\s+))(?P<num>\d+(?:\.\d+)*)(?!\w|\.\d)")
_DOTTED = re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?!\w|\.\d)")
_LETTER_DIGIT = re.compile(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
_NUMBER_TOKEN = re.compile(SIGNED)
_LEADING_DECIMAL = re.compile(r"(?<![\w.])\.(?P<digits>\d+)(?!\w)")
_ANY_DIGITS = re.compile(r"\d+")


def expand_ordinals(text: Tracked, ctx: Context) -> Tracked:
    """'1st' -> 'first', '23rd' -> 'twenty-third', '101st' -> 'one hundred first' (British: 'and first')."""
    return text.sub(_ORDINAL, lambda m: ordinal(int(m["num"].replace(",", "")), ctx))


def _say_version(match: re.Match[str], ctx: Context) -> str:
    parts = " point ".join(whole_number(part, ctx) for part in match["num"].split("."))
    return ("version " if match["v"] else match["word"]) + parts


def _say_dotted(match: re.Match[str], ctx: Context) -> str:
    """An IPv4 address '192.168.0.1' -> '... dot ...'; a version '1.2.3' -> 'one point two point three'."""
    parts = match.group().split(".")
    is_ip = len(parts) == 4 and all(int(part) <= 255 for part in parts)
    if is_ip:
        return " dot ".join(paired(part, ctx) for part in parts)
    return " point ".join(whole_number(part, ctx) for part in parts)


def expand_versions(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_VERSION, lambda m: _say_version(m, ctx))
    return text.sub(_DOTTED, lambda m: _say_dotted(m, ctx))


def separate_letters_from_digits(text: Tracked, ctx: Context) -> Tracked:
    """'5G' -> '5 G', 'mp3' -> 'mp 3', 'H2O' -> 'H 2 O': misaki reads the pieces apart."""
    return text.sub(_LETTER_DIGIT, " ")


def expand_numbers(text: Tracked, ctx: Context) -> Tracked:
    """Every number still written in digits: signed, decimal, with separators; then any digit left."""
    text = text.sub(_NUMBER_TOKEN, lambda m: number_words(m.group(), ctx))
    text = text.sub(_LEADING_DECIMAL, lambda m: f"point {digits_of(m['digits'])}")
    return text.sub(_ANY_DIGITS, lambda m: whole_number(m.group(), ctx))
