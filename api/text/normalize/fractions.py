"""Fractions: '1/2' -> 'one half', '2 1/2' -> 'two and a half', scores ('4/5 stars') and idioms ('24/7')."""

from __future__ import annotations

import re

from api.text.normalize.numbers import Context, cardinal, number_words, ordinal
from api.text.tracked import Tracked

FRACTION = re.compile(r"(?<![\w/.,])(?:(?P<whole>\d+)\s+)?(?P<num>\d{1,3})/(?P<den>\d{1,4})(?![\d/]|[.,]\d)")
_FRACTION_IDIOMS = {"24/7": "twenty-four seven", "9/11": "nine eleven", "50/50": "fifty-fifty"}
_FRACTION_NAMES = {2: ("half", "halves"), 4: ("quarter", "quarters")}


def _fraction_name(numerator: int, denominator: int, ctx: Context) -> str | None:
    if denominator in _FRACTION_NAMES:
        singular, plural = _FRACTION_NAMES[denominator]
    elif 3 <= denominator <= 100 or denominator in (1000, 10000):
        singular = ordinal(denominator, ctx)
        plural = singular + "s"
    else:
        return None
    return singular if numerator == 1 else plural


_COMPOUND_NEXT = re.compile(r"-[A-Za-z]")
_SCORE_BEFORE = re.compile(r"\b(?:scored|scores|score|rated|rating|got|gave|perfect)\s+(?:it\s+|a\s+)?$")
_SCORE_AFTER = re.compile(r"\s+(?:stars|points|marks)\b")


def _is_score(match: re.Match[str]) -> bool:
    """'scored 17/20', 'rated it 4/5', '5/5 stars': a mark out of a total, not a fraction."""
    before = _SCORE_BEFORE.search(match.string, max(0, match.start() - 20), match.start())
    return bool(before) or bool(_SCORE_AFTER.match(match.string, match.end()))


def say_fraction(match: re.Match[str], ctx: Context) -> str:
    """'1/2' -> 'one half', '3/4' -> 'three quarters', '2 1/2' -> 'two and a half', '5/1' -> 'five over one'.
    Large or odd denominators are read with 'over'."""
    whole, numerator, denominator = match["whole"], int(match["num"]), int(match["den"])
    written = f"{match['num']}/{match['den']}"
    if not whole and written in _FRACTION_IDIOMS:
        return _FRACTION_IDIOMS[written]
    if not whole and (numerator == denominator or _is_score(match)):
        return f"{cardinal(numerator, ctx)} out of {cardinal(denominator, ctx)}"
    name = _fraction_name(numerator, denominator, ctx)
    if denominator == 4 and _COMPOUND_NEXT.match(match.string, match.end()):
        name = "quarter"  # a compound adjective keeps the singular: 'a 3/4-inch pipe' -> 'three-quarter-inch'
    if name is None:
        said = f"{cardinal(numerator, ctx)} over {cardinal(denominator, ctx)}"
    elif whole and numerator == 1:
        said = f"a {name}"
    else:
        said = f"{cardinal(numerator, ctx)} {name}"
    return f"{number_words(whole, ctx)} and {said}" if whole else said


def expand_fractions(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(FRACTION, lambda m: say_fraction(m, ctx))
