"""English text normalization for TTS: written forms (numbers, money, dates, times, URLs, units,
abbreviations, symbols, markdown) become the words a reader would say, before misaki phonemizes them.

Every rule is a small function from text to text. `normalize_text` runs them in a fixed order (see its
docstring); the order matters because a rule consumes the digits a later, more general rule would read
differently (a date before a range, money before a plain number, a year after every other 4-digit use).

Spans that must reach misaki untouched (its `[word](/phonemes/)` syntax, `[pause:1.5s]` tags, and URLs,
e-mail addresses and phone numbers, spoken or verbatim) are swapped for private-use placeholder
characters first, so no later rule can see inside them, and put back at the end.
"""

from __future__ import annotations

import datetime
import re
import unicodedata
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel, Field

from api.text import abbreviations, codes
from api.text.inline import MISAKI_LINK, PAUSE_TAG
from api.text.lexicon import Lexicon
from api.text.numbers import (
    INT,
    NUMBER,
    SIGNED,
    Context,
    DateOrder,
    british_spelling,
    cardinal,
    digits_of,
    is_one,
    number_words,
    ordinal,
    paired,
    period_if_sentence_end,
    plural_of_number_words,
    whole_number,
    year_words,
)
from api.text.tracked import Tracked

_Rule = Callable[[Tracked, Context], Tracked]
ENGLISH_LANG_CODES = frozenset({"a", "b"})


class NormalizationOptions(BaseModel):
    """Which optional normalization rules run; field names match what Kokoro-FastAPI clients send."""

    normalize: bool = Field(
        default=True,
        strict=True,
        description="Master switch. False returns the input as sent: no rule runs, not even the markdown "
        "and whitespace clean-up; only control and format characters (NUL, zero-width marks) are dropped.",
    )
    unit_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read unit abbreviations after a number as words: '5 km' -> 'five kilometers', "
        "'1 kg' -> 'one kilogram'. On by default (Kokoro-FastAPI defaults to off) because without it "
        "misaki spells the abbreviation letter by letter ('five K M'). When off, the number is still "
        "read and the abbreviation is left as written.",
    )
    url_normalization: bool = Field(
        default=True,
        strict=True,
        description="Speak URLs: 'https://example.com/docs' -> 'example dot com slash docs'. When off, "
        "URLs are left exactly as written.",
    )
    email_normalization: bool = Field(
        default=True,
        strict=True,
        description="Speak e-mail addresses: 'jane.doe@example.com' -> 'jane dot doe at example dot com'. "
        "When off, addresses are left exactly as written.",
    )
    phone_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read phone numbers digit by digit in their groups: '555-123-4567' -> "
        "'five five five, one two three, four five six seven'. When off, they are left as written.",
    )
    optional_pluralization_normalization: bool = Field(
        default=True,
        strict=True,
        description="Turn an optional plural '(s)' into a plain plural: 'file(s)' -> 'files'.",
    )
    abbreviation_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read abbreviations as their words where the context says which: titles before a "
        "name ('Gen. Patton' -> 'General Patton', 'Dr.' -> 'Doctor' before a name, 'Drive' after a street "
        "name), weekdays and months ('Mon.–Fri.' -> 'Monday to Friday'), Latin and business "
        "abbreviations ('e.g.', 'i.e.', 'etc.', 'p.a.', 'incl.', 'Inc.', 'Ltd.'), document parts and legal "
        "references ('Sec. 5', '§§ 5-7', 'para.', 'p. 12'), street types ('Ave.', 'Blvd.') and US states "
        "after a city ('Austin, TX 78701'). When off, abbreviations are left as written.",
    )
    address_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read house numbers before a street in pairs, as people say them: '1600 Pennsylvania "
        "Ave.' -> 'sixteen hundred ...', '221B Baker Street' -> 'two twenty-one B ...', with the "
        "directions around them ('N.', 'NW'). When off, house numbers are read as plain numbers.",
    )
    identifier_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read codes as letters and paired digits: flight numbers ('BA 2490' -> 'BA "
        "twenty-four ninety', 'UA123'), model and part numbers ('A320', 'F-150', 'Boeing 747'), room, "
        "suite and section numbers ('Room 101' -> 'one oh one'), ISBNs digit by digit, and clause letters "
        "('5(b)' -> 'five B'). When off, their numbers are read as plain numbers.",
    )
    roman_numeral_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read roman numerals where the context says they are numbers: after chapter-like words "
        "('Chapter IV', 'Super Bowl LVII'), after regnal names ('Henry VIII' -> 'Henry the eighth'), before "
        "'century', in titles ('Rocky II') and headings; never the pronoun 'I'. When off, they are left "
        "as written.",
    )
    duration_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read clock-like durations as hours, minutes and seconds: 'finished in 2:03:45' -> "
        "'two hours, three minutes and forty-five seconds', 'took 12:34', '3:43.13', '2h 30m'. When off, "
        "they are read as clock times.",
    )
    score_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read a zero in a score as 'nothing' ('won 1-0' -> 'one to nothing'; British 'nil') and "
        "a won-lost record with 'and' ('went 10-2' -> 'ten and two'). When off, they read as ranges.",
    )
    scientific_notation_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read scientific notation and powers: '6.02e23' and '6.02 × 10^23' -> 'six point zero "
        "two times ten to the twenty-third', '10⁻³' -> 'ten to the minus third', '5²' -> 'five squared'. "
        "When off, they are left to the other rules.",
    )
    currency_code_normalization: bool = Field(
        default=True,
        strict=True,
        description="Read amounts with ISO 4217 currency codes and prefixed dollar signs: 'USD 5' -> 'five "
        "US dollars', 'EUR 3.50' -> 'three euros and fifty cents', '5 GBP', 'C$10', '₹500'. When off, the "
        "code is left as written.",
    )
    replace_remaining_symbols: bool = Field(
        default=True,
        strict=True,
        description="Replace symbols still standing alone after the other rules with words ('&' -> "
        "'and', '@' -> 'at', '+' -> 'plus', '=' -> 'equals', '/' -> 'slash', 'C#' -> 'C sharp'), drop "
        "decorative ones ('*', '~', '^', '|', '_') and remove emoji.",
    )


# --- protected spans --------------------------------------------------------------------------------------

