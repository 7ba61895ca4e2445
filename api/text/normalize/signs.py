"""Signs at numbers: before them ('#1', '~5', '±2'), and after them ('20%', '25°C', '40.7°N')."""

from __future__ import annotations

import re

from api.text.normalize.numbers import SIGNED, Context, is_one, number_words
from api.text.tracked import Tracked

_NUMBER_SIGN_WORDS = {"#": "number", "~": "about", "≈": "approximately", "±": "plus or minus", "+": "plus"}
_NUMBER_SIGN = re.compile(r"(?<![\w)&#])(?P<sign>[#~≈±+])(?=[$£€¥]?\d)")
_PERCENT = re.compile(rf"(?<!/)(?P<num>{SIGNED})\s?(?P<sign>[%‰‱])")
_PERCENT_WORDS = {"%": "percent", "‰": "per mille", "‱": "per ten thousand"}
_DEGREES = re.compile(
    rf"(?P<num>{SIGNED})\s?(?:[°º]\s?(?:(?P<scale>[CF])|(?P<compass>[NSEW]))?|(?P<symbol>[℃℉]))(?![A-Za-z])"
)
_DEGREES_LETTER = re.compile(r"\bdegrees\s+(?P<scale>[CF])\b(?!\.\w)")
_DEGREES_ALONE = re.compile(r"(?<![\d\w])[°º]\s?(?P<scale>[CF])\b")
_SCALE_NAMES = {"C": "Celsius", "F": "Fahrenheit", "℃": "Celsius", "℉": "Fahrenheit"}
_COMPASS = {"N": "north", "S": "south", "E": "east", "W": "west"}


def expand_number_signs(text: Tracked, ctx: Context) -> Tracked:
    """'#1' -> 'number 1', '~5' -> 'about 5', '+5' -> 'plus 5', '±2' -> 'plus or minus 2'."""
    return text.sub(_NUMBER_SIGN, lambda m: _NUMBER_SIGN_WORDS[m["sign"]] + " ")


def expand_percentages(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_PERCENT, lambda m: f"{number_words(m['num'], ctx)} {_PERCENT_WORDS[m['sign']]}")


def _say_degrees(match: re.Match[str], ctx: Context) -> str:
    unit = "degree" if is_one(match["num"]) else "degrees"
    scale = _SCALE_NAMES.get(match["scale"] or match["symbol"] or "") or _COMPASS.get(match["compass"] or "")
    return f"{number_words(match['num'], ctx)} {unit}" + (f" {scale}" if scale else "")


def expand_temperatures(text: Tracked, ctx: Context) -> Tracked:
    """'25°C' -> 'twenty-five degrees Celsius', '90°' -> 'ninety degrees', '40.7°N' -> '... degrees north',
    '10 degrees F' -> '... degrees Fahrenheit', 'in °C' -> 'in degrees Celsius'."""
    text = text.sub(_DEGREES, lambda m: _say_degrees(m, ctx))
    text = text.sub(_DEGREES_LETTER, lambda m: f"degrees {_SCALE_NAMES[m['scale']]}")
    return text.sub(_DEGREES_ALONE, lambda m: f"degrees {_SCALE_NAMES[m['scale']]}")
