"""Number words for the English normalizer: cardinals, ordinals, years, digit strings, and the paired
reading people use for codes and house numbers ('747' -> 'seven forty-seven'), plus the context every
rule receives (British or American English, the date order)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from num2words import num2words

DateOrder = Literal["mdy", "dmy"]


@dataclass(frozen=True)
class Context:
    """What every rule may depend on: British or American English, the numeric date order, and whether
    unit abbreviations are read (the `unit_normalization` option)."""

    british: bool
    date_order: DateOrder
    units: bool = True


# --- number words (num2words; American English drops the "and" of "one hundred and one") -------------------

# Longer digit runs are identifiers (card numbers, IDs) and are read digit by digit.
MAX_SPOKEN_DIGITS = 15


def cardinal(n: int, ctx: Context) -> str:
    if n >= 10**MAX_SPOKEN_DIGITS:
        return digits_of(str(n))
    return americanize(str(num2words(n)), ctx)


def ordinal(n: int, ctx: Context) -> str:
    if n >= 10**MAX_SPOKEN_DIGITS:
        return digits_of(str(n))
    return americanize(str(num2words(n, to="ordinal")), ctx)


def year_words(n: int, ctx: Context) -> str:
    return americanize(str(num2words(n, to="year")).replace("oh-", "oh "), ctx)


def americanize(words: str, ctx: Context) -> str:
    words = words.replace(",", "")
    return words if ctx.british else words.replace(" and ", " ")


def digits_of(digits: str, zero: str = "zero") -> str:
    return " ".join(zero if digit == "0" else str(num2words(int(digit))) for digit in digits)


def number_words(token: str, ctx: Context) -> str:
    """'-3,497.25' -> 'minus three thousand four hundred ninety-seven point two five'."""
    sign = "minus " if token[:1] in "-−" else ""
    whole, _, fraction = token.lstrip("-−").replace(",", "").partition(".")
    words = whole_number(whole, ctx)
    if fraction:
        words = f"{words} point {digits_of(fraction)}".strip()
    return sign + words


def whole_number(digits: str, ctx: Context) -> str:
    # Leading zeros ("007") are read digit by digit.
    if not digits:
        return ""
    if len(digits) > 1 and digits.startswith("0"):
        return digits_of(digits)
    return cardinal(int(digits), ctx)


def is_one(token: str) -> bool:
    return token.lstrip("-−+") == "1"


def plural_of_number_words(words: str) -> str:
    """'nineteen ninety' -> 'nineteen nineties', 'nineteen hundred' -> 'nineteen hundreds'."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def british_spelling(words: str, ctx: Context) -> str:
    return words.replace("meter", "metre").replace("liter", "litre") if ctx.british else words


# Shared pieces of number patterns: an integer with or without thousands separators, an optional decimal
# part, and an optional minus sign that is not a hyphen inside a word ("A-1", "COVID-19").
INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
NUMBER = rf"{INT}(?:\.\d+)?"
SIGNED = rf"(?:(?<!\w)[-−])?(?<![\w.]){NUMBER}"
_SENTENCE_NEXT = re.compile(r"[ \t]*(?:\n|$)|\s+[A-Z\"“]")


def period_if_sentence_end(match: re.Match[str]) -> str:
    """The '.' of an expanded abbreviation that also ended its sentence ('..., etc. Then')."""
    return "." if _SENTENCE_NEXT.match(match.string, match.end()) else ""


def paired(digits: str, ctx: Context) -> str:
    """Codes, house numbers and sections as people read them: '747' -> 'seven forty-seven', '2490' ->
    'twenty-four ninety', '305' -> 'three oh five', '1600' -> 'sixteen hundred', '12345' -> 'twelve three
    forty-five'; round hundreds and thousands stay cardinals ('400', '2000'), leading zeros go digit by
    digit."""
    n = int(digits)
    if len(digits) <= 2 or n % 100 == 0 and (len(digits) == 3 or n % 1000 == 0):
        return whole_number(digits, ctx)
    if digits.startswith("0") or len(digits) > 5:
        return digits_of(digits, "oh")
    if len(digits) == 5:
        return f"{cardinal(int(digits[:2]), ctx)} {paired(str(int(digits[2:])), ctx)}"
    high, low = divmod(n, 100)
    if low == 0:
        return f"{cardinal(high, ctx)} hundred"
    return f"{cardinal(high, ctx)} {'oh ' if low < 10 else ''}{cardinal(low, ctx)}"