_PLACEHOLDER_BASE = 0xF0000
_PRIVATE_USE = r"\U000f0000-\U000ffffd"
_PLACEHOLDER = re.compile(f"[{_PRIVATE_USE}]")
_CRLF = re.compile("\r\n")
# misaki's own syntax: [text](/phonemes/), [text](#flags#), [text](+1), [text](-0.5)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
# A URL never runs into a shielded span (the placeholders are private-use characters).
_URL_END = rf"[^\s<>\"'`{_PRIVATE_USE}]*[^\s<>\"'`.,;:!?)\]{_PRIVATE_USE}]"
_URL = re.compile(
    rf"\b(?:(?:https?|ftp)://|www\.){_URL_END}"
    r"|(?<![\w@./-])[A-Za-z0-9][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*"
    rf"\.(?:com|org|net|edu|gov|io|ai|dev|app|co|uk|us|de|fr|info|me|tv|xyz)\b(?:/{_URL_END})?",
    re.IGNORECASE,
)
_URL_SCHEME = re.compile(r"^[a-z]+://", re.IGNORECASE)
_ADDRESS_TOKEN = re.compile(r"[A-Za-z]+|\d+|.")
_ADDRESS_SYMBOLS = {
    ".": "dot", "/": "slash", ":": "colon", "-": "dash", "_": "underscore", "?": "question mark",
    "=": "equals", "&": "and", "#": "hash", "%": "percent", "~": "tilde", "+": "plus", "@": "at",
}  # fmt: skip
_PHONE = re.compile(
    r"(?<![\w+])(?:"
    r"(?:\+?1[ .-]?)?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}"  # North American
    r"|\+\d{1,3}(?:[ .-]\(?\d{1,4}\)?){2,5}"  # international, with a country code
    r")(?![\w-])"
)
_PHONE_GROUP = re.compile(r"\+?\d+")


def _shield(
    text: Tracked, pattern: re.Pattern[str], spans: list[str], speak: Callable[[str], str] | None = None
) -> Tracked:
    """Swap each match for a placeholder; `spans` keeps what goes back (the match, or how it is spoken)."""

    def put(match: re.Match[str]) -> str:
        spans.append(speak(match.group()) if speak else match.group())
        return chr(_PLACEHOLDER_BASE + len(spans) - 1)

    return text.sub(pattern, put)


def _shield_one(spoken: str, spans: list[str]) -> str:
    spans.append(spoken)
    return chr(_PLACEHOLDER_BASE + len(spans) - 1)


def _restore(text: Tracked, spans: list[str]) -> Tracked:
    return text.sub(_PLACEHOLDER, lambda match: spans[ord(match.group()) - _PLACEHOLDER_BASE])


def _speak_address(address: str) -> str:
    """'jane.doe42@example.com' -> 'jane dot doe four two at example dot com'."""
    words = []
    for token in _ADDRESS_TOKEN.findall(address):
        if token.isdigit():
            words.append(digits_of(token))
        elif token.isalpha():
            words.append(token)
        elif token in _ADDRESS_SYMBOLS:
            words.append(_ADDRESS_SYMBOLS[token])
    return " ".join(words)


def _speak_url(url: str) -> str:
    return _speak_address(_URL_SCHEME.sub("", url).rstrip("/"))


_HUNDRED_AREA_CODE = re.compile(r"[2-9]00")


def _speak_phone(phone: str) -> str:
    """'+1 (555) 123-4567' -> 'plus one, five five five, one two three, four five six seven'."""
    groups = _PHONE_GROUP.findall(phone)
    spoken = [("plus " if group[0] == "+" else "") + digits_of(group.lstrip("+"), "oh") for group in groups]
    area = 1 if len(groups) > 1 and groups[0].lstrip("+") == "1" else 0
    if area < len(groups) and _HUNDRED_AREA_CODE.fullmatch(groups[area]):
        # Toll-free and premium area codes are said as hundreds: '1-800-...' -> 'one, eight hundred, ...'.
        spoken[area] = f"{digits_of(groups[area][0], 'oh')} hundred"
    return ", ".join(spoken)


def _shield_spans(text: Tracked, options: NormalizationOptions, english: bool, spans: list[str]) -> Tracked:
    """Shield addresses and phone numbers: spoken when their rule is on (English only), else verbatim."""
    text = _shield(text, _EMAIL, spans, _speak_address if english and options.email_normalization else None)
    text = _shield(text, _URL, spans, _speak_url if english and options.url_normalization else None)
    if english:
        text = _shield(text, _PHONE, spans, _speak_phone if options.phone_normalization else None)
    return text


# --- markdown and whitespace ------------------------------------------------------------------------------

_MD_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\n]*\)")
_MD_AUTOLINK = re.compile(r"<((?:https?|ftp)://[^>\s]+)>")
_MD_CLEANUPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^[ \t]*(?:```|~~~).*$", re.MULTILINE), ""),  # code fences
    (re.compile(r"^[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.MULTILINE), ""),  # horizontal rules
    (re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE), r"\1"),  # headings
    (re.compile(r"^[ \t]*(?:>[ \t]?)+", re.MULTILINE), ""),  # block quotes
    (re.compile(r"^[ \t]*(?:[-*+•]|\d{1,3}[.)])[ \t]+", re.MULTILINE), ""),  # list bullets
    (re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>\n]*)?/?>"), ""),  # inline HTML tags
    (re.compile(r"`+([^`\n]+)`+"), r"\1"),  # inline code
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # bold
    (re.compile(r"~~(?=\S)(.+?)(?<=\S)~~"), r"\1"),  # strike-through
    (re.compile(r"(?<![*\w])\*(?=\S)(.+?)(?<=\S)\*(?![*\w])"), r"\1"),  # *italics*
    (re.compile(r"(?<![_\w])_(?=\S)(.+?)(?<=\S)_(?![_\w])"), r"\1"),  # _italics_, not snake_case
)
_INLINE_SPACE = re.compile(r"[^\S\n]+")
_LINE_EDGE_SPACE = re.compile(r" *\n *")
_BLANK_LINES = re.compile(r"\n{3,}")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" +([,.;:!?])(?!\w)")


def _strip_markdown_links(text: Tracked) -> Tracked:
    """'[text](url)' and '![alt](url)' -> the text; '<https://x.com>' -> the bare URL."""
    return text.sub(_MD_LINK, r"\1").sub(_MD_AUTOLINK, r"\1")


def _strip_markdown(text: Tracked) -> Tracked:
    for pattern, replacement in _MD_CLEANUPS:
        text = text.sub(pattern, replacement)
    return text


def _tidy_whitespace(text: Tracked) -> Tracked:
    """Collapse runs of spaces, trim lines, keep single line breaks and at most one blank line."""
    text = text.sub(_INLINE_SPACE, " ")
    text = text.sub(_LINE_EDGE_SPACE, "\n")
    return text.sub(_BLANK_LINES, "\n\n").strip()


# --- optional plurals, unicode number forms ---------------------------------------------------------------

_OPTIONAL_PLURAL = re.compile(r"(?<=[A-Za-z])\((s|es)\)", re.IGNORECASE)
_VULGAR_FRACTION = re.compile(r"(\d?)([\u00bc-\u00be\u2150-\u215e])")
_MINUS_SIGN = re.compile("−")


def _expand_optional_plurals(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_OPTIONAL_PLURAL, r"\1")


def _expand_unicode_numbers(text: Tracked, ctx: Context) -> Tracked:
    """'2½' -> '2 1/2', '−5' (minus sign) -> '-5'."""

    def ascii_fraction(match: re.Match[str]) -> str:
        fraction = unicodedata.normalize("NFKC", match.group(2)).replace("\u2044", "/")
        return f"{match.group(1)} {fraction}" if match.group(1) else fraction

    return text.sub(_VULGAR_FRACTION, ascii_fraction).sub(_MINUS_SIGN, "-")


# --- roman numerals ---------------------------------------------------------------------------------------

# Only numerals made of I, V, X, L (1-89): C, D and M turn words like "MIX", "DIV", "CD" into numbers.
_ROMAN = r"(?=[IVXL])(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})(?<=[IVXL])"
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50}
_ROMAN_KEYWORDS = (
    "chapter|part|book|volume|vol\\.|art\\.|act|scene|section|article|appendix|episode|season|phase|stage|"
    "level|round|war|bowl|title|type|class|category|grade|mark|lesson|psalm|canto|unit|step|"
    "schedule|division|tier"
)
_REGNAL_NAMES = (
    "Henry|Edward|George|William|Richard|James|Charles|John|Elizabeth|Mary|Anne|Louis|Philip|Frederick|"
    "Peter|Catherine|Nicholas|Alexander|Ivan|Paul|Benedict|Gregory|Pius|Leo|Innocent|Clement|Boniface|"
    "Urban|Sixtus|Francis|Ferdinand|Alfonso|Felipe|Carlos|Gustav|Gustavus|Christian|Haakon|Olav|Harald|"
    "Wilhelm|Ludwig|Otto|Napoleon|Ramesses|Thutmose|Amenhotep|Darius|Xerxes|Ptolemy|Constantine|Justinian|"
    "Umberto|Rama|Mehmed|Murad|Selim|Suleiman|Stephen|Robert|David|Malcolm|Kenneth|Harold|Victor|Sancho|"
    "Rudolf|Casimir|Sigismund|Ladislaus|Vladislav|Eric|Magnus|Baldwin|Amadeus|Hussein|Abdullah|Farouk"
)
_ROMAN_AFTER_KEYWORD = re.compile(rf"\b(?P<word>(?i:{_ROMAN_KEYWORDS}))\s+(?P<roman>{_ROMAN})\b(?!-)")
_ROMAN_AFTER_NAME = re.compile(rf"\b(?P<name>{_REGNAL_NAMES})\s+(?P<roman>{_ROMAN})\b(?!-)")
# A heading line "IV", "IV.", "IV:" or "IV. The Return"; a bare "I" line is left alone (the pronoun).
_ROMAN_LINE = re.compile(rf"^(?P<roman>{_ROMAN})(?=(?P<end>[.:][ \t]*$|\.[ \t]+[A-Z]|[ \t]*$))", re.MULTILINE)


