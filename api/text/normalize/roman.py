"""Roman numerals where the context says they are numbers: 'Chapter IV', 'Henry VIII', 'XX century'."""

from __future__ import annotations

import re

from api.text.normalize.numbers import Context, cardinal, ordinal
from api.text.tracked import Tracked

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


def expand_roman_numerals(text: Tracked, ctx: Context) -> Tracked:
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
