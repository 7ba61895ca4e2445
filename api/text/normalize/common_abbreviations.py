"""Everyday abbreviations: 'Dr.', 'Mr.', 'St.' (Saint or Street), 'No. 5', 'etc.', 'e.g.', 'vs.', months."""

from __future__ import annotations

import re

import api.text.normalize.abbreviations as abbreviations
from api.text.normalize.numbers import Context, period_if_sentence_end
from api.text.tracked import Tracked

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


def expand_abbreviations(text: Tracked, ctx: Context) -> Tracked:
    """Titles (Dr., Mr., Mrs., Ms.), St., etc., e.g., i.e., vs., approx., 'No. 5', month abbreviations."""
    text = text.sub(_TITLE, _say_title)
    text = text.sub(_SAINT_OR_STREET, _say_saint_or_street)
    text = text.sub(
        _NUMBER_ABBREVIATION, lambda m: "numbers " if m.group().lower().startswith("nos") else "number "
    )
    text = text.sub(_NUMBER_BEFORE_CODE, r"\g<cue>number ")
    return text.sub(_ABBREVIATION, _say_abbreviation)