def _roman_value(numeral: str) -> int:
    total = 0
    for char, following in zip(numeral, numeral[1:] + " ", strict=True):
        value = _ROMAN_VALUES[char]
        total += -value if _ROMAN_VALUES.get(following, 0) > value else value
    return total


# A given name, a surname and II-IV: a personal suffix ('Robert Smith III' -> 'Robert Smith the third').
_GIVEN_NAMES = rf"{_REGNAL_NAMES}|Martin|Thomas|Joseph|Michael|Daniel|Mark|Steven|Donald|Howard|Thurston|Hank"
_PERSONAL_SUFFIX = re.compile(
    rf"\b(?P<names>(?:{_GIVEN_NAMES})(?:\s+[A-Z][a-z]+){{1,2}})\s+(?P<roman>II|III|IV)\b(?![-'’]\w)"
)
_ROMAN_CENTURY = re.compile(rf"\b(?P<roman>{_ROMAN})(?:th|st|nd|rd)?(?=\s+century\b)")
_LOWER_ROMAN = re.compile(r"\b(?P<word>(?i:scene|page|pages)|p\.|pp\.)\s+(?P<roman>[ivxl]+)\b(?![-'’]\w)")
_LOWER_ROMAN_WORDS = {"p.": "page", "pp.": "pages"}
# A title word and a numeral of two or more letters: 'Rocky II', 'Apollo XIII', 'Vatican II'. Not 'IV'
# (an IV drip), 'XL' (a size), 'LI', 'LV', and not after words that start a phrase.
_TITLE_ROMAN = re.compile(rf"\b(?P<word>[A-Z][a-z]+)\s+(?P<roman>{_ROMAN})\b(?![-'’]\w)")
_NOT_ROMAN_TITLES = frozenset({
    "The", "A", "An", "In", "At", "On", "To", "Of", "And", "Or", "Size", "Sizes", "Go", "See", "With", "For",
})  # fmt: skip
_NOT_TITLE_NUMERALS = frozenset({"I", "V", "X", "L", "IV", "XL", "LI", "LV"})


def _keyword(word: str) -> str:
    """'art.' -> 'article', 'Vol.' -> 'Volume'; other keywords as written."""
    full = {"art.": "article", "vol.": "volume"}.get(word.lower())
    if full is None:
        return word
    return full.capitalize() if word[0].isupper() else full


def _say_title_roman(match: re.Match[str], ctx: Context) -> str:
    if match["word"] in _NOT_ROMAN_TITLES or match["roman"] in _NOT_TITLE_NUMERALS:
        return match.group()
    return f"{match['word']} {cardinal(_roman_value(match['roman']), ctx)}"


def _say_lower_roman(match: re.Match[str], ctx: Context) -> str:
    word = _LOWER_ROMAN_WORDS.get(match["word"], match["word"])
    return f"{word} {cardinal(_roman_value(match['roman'].upper()), ctx)}"


def _expand_roman_numerals(text: Tracked, ctx: Context) -> Tracked:
    """'Chapter IV' -> 'Chapter four', 'Henry VIII' -> 'Henry the eighth', heading 'IV.' -> 'Four.'."""
    text = text.sub(
        _ROMAN_AFTER_KEYWORD, lambda m: f"{_keyword(m['word'])} {cardinal(_roman_value(m['roman']), ctx)}"
    )
    text = text.sub(_ROMAN_AFTER_NAME, lambda m: f"{m['name']} the {ordinal(_roman_value(m['roman']), ctx)}")
    text = text.sub(_PERSONAL_SUFFIX, lambda m: f"{m['names']} the {ordinal(_roman_value(m['roman']), ctx)}")
    text = text.sub(_ROMAN_CENTURY, lambda m: ordinal(_roman_value(m["roman"]), ctx))
    text = text.sub(_LOWER_ROMAN, lambda m: _say_lower_roman(m, ctx))
    text = text.sub(_TITLE_ROMAN, lambda m: _say_title_roman(m, ctx))
    return text.sub(_ROMAN_LINE, lambda m: _roman_heading(m, ctx))


def _roman_heading(match: re.Match[str], ctx: Context) -> str:
    if match["roman"] == "I" and not match["end"].strip():
        return match.group()
    return cardinal(_roman_value(match["roman"]), ctx).capitalize()


