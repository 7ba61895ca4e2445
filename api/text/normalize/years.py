"""Years and decades: 'in 1999' -> 'in nineteen ninety-nine', '1990s', "the '80s" -> 'the eighties'."""

from __future__ import annotations

import re
from collections.abc import Callable

from api.text.normalize.numbers import Context, cardinal, plural_of_number_words, year_words
from api.text.tracked import Tracked

_DECADE = re.compile(r"(?<![\w'’.,])(?P<num>1\d{2}0|20\d0)['’]?s\b")
_SHORT_DECADE = re.compile(
    r"(?:(?P<pre>\b(?i:the|mid|early|late|his|her|their|my|your|our)[\s-]+)|['’‘])(?P<num>[1-9]0)['’]?s\b"
)
_BARE_SHORT_DECADE = re.compile(r"(?<![\w.,])(?P<num>[1-9]0)['’]?s\b")


def _say_decade(match: re.Match[str], ctx: Context, say: Callable[[int, Context], str]) -> str:
    prefix = match.groupdict().get("pre") or ""
    return prefix + plural_of_number_words(say(int(match["num"]), ctx))


def expand_decades(text: Tracked, ctx: Context) -> Tracked:
    """'1990s' -> 'nineteen nineties', "the '80s" / 'the 80s' -> 'the eighties'."""
    text = text.sub(_DECADE, lambda m: _say_decade(m, ctx, year_words))
    return text.sub(_SHORT_DECADE, lambda m: _say_decade(m, ctx, cardinal))


def expand_bare_decades(text: Tracked, ctx: Context) -> Tracked:
    """A '90s' that no unit rule read as seconds is a decade."""
    return text.sub(_BARE_SHORT_DECADE, lambda m: _say_decade(m, ctx, cardinal))


_YEAR_CANDIDATE = re.compile(r"(?<![\w.,$£€¥-])(?P<num>1\d{3}|20\d{2})(?![\w%]|[.,:]\d)")
_PREVIOUS_WORD = re.compile(r"([A-Za-z]+)[\s(\"'“]*$")
_NEXT_WORD = re.compile(r"\s*([A-Za-z]+)")

_YEAR_PREPOSITIONS = frozenset({
    "in", "since", "from", "until", "till", "by", "of", "during", "circa", "year", "before", "after",
    "between", "through", "early", "late", "mid", "spring", "summer", "autumn", "fall", "winter", "january",
    "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
    "december"
})  # fmt: skip
_CARDINAL_PREVIOUS = frozenset({
    "page", "pages", "number", "numbers", "room", "about", "approximately", "nearly", "almost", "exactly",
    "over", "under", "some", "total", "only", "just", "than"
})  # fmt: skip
_COUNTERS = frozenset({
    "people", "persons", "men", "women", "children", "kids", "students", "users", "customers", "employees",
    "workers", "members", "visitors", "fans", "followers", "items", "units", "pieces", "copies", "times",
    "words", "pages", "lines", "rows", "points", "votes", "cases", "deaths", "ways", "steps", "years",
    "days", "hours", "minutes", "seconds", "weeks", "months", "miles", "meters", "metres", "kilometers",
    "kilometres", "feet", "inches", "pounds", "dollars", "euros", "yen", "cents", "calories", "bytes",
    "thousand", "million", "billion", "trillion", "percent", "degrees"
})  # fmt: skip
_NOT_PLURAL = frozenset({
    "was", "has", "does", "goes", "always", "perhaps", "whereas", "towards", "afterwards", "besides",
    "sometimes", "this", "thus", "yes", "his", "hers", "ours", "yours", "theirs", "unless", "across",
    "news", "series", "species"
})  # fmt: skip


def _looks_plural(word: str) -> bool:
    return (
        len(word) >= 4
        and word.endswith("s")
        and not word.endswith(("ss", "us", "is"))
        and word not in _NOT_PLURAL
    )


def _is_year(match: re.Match[str]) -> bool:
    """A bare 4-digit number is a year unless a counted noun follows it ('1999 dollars', '1500 people')
    or a counting word precedes it ('page 1999'). After 'in', 'since', 'by' ... 1000-2099 are years;
    otherwise only 1100-2099 ('4000 items' is a cardinal)."""
    n = int(match["num"])
    previous = _PREVIOUS_WORD.search(match.string, max(0, match.start() - 30), match.start())
    following = _NEXT_WORD.match(match.string, match.end())
    previous_word = previous.group(1).lower() if previous else ""
    next_word = following.group(1).lower() if following else ""
    if next_word in _COUNTERS:
        return False
    if previous_word in _YEAR_PREPOSITIONS:
        return 1000 <= n <= 2099
    if previous_word in _CARDINAL_PREVIOUS or _looks_plural(next_word):
        return False
    return 1100 <= n <= 2099


def expand_years(text: Tracked, ctx: Context) -> Tracked:
    """'in 1999' -> 'in nineteen ninety-nine', '2005' -> 'two thousand five'; see `_is_year`."""
    return text.sub(_YEAR_CANDIDATE, lambda m: year_words(int(m["num"]), ctx) if _is_year(m) else m.group())
