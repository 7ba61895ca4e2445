"""Ranges: '1-2' -> '1 to 2', '$5-10' -> '$5 to $10', '9am–5pm'; a spaced hyphen before an '=' is a minus."""

from __future__ import annotations

import re

from api.text.normalize.numbers import NUMBER, Context
from api.text.normalize.units import UNIT_RANGE
from api.text.tracked import Tracked

_CURRENCY_SIGNS = "$£€¥"
_RANGE_ITEM = rf"[$£€¥]?(?:\d{{1,2}}:\d{{2}}|{NUMBER})"
_RANGE_RIGHT = rf"(?={_RANGE_ITEM}(?!\d|-\d|[.,:/]\d))"
# "10 - 5 = 5" is arithmetic: a spaced hyphen with an "=" later on the line is a minus.
_SPACED_MINUS = re.compile(rf"(?<=\d)\s+-\s+{_RANGE_RIGHT}(?=[^\n=]*=)")
_RANGE = re.compile(rf"(?<![\w.,:/-])(?P<left>{_RANGE_ITEM})(?:-|\s+-\s+|\s*[–—]\s*){_RANGE_RIGHT}")


# '9am–5pm', '$20K–$30K', '20%–30%': a range whose left side ends in a suffix.
_SUFFIXED_RANGE = re.compile(
    rf"(?P<left>(?<![\w.])(?:\d{{1,2}}(?::\d\d)?\s?[AaPp]\.?[Mm]\.?|[$£€¥]{NUMBER}\s?(?:[kKmMbB]|bn|mn|tn)"
    rf"|{NUMBER}\s?%))\s*[-–—]\s*(?=[$£€¥]?\d)"
)
_SCALED_RIGHT = re.compile(rf"{NUMBER}\s?(?:thousand|million|billion|trillion|[kKmMbB]|bn|mn|tn)(?![A-Za-z])")


def expand_ranges(text: Tracked, ctx: Context) -> Tracked:
    """'1-2' -> '1 to 2', 'pages 10–12' -> 'pages 10 to 12', '5km-10km' -> '5km to 10km'; the numbers
    are read by later rules."""
    text = text.sub(_SPACED_MINUS, " minus ")
    text = text.sub(UNIT_RANGE, r"\g<left> to ")
    text = text.sub(_SUFFIXED_RANGE, r"\g<left> to ")
    return text.sub(_RANGE, _say_range_start)


def _say_range_start(match: re.Match[str]) -> str:
    """'$5-10' -> '$5 to $10': the currency of the first amount carries over to the second; with a scale
    after the second ('$5–10 million') the currency moves there: '5 to $10 million'."""
    left = match["left"]
    carries = left[0] in _CURRENCY_SIGNS and match.string[match.end() : match.end() + 1].isdigit()
    if carries and _SCALED_RIGHT.match(match.string, match.end()):
        return f"{left[1:]} to {left[0]}"
    return f"{left} to {left[0] if carries else ''}"