# --- dates ------------------------------------------------------------------------------------------------

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


def _expand_dates(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_ORDINAL_RANGE, _say_ordinal_range)
    text = text.sub(_DATE_ISO, lambda m: _say_iso_date(m, ctx))
    text = text.sub(_DATE_NUMERIC, lambda m: _say_numeric_date(m, ctx))
    text = text.sub(_DATE_MONTH_FIRST, lambda m: _say_written_date(m, "mdy", ctx))
    return text.sub(_DATE_DAY_FIRST, lambda m: _say_written_date(m, "dmy", ctx))


# --- ranges and times -------------------------------------------------------------------------------------

_CURRENCY_SIGNS = "$£€¥"
_RANGE_ITEM = rf"[$£€¥]?(?:\d{{1,2}}:\d{{2}}|{NUMBER})"
_RANGE_RIGHT = rf"(?={_RANGE_ITEM}(?!\d|-\d|[.,:/]\d))"
# "10 - 5 = 5" is arithmetic: a spaced hyphen with an "=" later on the line is a minus.
_SPACED_MINUS = re.compile(rf"(?<=\d)\s+-\s+{_RANGE_RIGHT}(?=[^\n=]*=)")
_RANGE = re.compile(rf"(?<![\w.,:/-])(?P<left>{_RANGE_ITEM})(?:-|\s+-\s+|\s*[–—]\s*){_RANGE_RIGHT}")
_AM_PM = r"(?:\s?(?P<ampm>[AaPp])\.?[Mm](?P<dot>\.)?(?![A-Za-z]))"
_CLOCK_TIME = re.compile(rf"(?<![\d:.])(?P<h>\d{{1,2}}):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?(?![\d:]){_AM_PM}?")
_HOUR_AM_PM = re.compile(rf"(?<![\d:.,])(?P<h>\d{{1,2}}){_AM_PM}")
# What is left of "digits:digits" after the clock times is a ratio or a score: "16:9", "3:2".
_RATIO = re.compile(r"(?<![\w:.])(?P<a>\d+):(?P<b>\d+)(?![\d:])")


# '9am–5pm', '$20K–$30K', '20%–30%': a range whose left side ends in a suffix.
_SUFFIXED_RANGE = re.compile(
    rf"(?P<left>(?<![\w.])(?:\d{{1,2}}(?::\d\d)?\s?[AaPp]\.?[Mm]\.?|[$£€¥]{NUMBER}\s?(?:[kKmMbB]|bn|mn|tn)"
    rf"|{NUMBER}\s?%))\s*[-–—]\s*(?=[$£€¥]?\d)"
)
_SCALED_RIGHT = re.compile(rf"{NUMBER}\s?(?:thousand|million|billion|trillion|[kKmMbB]|bn|mn|tn)(?![A-Za-z])")


def _expand_ranges(text: Tracked, ctx: Context) -> Tracked:
    """'1-2' -> '1 to 2', 'pages 10–12' -> 'pages 10 to 12', '5km-10km' -> '5km to 10km'; the numbers
    are read by later rules."""
    text = text.sub(_SPACED_MINUS, " minus ")
    text = text.sub(_UNIT_RANGE, r"\g<left> to ")
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


def _expand_times(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_CLOCK_TIME, lambda m: _say_time(m, ctx))
    text = text.sub(_HOUR_AM_PM, lambda m: _say_time(m, ctx))
    return text.sub(_RATIO, r"\g<a> to \g<b>")


# --- abbreviations ----------------------------------------------------------------------------------------

_TITLES = {"Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Dr": "Doctor", "Prof": "Professor", "Mt": "Mount"}
_TITLE = re.compile(r"\b(?P<abbr>Mrs|Mr|Ms|Dr|Prof|Mt)(?:\.|(?=\s+[A-Z]))")
# St. is Saint before a name ("St. Louis"), Street after one ("Main St.", "42 Elm St").
_SAINT_OR_STREET = re.compile(
    r"(?P<prev>\b(?:[A-Z][a-z]+|\d+)[ \t]+)?\bSt(?:\.|(?=\s+[A-Z][a-z])|(?P<bare>\b(?=\s+[a-z]|[,;:!?]|$)))"
)
_LINE_END = re.compile(r"[ \t]*(?:\n|$)")
# abbreviation -> (words, whether its period may also end the sentence)
_ABBREVIATIONS: dict[str, tuple[str, bool]] = {
    "etc": ("et cetera", True), "e.g": ("for example", False), "i.e": ("that is", False),
    "vs": ("versus", False), "approx": ("approximately", False), "jr": ("Junior", True),
    "sr": ("Senior", True), "ave": ("Avenue", True), "blvd": ("Boulevard", True), "rd": ("Road", True),
    "inc": ("Incorporated", True), "ltd": ("Limited", True), "corp": ("Corporation", True),
    "dept": ("Department", True), "fig": ("Figure", False), "jan": ("January", False),
    "feb": ("February", False), "mar": ("March", False), "apr": ("April", False), "jun": ("June", False),
    "jul": ("July", False), "aug": ("August", False), "sep": ("September", False),
    "sept": ("September", False), "oct": ("October", False), "nov": ("November", False),
    "dec": ("December", False),
}  # fmt: skip
_ABBREVIATION = re.compile(
    r"(?<![\w.])(?P<abbr>etc|e\.g|i\.e|vs|approx|(?-i:Jr|Sr|Ave|Blvd|Rd|Inc|Ltd|Corp|Dept|Fig"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec))\.|\b(?P<bare>vs)\b",
    re.IGNORECASE,
)
_NUMBER_ABBREVIATION = re.compile(r"\b[Nn]o\.\s?(?=\d)|\b[Nn]os\.\s?(?=\d)|№\s?(?=\d)")
# Before a code that starts with letters ('part no. XJ-220B') 'no.' could also be the word that ends a
# sentence ('He said no. A4 is fine'), so there it needs a noun that numbers things before it.
_NUMBER_BEFORE_CODE = re.compile(
    r"(?P<cue>\b(?i:part|model|serial|item|order|invoice|account|policy|case|ticket|product|catalog"
    r"|catalogue|style|lot|patent|claim|file|docket|booking|confirmation|tracking|reference|ref)\.?\s+)"
    r"[Nn]o\.\s?(?=[A-Z]{1,4}-?\d)"
)


def _say_title(match: re.Match[str]) -> str:
    """'Dr. Smith' -> 'Doctor Smith'; a title that ends its line keeps the period ('call the Dr.')."""
    ends_line = match.group().endswith(".") and _LINE_END.match(match.string, match.end())
    return _TITLES[match["abbr"]] + ("." if ends_line else "")


def _say_saint_or_street(match: re.Match[str]) -> str:
    prev = match["prev"] or ""
    after_street_name = bool(prev) and prev.strip() not in abbreviations.NOT_STREET_NAMES
    if match["bare"] is not None and not after_street_name:
        return match.group()
    if not after_street_name and abbreviations.NAME_NEXT.match(match.string, match.end()):
        return prev + "Saint"
    return prev + "Street" + (period_if_sentence_end(match) if match.group().endswith(".") else "")


