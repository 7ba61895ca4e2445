"""Scientific notation and powers: '6.02e23', '3 x 10^8 m/s', '10⁻³', '5²' -> 'five squared'."""

from __future__ import annotations

import re

from api.text.normalize.numbers import NUMBER, Context, british_spelling, number_words, ordinal
from api.text.normalize.units import UNIT_ALTERNATION, UNITS
from api.text.tracked import Tracked

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT = "[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+"
_FOLLOWING_UNIT = rf"(?:\s?(?P<unit>{UNIT_ALTERNATION})(?![\w/²³]))?"
_E_NOTATION = re.compile(
    rf"(?<![\w.])(?P<m>-?\d+(?:\.\d+)?)[eE](?P<e>[-+−]?\d{{1,3}})(?!\w|\.\d){_FOLLOWING_UNIT}"
)
_TIMES_TEN = re.compile(
    rf"(?<![\w.])(?P<m>-?{NUMBER})\s?[x×·]\s?10(?:\^(?P<e>[-+−]?\d+)|(?P<sup>{_SUPERSCRIPT}))(?![\d^])"
    rf"{_FOLLOWING_UNIT}"
)
_POWER = re.compile(
    rf"(?<![\w.^])(?:(?P<b>\d+|[a-z])\^(?P<e>[-+−]?\d+|[a-z])|(?P<sb>\d+)(?P<sup>{_SUPERSCRIPT}))(?![\w^])"
)


def _exponent(written: str, ctx: Context, powers: bool = False) -> str:
    """'23' -> 'to the twenty-third', '-3' -> 'to the minus third'; 2 and 3 of a plain power -> 'squared',
    'cubed'; a letter -> 'to the n'."""
    exponent = written.translate(_SUPERSCRIPTS).replace("−", "-").lstrip("+")
    if exponent.isalpha():
        return f"to the {exponent}"
    if powers and exponent in ("2", "3"):
        return "squared" if exponent == "2" else "cubed"
    sign = "minus " if exponent.startswith("-") else ""
    return f"to the {sign}{ordinal(int(exponent.lstrip('-')), ctx)}"


def _say_scientific(match: re.Match[str], ctx: Context) -> str:
    """'6.02e23' -> 'six point zero two times ten to the twenty-third', with the unit after it if any."""
    said = f"{number_words(match['m'], ctx)} times ten {_exponent(match['e'] or match['sup'], ctx)}"
    unit = match["unit"]
    if not unit:
        return said
    if not ctx.units:
        return f"{said} {unit}"
    return f"{said} {british_spelling(UNITS[unit][1], ctx)}"


def _say_power(match: re.Match[str], ctx: Context) -> str:
    base = match["b"] or match["sb"]
    base_words = number_words(base, ctx) if base.isdigit() else base
    return f"{base_words} {_exponent(match['e'] or match['sup'], ctx, powers=True)}"


def expand_scientific_notation(text: Tracked, ctx: Context) -> Tracked:
    """'6.02e23', '3 x 10^8 m/s', '1.5×10⁻³'; powers '10^6' -> 'ten to the sixth', '5²' -> 'five squared'."""
    text = text.sub(_E_NOTATION, lambda m: _say_scientific(m, ctx))
    text = text.sub(_TIMES_TEN, lambda m: _say_scientific(m, ctx))
    return text.sub(_POWER, lambda m: _say_power(m, ctx))
