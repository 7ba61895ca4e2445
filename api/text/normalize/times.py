"""Clock times and ratios: '3:30' -> 'three thirty', '5pm' -> 'five PM', '16:9' -> '16 to 9'."""

from __future__ import annotations

import re

from api.text.normalize.numbers import Context, cardinal, period_if_sentence_end
from api.text.tracked import Tracked

_AM_PM = r"(?:\s?(?P<ampm>[AaPp])\.?[Mm](?P<dot>\.)?(?![A-Za-z]))"
_CLOCK_TIME = re.compile(rf"(?<![\d:.])(?P<h>\d{{1,2}}):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?(?![\d:]){_AM_PM}?")
_HOUR_AM_PM = re.compile(rf"(?<![\d:.,])(?P<h>\d{{1,2}}){_AM_PM}")
# What is left of "digits:digits" after the clock times is a ratio or a score: "16:9", "3:2".
_RATIO = re.compile(r"(?<![\w:.])(?P<a>\d+):(?P<b>\d+)(?![\d:])")


def _say_clock(hour: int, minute: int, second: int, has_suffix: bool, ctx: Context) -> str:
    """'three thirty', 'ten oh five', 'twelve o'clock', 'fifteen hundred', 'three' (before 'PM')."""
    words = cardinal(hour, ctx)
    if minute == 0 and not has_suffix:
        words += " o'clock" if 1 <= hour <= 12 else " hundred"
    elif 0 < minute < 10:
        words += f" oh {cardinal(minute, ctx)}"
    elif minute:
        words += f" {cardinal(minute, ctx)}"
    if second:
        words += f" and {cardinal(second, ctx)} second{'' if second == 1 else 's'}"
    return words


def _say_time(match: re.Match[str], ctx: Context) -> str:
    """AM/PM come out as capital letters: misaki says "PM" as the letters, but "p m" as 'p em'."""
    hour, suffix = int(match["h"]), match["ampm"]
    if not (1 <= hour <= 12 if suffix else 0 <= hour <= 24):
        return match.group()
    minute, second = int(match.groupdict().get("m") or 0), int(match.groupdict().get("s") or 0)
    words = _say_clock(hour, minute, second, bool(suffix), ctx)
    if suffix:
        words += f" {suffix.upper()}M" + (period_if_sentence_end(match) if match["dot"] else "")
    return words


def expand_times(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_CLOCK_TIME, lambda m: _say_time(m, ctx))
    text = text.sub(_HOUR_AM_PM, lambda m: _say_time(m, ctx))
    return text.sub(_RATIO, r"\g<a> to \g<b>")