def _say_abbreviation(match: re.Match[str]) -> str:
    abbr = (match["abbr"] or match["bare"]).lower()
    words, may_end_sentence = _ABBREVIATIONS[abbr]
    if match.group()[0].isupper() and words[0].islower():
        words = words.capitalize()
    return words + (period_if_sentence_end(match) if may_end_sentence else "")


def _expand_abbreviations(text: Tracked, ctx: Context) -> Tracked:
    """Titles (Dr., Mr., Mrs., Ms.), St., etc., e.g., i.e., vs., approx., 'No. 5', month abbreviations."""
    text = text.sub(_TITLE, _say_title)
    text = text.sub(_SAINT_OR_STREET, _say_saint_or_street)
    text = text.sub(
        _NUMBER_ABBREVIATION, lambda m: "numbers " if m.group().lower().startswith("nos") else "number "
    )
    text = text.sub(_NUMBER_BEFORE_CODE, r"\g<cue>number ")
    return text.sub(_ABBREVIATION, _say_abbreviation)


# --- signs before numbers, money, scales, percentages, temperatures ---------------------------------------

_NUMBER_SIGN_WORDS = {"#": "number", "~": "about", "≈": "approximately", "±": "plus or minus", "+": "plus"}
_NUMBER_SIGN = re.compile(r"(?<![\w)&#])(?P<sign>[#~≈±+])(?=[$£€¥]?\d)")


class _Currency(NamedTuple):
    singular: str
    plural: str
    minor_singular: str | None
    minor_plural: str | None


_CURRENCIES = {
    "$": _Currency("dollar", "dollars", "cent", "cents"),
    "£": _Currency("pound", "pounds", "penny", "pence"),
    "€": _Currency("euro", "euros", "cent", "cents"),
    "¥": _Currency("yen", "yen", None, None),
}
_DOLLAR_CENTS = ("cent", "cents")
# ISO 4217 codes and prefixed signs (`currency_code_normalization`); minor units only where they are said.
_CODE_CURRENCIES = {
    "USD": _Currency("US dollar", "US dollars", *_DOLLAR_CENTS),
    "EUR": _Currency("euro", "euros", *_DOLLAR_CENTS),
    "GBP": _Currency("British pound", "British pounds", "penny", "pence"),
    "JPY": _Currency("yen", "yen", None, None),
    "CHF": _Currency("Swiss franc", "Swiss francs", None, None),
    "CAD": _Currency("Canadian dollar", "Canadian dollars", *_DOLLAR_CENTS),
    "AUD": _Currency("Australian dollar", "Australian dollars", *_DOLLAR_CENTS),
    "NZD": _Currency("New Zealand dollar", "New Zealand dollars", *_DOLLAR_CENTS),
    "HKD": _Currency("Hong Kong dollar", "Hong Kong dollars", *_DOLLAR_CENTS),
    "SGD": _Currency("Singapore dollar", "Singapore dollars", *_DOLLAR_CENTS),
    "INR": _Currency("Indian rupee", "Indian rupees", None, None),
    "CNY": _Currency("Chinese yuan", "Chinese yuan", None, None),
    "SEK": _Currency("Swedish krona", "Swedish kronor", None, None),
    "NOK": _Currency("Norwegian krone", "Norwegian kroner", None, None),
    "DKK": _Currency("Danish krone", "Danish kroner", None, None),
    "MXN": _Currency("Mexican peso", "Mexican pesos", None, None),
    "BRL": _Currency("Brazilian real", "Brazilian reais", None, None),
    "KRW": _Currency("South Korean won", "South Korean won", None, None),
    "ZAR": _Currency("South African rand", "South African rand", None, None),
    "RUB": _Currency("Russian ruble", "Russian rubles", None, None),
    "PLN": _Currency("Polish zloty", "Polish zlotys", None, None),
    "BTC": _Currency("bitcoin", "bitcoin", None, None),
}
_PREFIXED_CURRENCIES = {
    "US$": _CODE_CURRENCIES["USD"], "C$": _CODE_CURRENCIES["CAD"], "A$": _CODE_CURRENCIES["AUD"],
    "HK$": _CODE_CURRENCIES["HKD"], "NZ$": _CODE_CURRENCIES["NZD"], "S$": _CODE_CURRENCIES["SGD"],
    "R$": _CODE_CURRENCIES["BRL"], "₹": _Currency("rupee", "rupees", None, None),
    "₩": _Currency("won", "won", None, None), "₽": _Currency("ruble", "rubles", None, None),
    "₪": _Currency("shekel", "shekels", None, None), "₱": _Currency("peso", "pesos", None, None),
    "₺": _Currency("lira", "lira", None, None),
}  # fmt: skip
_ALL_CURRENCIES = {**_CURRENCIES, **_CODE_CURRENCIES, **_PREFIXED_CURRENCIES}
_SCALES = {
    "k": "thousand",
    "m": "million",
    "mn": "million",
    "b": "billion",
    "bn": "billion",
    "tn": "trillion",
}
_AMOUNT = rf"(?P<amount>{INT})(?:\.(?P<frac>\d+))?"
_SCALE = (
    r"(?:\s?(?P<word>thousand|million|billion|trillion)\b|(?P<abbr>[kKmMbB]|\s?(?:mn|bn|tn))(?![A-Za-z]))?"
)
_MONEY_BEFORE = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?P<cur>[$£€¥])\s?{_AMOUNT}{_SCALE}")
_CODES = "|".join(_CODE_CURRENCIES)
_PREFIXES = "|".join(re.escape(prefix) for prefix in sorted(_PREFIXED_CURRENCIES, key=len, reverse=True))
_CODE_MONEY_BEFORE = re.compile(
    rf"(?P<sign>(?<!\w)[-−])?(?:(?<![A-Za-z])(?P<code>{_CODES})\s?|(?<![A-Za-z$])(?P<prefix>{_PREFIXES})\s?)"
    rf"(?=\d){_AMOUNT}{_SCALE}"
)
_CODE_MONEY_AFTER = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?<![\w.,]){_AMOUNT}\s?(?P<code>{_CODES})\b")
# 'a $5bn deal', 'a $20 bill': an amount used as an adjective takes the singular.
_ARTICLE_BEFORE = re.compile(r"\b[Aa]n?\s+-?$")
_NOUN_AFTER = re.compile(r"\s+(?P<word>[a-z]+)\b")
_NOT_NOUNS = frozenset({
    "of", "in", "on", "for", "to", "and", "or", "per", "each", "a", "an", "the", "is", "was", "from", "at",
    "with", "by", "more", "less", "than", "month", "year", "week", "day", "hour", "night", "off",
})  # fmt: skip
_MONEY_AFTER = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?<![\w.,]){_AMOUNT}\s?(?P<cur>[£€¥])")
_CENTS = re.compile(rf"(?<![\w.,])(?P<amount>{INT})\s?¢")
_SCALED_NUMBER = re.compile(rf"(?<![\w.,$£€¥])(?P<num>{NUMBER})(?P<abbr>M|B|bn|mn|tn)(?![A-Za-z])")
_PERCENT = re.compile(rf"(?<!/)(?P<num>{SIGNED})\s?(?P<sign>[%‰‱])")
_PERCENT_WORDS = {"%": "percent", "‰": "per mille", "‱": "per ten thousand"}
_DEGREES = re.compile(
    rf"(?P<num>{SIGNED})\s?(?:[°º]\s?(?:(?P<scale>[CF])|(?P<compass>[NSEW]))?|(?P<symbol>[℃℉]))(?![A-Za-z])"
)
_DEGREES_LETTER = re.compile(r"\bdegrees\s+(?P<scale>[CF])\b(?!\.\w)")
_DEGREES_ALONE = re.compile(r"(?<![\d\w])[°º]\s?(?P<scale>[CF])\b")
_SCALE_NAMES = {"C": "Celsius", "F": "Fahrenheit", "℃": "Celsius", "℉": "Fahrenheit"}
_COMPASS = {"N": "north", "S": "south", "E": "east", "W": "west"}


