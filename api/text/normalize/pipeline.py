"""The normalizer's order: spans shielded, markdown cleaned, then every English rule in `RULES` in turn."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

import api.text.normalize.abbreviations as abbreviations
import api.text.normalize.codes as codes
import api.text.normalize.common_abbreviations as common_abbreviations
import api.text.normalize.dates as dates
import api.text.normalize.figures as figures
import api.text.normalize.fractions as fractions
import api.text.normalize.markdown as markdown
import api.text.normalize.money as money
import api.text.normalize.ranges as ranges
import api.text.normalize.roman as roman
import api.text.normalize.scientific as scientific
import api.text.normalize.signs as signs
import api.text.normalize.symbols as symbols
import api.text.normalize.times as times
import api.text.normalize.units as units
import api.text.normalize.years as years
from api.text.inline import MISAKI_LINK, PAUSE_TAG
from api.text.lexicon import Lexicon
from api.text.normalize.markdown import strip_markdown, strip_markdown_links, tidy_whitespace
from api.text.normalize.numbers import Context, DateOrder
from api.text.normalize.options import NormalizationOptions
from api.text.normalize.spans import PLACEHOLDER, restore, shield, shield_one, shield_spans
from api.text.tracked import Tracked

_Rule = Callable[[Tracked, Context], Tracked]
ENGLISH_LANG_CODES = frozenset({"a", "b"})
_CRLF = re.compile("\r\n")


# The English rules in order, each with the option that switches it off (None: always on).
RULES: tuple[tuple[_Rule, str | None], ...] = (
    (symbols.expand_optional_plurals, "optional_pluralization_normalization"),
    (figures.expand_unicode_numbers, None),
    (scientific.expand_scientific_notation, "scientific_notation_normalization"),
    (roman.expand_roman_numerals, "roman_numeral_normalization"),
    (abbreviations.expand_calendar, "abbreviation_normalization"),
    (codes.expand_short_years, None),
    (dates.expand_dates, None),
    (codes.expand_durations, "duration_normalization"),
    (codes.expand_scores, "score_normalization"),
    (codes.expand_clause_letters, "identifier_normalization"),
    (ranges.expand_ranges, None),
    (times.expand_times, None),
    (codes.expand_house_numbers, "address_normalization"),
    (abbreviations.expand_titles, "abbreviation_normalization"),
    (common_abbreviations.expand_abbreviations, "abbreviation_normalization"),
    (abbreviations.expand_abbreviations, "abbreviation_normalization"),
    (abbreviations.expand_states, "abbreviation_normalization"),
    (codes.expand_street_directions, "address_normalization"),
    (signs.expand_number_signs, None),
    (money.expand_currency_codes, "currency_code_normalization"),
    (money.expand_money, None),
    (codes.expand_codes, "identifier_normalization"),
    (money.expand_scaled_numbers, None),
    (signs.expand_percentages, None),
    (signs.expand_temperatures, None),
    (years.expand_decades, None),
    (units.expand_fraction_units, "unit_normalization"),
    (fractions.expand_fractions, None),
    (units.expand_units, "unit_normalization"),
    (years.expand_bare_decades, None),
    (units.expand_dimensions, None),
    (figures.expand_ordinals, None),
    (figures.expand_versions, None),
    (figures.separate_letters_from_digits, None),
    (years.expand_years, None),
    (figures.expand_numbers, None),
    (symbols.expand_hashtags, None),
    (symbols.replace_symbols, "replace_remaining_symbols"),
    (markdown.tidy_punctuation, None),
)


def normalize_text(
    text: str,
    options: NormalizationOptions | None = None,
    *,
    lang_code: str = "a",
    date_order: DateOrder = "mdy",
) -> str:
    """`normalize_tracked`'s text."""
    return normalize_tracked(text, options, lang_code=lang_code, date_order=date_order).text


def _printable(char: str) -> bool:
    """False for control and format characters (NUL, escape codes, zero-width marks, soft hyphens),
    which are dropped; line breaks and tabs stay."""
    return char in "\n\r\t" or unicodedata.category(char) not in ("Cc", "Cf")


def normalize_tracked(
    text: str,
    options: NormalizationOptions | None = None,
    *,
    lang_code: str = "a",
    date_order: DateOrder = "mdy",
    offset: int = 0,
    lexicon: Lexicon | None = None,
) -> Tracked:
    """Turn written forms into the words a reader would say, for American ('a') or British ('b') English.

    Order: misaki's `[word](/phonemes/)` syntax and `[pause:…]` tags are shielded; markdown links become
    their text; e-mail addresses, URLs and phone numbers are spoken (or kept verbatim when their option
    is off) and shielded; the rest of the markdown and extra whitespace go. Then, for English only:
    optional plurals, unicode fractions, roman numerals, dates, ranges, times (and ratios),
    abbreviations, signs before numbers, money, scaled numbers, percentages, temperatures, decades,
    fractions (those before a unit first), units, dimensions, ordinals, versions, years, every other
    number, hashtags, remaining symbols (see `RULES`).

    For other lang_codes only the markdown and whitespace clean-up runs: reading numbers, dates and
    units in other languages is out of scope. `date_order` resolves ambiguous numeric dates
    ("03/04/2026") and picks how numeric dates are said: "mdy" -> "March fourth, ...", "dmy" -> "the
    third of April, ...". With `options.normalize` False the text comes back as given, less its control
    and format characters (dropped always). Every character of the result knows the span of `text` it
    came from (`Tracked`), counted from `offset`. English words in `lexicon` get its phonemes (as misaki's
    `[word](/phonemes/)`) before any rule.
    """
    options = options or NormalizationOptions()
    tracked = Tracked.of(text, offset).keep(_printable)
    if not options.normalize:
        return tracked
    english = lang_code in ENGLISH_LANG_CODES
    spans: list[str] = []
    tracked = tracked.sub(_CRLF, "\n").sub(PLACEHOLDER, "")
    tracked = shield(shield(tracked, MISAKI_LINK, spans), PAUSE_TAG, spans)
    if lexicon is not None and english:
        tracked = lexicon.apply(tracked, lambda match: shield_one(match, spans))
    tracked = shield_spans(strip_markdown_links(tracked), options, english, spans)
    tracked = tidy_whitespace(strip_markdown(tracked))
    if english:
        context = Context(british=lang_code == "b", date_order=date_order, units=options.unit_normalization)
        for rule, option in RULES:
            if option is None or getattr(options, option):
                tracked = rule(tracked, context)
    return restore(tidy_whitespace(tracked), spans)
