"""Dates, written or numeric: 'Nov. 22, 2026', 'the 5th of July', '2026-11-22', '03/04/2026'."""

from __future__ import annotations

import datetime
import re

import api.text.normalize.abbreviations as abbreviations
from api.text.normalize.numbers import Context, DateOrder, ordinal, year_words
from api.text.tracked import Tracked

_MONTH = (
    r"(?P<month>(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\b\.?)"
)
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?(?!\d)"
_YEAR_PART = r"(?:,?\s+(?P<year>\d{4})(?![\d:]|[.,]\d))?"
_DATE_MONTH_FIRST = re.compile(rf"\b{_MONTH}\s+{_DAY}\b{_YEAR_PART}")
_DATE_DAY_FIRST = re.compile(rf"(?:\b[Tt]he\s+)?(?<![\d.,]){_DAY}\b\s+(?:of\s+)?{_MONTH}{_YEAR_PART}")
_DATE_ISO = re.compile(
    r"(?<![\d/.-])(?P<year>\d{4})(?P<sep>[-/.])(?P<month>\d{1,2})(?P=sep)(?P<day>\d{1,2})(?![\d-]|\.\d)"
)
_DATE_NUMERIC = re.compile(
    r"(?<![\d/.-])(?P<first>\d{1,2})(?P<sep>[-/.])(?P<second>\d{1,2})(?P=sep)(?P<year>\d{4})(?![\d/-]|\.\d)"
)


def _month_number(name: str) -> int:
    prefix = name.rstrip(".")[:3]
    return next(i for i, month in enumerate(abbreviations.MONTH_NAMES, 1) if month.startswith(prefix))


def _is_valid_date(year: int, month: int, day: int) -> bool:
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    return True


def _say_date(year: int | None, month: int, day: int, order: DateOrder, ctx: Context) -> str:
    """mdy: 'November twenty-second, twenty twenty-six'; dmy: 'the twenty-second of November, ...'."""
    name, nth = abbreviations.MONTH_NAMES[month - 1], ordinal(day, ctx)
    said = f"{name} {nth}" if order == "mdy" else f"the {nth} of {name}"
    return f"{said}, {year_words(year, ctx)}" if year is not None else said


def _say_written_date(match: re.Match[str], order: DateOrder, ctx: Context) -> str:
    year, month, day = match["year"], _month_number(match["month"]), int(match["day"])
    if not _is_valid_date(int(year or 2000), month, day):
        return match.group()
    return _say_date(int(year) if year else None, month, day, order, ctx)


def _say_iso_date(match: re.Match[str], ctx: Context) -> str:
    year, month, day = int(match["year"]), int(match["month"]), int(match["day"])
    if not _is_valid_date(year, month, day):
        return match.group()
    return _say_date(year, month, day, ctx.date_order, ctx)


def _say_numeric_date(match: re.Match[str], ctx: Context) -> str:
    """Ambiguous '03/04/2026' follows date_order; '22/11/2026' can only be day-first, so it is."""
    first, second, year = int(match["first"]), int(match["second"]), int(match["year"])
    preferred = (first, second) if ctx.date_order == "mdy" else (second, first)
    for month, day in (preferred, preferred[::-1]):
        if _is_valid_date(year, month, day):
            return _say_date(year, month, day, ctx.date_order, ctx)
    return match.group()


_ORDINAL_DAY = r"\d{1,2}(?:st|nd|rd|th)"
_ORDINAL_RANGE = re.compile(
    rf"(?P<the>\b[Tt]he\s+)?(?P<a>{_ORDINAL_DAY})\s*[-–—]\s*(?P<b>{_ORDINAL_DAY})\b(?P<after>\s+(?:of\s+)?{_MONTH})?"
)


def _say_ordinal_range(match: re.Match[str]) -> str:
    """'1st–3rd' -> '1st to 3rd'; before a month, day first: 'the 5th to the 7th July' (the date rule
    reads that)."""
    if not match["after"]:
        return f"{match['the'] or ''}{match['a']} to {match['b']}"
    the = match["the"] or "the "
    return f"{the}{match['a']} to the {match['b']}{match['after']}"


def expand_dates(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_ORDINAL_RANGE, _say_ordinal_range)
    text = text.sub(_DATE_ISO, lambda m: _say_iso_date(m, ctx))
    text = text.sub(_DATE_NUMERIC, lambda m: _say_numeric_date(m, ctx))
    text = text.sub(_DATE_MONTH_FIRST, lambda m: _say_written_date(m, "mdy", ctx))
    return text.sub(_DATE_DAY_FIRST, lambda m: _say_written_date(m, "dmy", ctx))