def _count(n: int, singular: str, plural: str, ctx: Context) -> str:
    return f"{cardinal(n, ctx)} {singular if n == 1 else plural}"


def _is_adjective(match: re.Match[str]) -> bool:
    if not _ARTICLE_BEFORE.search(match.string, max(0, match.start() - 4), match.start()):
        return False
    noun = _NOUN_AFTER.match(match.string, match.end())
    return noun is not None and noun["word"] not in _NOT_NOUNS


def _say_money(match: re.Match[str], ctx: Context) -> str:
    """'$3.50' -> 'three dollars and fifty cents', '$2.5m' -> 'two point five million dollars', 'a $5bn
    deal' -> 'a five billion dollar deal'."""
    groups = match.groupdict()
    currency = _ALL_CURRENCIES[groups.get("cur") or groups.get("code") or groups["prefix"]]
    if (groups.get("word") or groups.get("abbr") or not match["frac"]) and _is_adjective(match):
        currency = currency._replace(plural=currency.singular)
    sign = "minus " if match["sign"] else ""
    groups = match.groupdict()
    scale = groups.get("word") or _SCALES.get((groups.get("abbr") or "").strip().lower())
    whole, fraction = match["amount"].replace(",", ""), match["frac"] or ""
    if scale:
        amount = number_words(f"{whole}.{fraction}" if fraction else whole, ctx)
        return f"{sign}{amount} {scale} {currency.plural}"
    if currency.minor_singular is None or currency.minor_plural is None or len(fraction) > 2:
        amount = number_words(f"{whole}.{fraction}" if fraction else whole, ctx)
        return f"{sign}{amount} {currency.singular if whole == '1' and not fraction else currency.plural}"
    minor = int(fraction.ljust(2, "0")) if fraction else 0
    parts = [_count(int(whole), currency.singular, currency.plural, ctx)] if int(whole) or not minor else []
    parts += [_count(minor, currency.minor_singular, currency.minor_plural, ctx)] if minor else []
    return sign + " and ".join(parts)


def _expand_number_signs(text: Tracked, ctx: Context) -> Tracked:
    """'#1' -> 'number 1', '~5' -> 'about 5', '+5' -> 'plus 5', '±2' -> 'plus or minus 2'."""
    return text.sub(_NUMBER_SIGN, lambda m: _NUMBER_SIGN_WORDS[m["sign"]] + " ")


def _expand_currency_codes(text: Tracked, ctx: Context) -> Tracked:
    """'USD 5' -> 'five US dollars', '5 GBP' -> 'five British pounds', 'C$10' -> 'ten Canadian dollars'."""
    text = text.sub(_CODE_MONEY_BEFORE, lambda m: _say_money(m, ctx))
    return text.sub(_CODE_MONEY_AFTER, lambda m: _say_money(m, ctx))


def _expand_money(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_MONEY_BEFORE, lambda m: _say_money(m, ctx))
    text = text.sub(_MONEY_AFTER, lambda m: _say_money(m, ctx))
    return text.sub(_CENTS, lambda m: _count(int(m["amount"].replace(",", "")), "cent", "cents", ctx))


def _expand_scaled_numbers(text: Tracked, ctx: Context) -> Tracked:
    """'10M' -> '10 million', '2.5bn' -> '2.5 billion'. A bare 'K' stays a letter: "a 5K run"."""
    return text.sub(_SCALED_NUMBER, lambda m: f"{m['num']} {_SCALES[m['abbr'].lower()]}")


def _expand_percentages(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_PERCENT, lambda m: f"{number_words(m['num'], ctx)} {_PERCENT_WORDS[m['sign']]}")


def _say_degrees(match: re.Match[str], ctx: Context) -> str:
    unit = "degree" if is_one(match["num"]) else "degrees"
    scale = _SCALE_NAMES.get(match["scale"] or match["symbol"] or "") or _COMPASS.get(match["compass"] or "")
    return f"{number_words(match['num'], ctx)} {unit}" + (f" {scale}" if scale else "")


def _expand_temperatures(text: Tracked, ctx: Context) -> Tracked:
    """'25°C' -> 'twenty-five degrees Celsius', '90°' -> 'ninety degrees', '40.7°N' -> '... degrees north',
    '10 degrees F' -> '... degrees Fahrenheit', 'in °C' -> 'in degrees Celsius'."""
    text = text.sub(_DEGREES, lambda m: _say_degrees(m, ctx))
    text = text.sub(_DEGREES_LETTER, lambda m: f"degrees {_SCALE_NAMES[m['scale']]}")
    return text.sub(_DEGREES_ALONE, lambda m: f"degrees {_SCALE_NAMES[m['scale']]}")


# --- decades, fractions, units, dimensions ----------------------------------------------------------------

