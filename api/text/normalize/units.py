"""Units after a number ('5 km' -> 'five kilometers', 5'11"), and dimensions ('1920x1080', '10x faster')."""

from __future__ import annotations

import re

from api.text.normalize.fractions import FRACTION, say_fraction
from api.text.normalize.numbers import (
    NUMBER,
    SIGNED,
    Context,
    british_spelling,
    cardinal,
    is_one,
    number_words,
    paired,
)
from api.text.tracked import Tracked

UNITS: dict[str, tuple[str, str]] = {
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"), "m/s": ("meter per second", "meters per second"),
    "KB/s": ("kilobyte per second", "kilobytes per second"),
    "MB/s": ("megabyte per second", "megabytes per second"),
    "GB/s": ("gigabyte per second", "gigabytes per second"),
    "kbps": ("kilobit per second", "kilobits per second"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    "km²": ("square kilometer", "square kilometers"), "m²": ("square meter", "square meters"),
    "cm²": ("square centimeter", "square centimeters"), "ft²": ("square foot", "square feet"),
    "m³": ("cubic meter", "cubic meters"), "cm³": ("cubic centimeter", "cubic centimeters"),
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"),
    "in": ("inch", "inches"), "yd": ("yard", "yards"), "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"), "mg": ("milligram", "milligrams"), "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"), "L": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"),
    "ms": ("millisecond", "milliseconds"), "s": ("second", "seconds"), "sec": ("second", "seconds"),
    "secs": ("second", "seconds"), "min": ("minute", "minutes"), "mins": ("minute", "minutes"),
    "h": ("hour", "hours"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "Hz": ("hertz", "hertz"), "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"), "W": ("watt", "watts"), "kW": ("kilowatt", "kilowatts"),
    "MW": ("megawatt", "megawatts"), "kWh": ("kilowatt hour", "kilowatt hours"), "V": ("volt", "volts"),
    "mA": ("milliamp", "milliamps"), "mAh": ("milliamp hour", "milliamp hours"),
    "KB": ("kilobyte", "kilobytes"), "kB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
    "kg/m³": ("kilogram per cubic meter", "kilograms per cubic meter"), "tsp": ("teaspoon", "teaspoons"),
    "tbsp": ("tablespoon", "tablespoons"), "bps": ("basis point", "basis points"),
    "bp": ("basis point", "basis points"), "pp": ("percentage point", "percentage points"),
    "pct": ("percent", "percent"), "mol": ("mole", "moles"), "mmol": ("millimole", "millimoles"),
    "mol/L": ("mole per liter", "moles per liter"), "mmol/L": ("millimole per liter", "millimoles per liter"),
}  # fmt: skip
# "in" is a unit only where it cannot be the preposition: at the end of a clause ("12 in." / "12 in,").
UNIT_ALTERNATION = "|".join(
    r"in(?=[ \t]*(?:$|\n|[.,;:!?)\]]))" if unit == "in" else re.escape(unit)
    for unit in sorted(UNITS, key=len, reverse=True)
)
_FEET_AND_INCHES = re.compile(r"(?<![\w.])(?P<feet>\d+)['′’]\s?(?P<inches>\d{1,2})(?:\"|″|''|”)")
# After a count of feet, "in" is inches wherever it stands: '6 ft 2 in tall'.
_INCHES_AFTER_FEET = re.compile(
    rf"(?P<feet>(?<![\w.]){NUMBER}\s?(?:ft|feet|foot)\.?\s+)(?P<inches>{NUMBER})\s?in\b(?:\.(?=\s+[a-z]))?(?!['’]\w)"
)
_UNIT = re.compile(rf"(?P<num>{SIGNED})\s?(?P<unit>{UNIT_ALTERNATION})(?![\w/²³])")
UNIT_RANGE = re.compile(
    rf"(?P<left>(?<![\w.]){NUMBER}\s?(?:{UNIT_ALTERNATION}))\s*[-–—]\s*(?={NUMBER}\s?(?:{UNIT_ALTERNATION})(?![\w/]))"
)
_FRACTION_UNIT = re.compile(rf"{FRACTION.pattern}\s?(?P<unit>{UNIT_ALTERNATION})(?![\w/²³])")
_DIMENSIONS = re.compile(rf"(?<![\w.])(?P<a>{NUMBER})\s?(?P<x>[x×])\s?(?P<b>{NUMBER})(?!\w|\.\d)")
_MULTIPLIER = re.compile(rf"(?<![\w.])(?P<num>{NUMBER})[x×](?!\w)")


def _say_unit(match: re.Match[str], ctx: Context) -> str:
    singular, plural = UNITS[match["unit"]]
    unit = british_spelling(singular if is_one(match["num"]) else plural, ctx)
    return f"{number_words(match['num'], ctx)} {unit}"


def _say_fraction_unit(match: re.Match[str], ctx: Context) -> str:
    """'2 1/2 kg' -> 'two and a half kilograms', '3/4 mi' -> 'three quarters of a mile'."""
    singular, plural = UNITS[match["unit"]]
    if match["whole"]:
        return f"{say_fraction(match, ctx)} {british_spelling(plural, ctx)}"
    article = "an" if singular.startswith(("a", "e", "i", "o", "u", "hour")) else "a"
    return f"{say_fraction(match, ctx)} of {article} {british_spelling(singular, ctx)}"


def expand_fraction_units(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_FRACTION_UNIT, lambda m: _say_fraction_unit(m, ctx))


def expand_units(text: Tracked, ctx: Context) -> Tracked:
    """'5 km' -> 'five kilometers', '1 kg' -> 'one kilogram', '100 km/h' -> '... kilometers per hour',
    a height 5'11" -> 'five foot eleven', '6 ft 2 in' -> 'six feet two inches'."""
    text = text.sub(
        _FEET_AND_INCHES,
        lambda m: f"{cardinal(int(m['feet']), ctx)} foot {cardinal(int(m['inches']), ctx)}",
    )
    text = text.sub(
        _INCHES_AFTER_FEET,
        lambda m: f"{m['feet']}{number_words(m['inches'], ctx)} inch{'' if is_one(m['inches']) else 'es'}",
    )
    return text.sub(_UNIT, lambda m: _say_unit(m, ctx))


def _dimension(token: str, ctx: Context) -> str:
    """Pixel sizes are read in pairs: '1920' -> 'nineteen twenty'."""
    return paired(token, ctx) if token.isdigit() and len(token) == 4 else number_words(token, ctx)


def expand_dimensions(text: Tracked, ctx: Context) -> Tracked:
    """'1920x1080' -> '... by ...', '3 × 4' -> '... times ...', '10x faster' -> 'ten times faster'."""
    text = text.sub(
        _DIMENSIONS,
        lambda m: f"{_dimension(m['a'], ctx)} {'by' if m['x'] == 'x' else 'times'} {_dimension(m['b'], ctx)}",
    )
    return text.sub(_MULTIPLIER, lambda m: f"{number_words(m['num'], ctx)} times")