_DECADE = re.compile(r"(?<![\w'’.,])(?P<num>1\d{2}0|20\d0)['’]?s\b")
_SHORT_DECADE = re.compile(
    r"(?:(?P<pre>\b(?i:the|mid|early|late|his|her|their|my|your|our)[\s-]+)|['’‘])(?P<num>[1-9]0)['’]?s\b"
)
_BARE_SHORT_DECADE = re.compile(r"(?<![\w.,])(?P<num>[1-9]0)['’]?s\b")
_FRACTION = re.compile(r"(?<![\w/.,])(?:(?P<whole>\d+)\s+)?(?P<num>\d{1,3})/(?P<den>\d{1,4})(?![\d/]|[.,]\d)")
_FRACTION_IDIOMS = {"24/7": "twenty-four seven", "9/11": "nine eleven", "50/50": "fifty-fifty"}
_FRACTION_NAMES = {2: ("half", "halves"), 4: ("quarter", "quarters")}
_UNITS: dict[str, tuple[str, str]] = {
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
_UNIT_ALTERNATION = "|".join(
    r"in(?=[ \t]*(?:$|\n|[.,;:!?)\]]))" if unit == "in" else re.escape(unit)
    for unit in sorted(_UNITS, key=len, reverse=True)
)
_FEET_AND_INCHES = re.compile(r"(?<![\w.])(?P<feet>\d+)['′’]\s?(?P<inches>\d{1,2})(?:\"|″|''|”)")
# After a count of feet, "in" is inches wherever it stands: '6 ft 2 in tall'.
_INCHES_AFTER_FEET = re.compile(
    rf"(?P<feet>(?<![\w.]){NUMBER}\s?(?:ft|feet|foot)\.?\s+)(?P<inches>{NUMBER})\s?in\b(?:\.(?=\s+[a-z]))?(?!['’]\w)"
)
_UNIT = re.compile(rf"(?P<num>{SIGNED})\s?(?P<unit>{_UNIT_ALTERNATION})(?![\w/²³])")
_UNIT_RANGE = re.compile(
    rf"(?P<left>(?<![\w.]){NUMBER}\s?(?:{_UNIT_ALTERNATION}))\s*[-–—]\s*(?={NUMBER}\s?(?:{_UNIT_ALTERNATION})(?![\w/]))"
)
_FRACTION_UNIT = re.compile(rf"{_FRACTION.pattern}\s?(?P<unit>{_UNIT_ALTERNATION})(?![\w/²³])")
_DIMENSIONS = re.compile(rf"(?<![\w.])(?P<a>{NUMBER})\s?(?P<x>[x×])\s?(?P<b>{NUMBER})(?!\w|\.\d)")
_MULTIPLIER = re.compile(rf"(?<![\w.])(?P<num>{NUMBER})[x×](?!\w)")


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT = "[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+"
_FOLLOWING_UNIT = rf"(?:\s?(?P<unit>{_UNIT_ALTERNATION})(?![\w/²³]))?"
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
    return f"{said} {british_spelling(_UNITS[unit][1], ctx)}"


def _say_power(match: re.Match[str], ctx: Context) -> str:
    base = match["b"] or match["sb"]
    base_words = number_words(base, ctx) if base.isdigit() else base
    return f"{base_words} {_exponent(match['e'] or match['sup'], ctx, powers=True)}"


def _expand_scientific_notation(text: Tracked, ctx: Context) -> Tracked:
    """'6.02e23', '3 x 10^8 m/s', '1.5×10⁻³'; powers '10^6' -> 'ten to the sixth', '5²' -> 'five squared'."""
    text = text.sub(_E_NOTATION, lambda m: _say_scientific(m, ctx))
    text = text.sub(_TIMES_TEN, lambda m: _say_scientific(m, ctx))
    return text.sub(_POWER, lambda m: _say_power(m, ctx))


def _say_decade(match: re.Match[str], ctx: Context, say: Callable[[int, Context], str]) -> str:
    prefix = match.groupdict().get("pre") or ""
    return prefix + plural_of_number_words(say(int(match["num"]), ctx))


def _expand_decades(text: Tracked, ctx: Context) -> Tracked:
    """'1990s' -> 'nineteen nineties', "the '80s" / 'the 80s' -> 'the eighties'."""
    text = text.sub(_DECADE, lambda m: _say_decade(m, ctx, year_words))
    return text.sub(_SHORT_DECADE, lambda m: _say_decade(m, ctx, cardinal))


def _expand_bare_decades(text: Tracked, ctx: Context) -> Tracked:
    """A '90s' that no unit rule read as seconds is a decade."""
    return text.sub(_BARE_SHORT_DECADE, lambda m: _say_decade(m, ctx, cardinal))


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


def _say_fraction(match: re.Match[str], ctx: Context) -> str:
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


def _expand_fractions(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_FRACTION, lambda m: _say_fraction(m, ctx))


def _say_unit(match: re.Match[str], ctx: Context) -> str:
    singular, plural = _UNITS[match["unit"]]
    unit = british_spelling(singular if is_one(match["num"]) else plural, ctx)
    return f"{number_words(match['num'], ctx)} {unit}"


def _say_fraction_unit(match: re.Match[str], ctx: Context) -> str:
    """'2 1/2 kg' -> 'two and a half kilograms', '3/4 mi' -> 'three quarters of a mile'."""
    singular, plural = _UNITS[match["unit"]]
    if match["whole"]:
        return f"{_say_fraction(match, ctx)} {british_spelling(plural, ctx)}"
    article = "an" if singular.startswith(("a", "e", "i", "o", "u", "hour")) else "a"
    return f"{_say_fraction(match, ctx)} of {article} {british_spelling(singular, ctx)}"


def _expand_fraction_units(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_FRACTION_UNIT, lambda m: _say_fraction_unit(m, ctx))


def _expand_units(text: Tracked, ctx: Context) -> Tracked:
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


def _expand_dimensions(text: Tracked, ctx: Context) -> Tracked:
    """'1920x1080' -> '... by ...', '3 × 4' -> '... times ...', '10x faster' -> 'ten times faster'."""
    text = text.sub(
        _DIMENSIONS,
        lambda m: f"{_dimension(m['a'], ctx)} {'by' if m['x'] == 'x' else 'times'} {_dimension(m['b'], ctx)}",
    )
    return text.sub(_MULTIPLIER, lambda m: f"{number_words(m['num'], ctx)} times")


# --- ordinals, versions, years, plain numbers -------------------------------------------------------------

_ORDINAL = re.compile(r"(?<![\w.,])(?P<num>\d{1,3}(?:,\d{3})+|\d+)(?:st|nd|rd|th)\b", re.IGNORECASE)
_VERSION = re.compile(r"(?<![\w.])(?:(?P<v>v)|(?P<word>[Vv]ersion\s+))(?P<num>\d+(?:\.\d+)*)(?!\w|\.\d)")
_DOTTED = re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}(?!\w|\.\d)")
_LETTER_DIGIT = re.compile(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
_YEAR_CANDIDATE = re.compile(r"(?<![\w.,$£€¥-])(?P<num>1\d{3}|20\d{2})(?![\w%]|[.,:]\d)")
_PREVIOUS_WORD = re.compile(r"([A-Za-z]+)[\s(\"'“]*$")
_NEXT_WORD = re.compile(r"\s*([A-Za-z]+)")
_NUMBER_TOKEN = re.compile(SIGNED)
_LEADING_DECIMAL = re.compile(r"(?<![\w.])\.(?P<digits>\d+)(?!\w)")
_ANY_DIGITS = re.compile(r"\d+")

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


def _expand_ordinals(text: Tracked, ctx: Context) -> Tracked:
    """'1st' -> 'first', '23rd' -> 'twenty-third', '101st' -> 'one hundred first' (British: 'and first')."""
    return text.sub(_ORDINAL, lambda m: ordinal(int(m["num"].replace(",", "")), ctx))


def _say_version(match: re.Match[str], ctx: Context) -> str:
    parts = " point ".join(whole_number(part, ctx) for part in match["num"].split("."))
    return ("version " if match["v"] else match["word"]) + parts


def _say_dotted(match: re.Match[str], ctx: Context) -> str:
    """An IPv4 address '192.168.0.1' -> '... dot ...'; a version '1.2.3' -> 'one point two point three'."""
    parts = match.group().split(".")
    is_ip = len(parts) == 4 and all(int(part) <= 255 for part in parts)
    if is_ip:
        return " dot ".join(paired(part, ctx) for part in parts)
    return " point ".join(whole_number(part, ctx) for part in parts)


def _expand_versions(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_VERSION, lambda m: _say_version(m, ctx))
    return text.sub(_DOTTED, lambda m: _say_dotted(m, ctx))


def _separate_letters_from_digits(text: Tracked, ctx: Context) -> Tracked:
    """'5G' -> '5 G', 'mp3' -> 'mp 3', 'H2O' -> 'H 2 O': misaki reads the pieces apart."""
    return text.sub(_LETTER_DIGIT, " ")


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


def _expand_years(text: Tracked, ctx: Context) -> Tracked:
    """'in 1999' -> 'in nineteen ninety-nine', '2005' -> 'two thousand five'; see `_is_year`."""
    return text.sub(_YEAR_CANDIDATE, lambda m: year_words(int(m["num"]), ctx) if _is_year(m) else m.group())


def _expand_numbers(text: Tracked, ctx: Context) -> Tracked:
    """Every number still written in digits: signed, decimal, with separators; then any digit left."""
    text = text.sub(_NUMBER_TOKEN, lambda m: number_words(m.group(), ctx))
    text = text.sub(_LEADING_DECIMAL, lambda m: f"point {digits_of(m['digits'])}")
    return text.sub(_ANY_DIGITS, lambda m: whole_number(m.group(), ctx))


# --- hashtags and remaining symbols -----------------------------------------------------------------------

_HASHTAG = re.compile(r"(?<![\w&#])#(?P<tag>[A-Za-z]\w*)")
_MUSICAL_SHARP = re.compile(r"\b(?P<note>[A-G])#(?!\w)")
_PER = re.compile(r"(?<=\w)/(?=(?:month|year|day|week|hour|night|person|mo|yr|wk|hr)\b)")
_ARROW = re.compile(r"\s*(?:->|=>|→)\s*")
_SYMBOL_WORDS = {
    "&": "and", "@": "at", "+": "plus", "=": "equals", "%": "percent", "°": "degrees", "#": "number",
    "×": "times", "÷": "divided by", "<": "less than", ">": "greater than", "≤": "less than or equal to",
    "≥": "greater than or equal to", "≈": "approximately", "±": "plus or minus", "/": "slash",
}  # fmt: skip
_SYMBOL = re.compile("|".join(re.escape(symbol) for symbol in _SYMBOL_WORDS))
_DECORATION = re.compile(r"[~^*|\\_{}]")
_EMOJI_JOINERS = frozenset("\u200d\ufe0e\ufe0f\u20e3")


def _expand_hashtags(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_HASHTAG, lambda m: f"hashtag {m['tag']}")


def _is_emoji(char: str) -> bool:
    return unicodedata.category(char) == "So" or char in _EMOJI_JOINERS or 0x1F3FB <= ord(char) <= 0x1F3FF


def _replace_symbols(text: Tracked, ctx: Context) -> Tracked:
    """Leftover symbols become words ('R&D' -> 'R and D'), decorations go, emoji are removed."""
    text = text.sub(_MUSICAL_SHARP, r"\g<note> sharp")
    text = text.sub(_PER, " per ").sub(_ARROW, " to ")
    text = text.sub(_SYMBOL, lambda m: f" {_SYMBOL_WORDS[m.group()]} ")
    text = text.sub(_DECORATION, " ")
    return text.keep(lambda char: not _is_emoji(char))


def _tidy_punctuation(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_INLINE_SPACE, " ").sub(_SPACE_BEFORE_PUNCTUATION, r"\1")


# The English rules in order, each with the option that switches it off (None: always on).
_RULES: tuple[tuple[_Rule, str | None], ...] = (
    (_expand_optional_plurals, "optional_pluralization_normalization"),
    (_expand_unicode_numbers, None),
    (_expand_scientific_notation, "scientific_notation_normalization"),
    (_expand_roman_numerals, "roman_numeral_normalization"),
    (abbreviations.expand_calendar, "abbreviation_normalization"),
    (codes.expand_short_years, None),
    (_expand_dates, None),
    (codes.expand_durations, "duration_normalization"),
    (codes.expand_scores, "score_normalization"),
    (codes.expand_clause_letters, "identifier_normalization"),
    (_expand_ranges, None),
    (_expand_times, None),
    (codes.expand_house_numbers, "address_normalization"),
    (abbreviations.expand_titles, "abbreviation_normalization"),
    (_expand_abbreviations, "abbreviation_normalization"),
    (abbreviations.expand_abbreviations, "abbreviation_normalization"),
    (abbreviations.expand_states, "abbreviation_normalization"),
    (codes.expand_street_directions, "address_normalization"),
    (_expand_number_signs, None),
    (_expand_currency_codes, "currency_code_normalization"),
    (_expand_money, None),
    (codes.expand_codes, "identifier_normalization"),
    (_expand_scaled_numbers, None),
    (_expand_percentages, None),
    (_expand_temperatures, None),
    (_expand_decades, None),
    (_expand_fraction_units, "unit_normalization"),
    (_expand_fractions, None),
    (_expand_units, "unit_normalization"),
    (_expand_bare_decades, None),
    (_expand_dimensions, None),
    (_expand_ordinals, None),
    (_expand_versions, None),
    (_separate_letters_from_digits, None),
    (_expand_years, None),
    (_expand_numbers, None),
    (_expand_hashtags, None),
    (_replace_symbols, "replace_remaining_symbols"),
    (_tidy_punctuation, None),
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
    number, hashtags, remaining symbols (see `_RULES`).

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
    tracked = tracked.sub(_CRLF, "\n").sub(_PLACEHOLDER, "")
    tracked = _shield(_shield(tracked, MISAKI_LINK, spans), PAUSE_TAG, spans)
    if lexicon is not None and english:
        tracked = lexicon.apply(tracked, lambda match: _shield_one(match, spans))
    tracked = _shield_spans(_strip_markdown_links(tracked), options, english, spans)
    tracked = _tidy_whitespace(_strip_markdown(tracked))
    if english:
        context = Context(british=lang_code == "b", date_order=date_order, units=options.unit_normalization)
        for rule, option in _RULES:
            if option is None or getattr(options, option):
                tracked = rule(tracked, context)
    return _restore(_tidy_whitespace(tracked), spans)
