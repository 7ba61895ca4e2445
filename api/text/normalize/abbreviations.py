"""Abbreviations that end with a period, read as the words they stand for (the English normalizer's
`abbreviation_normalization` family): titles before a name, weekdays and months, Latin and business
abbreviations, parts of documents and legal references, street types and state names.

Each abbreviation is read only where its context says which word it is: a title before a capitalized
name ('Gen. Patton', but 'Gen Z' stays), a weekday with its period or beside a date or another weekday
('Sat. 10 a.m.', 'Mon–Fri', but 'Sat on the mat' stays), a document part before a number ('Sec. 5',
'p. 12'), a state after a city and a comma ('Austin, TX 78701'). Sources: the US GPO Style Manual
(2008), chapter 9 (abbreviations), and the Chicago Manual of Style's numbers chapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from api.text.normalize.numbers import Context, digits_of, period_if_sentence_end
from api.text.tracked import Tracked

# --- titles before a name ---------------------------------------------------------------------------------

_NAME_TITLES = {
    "Rev": "Reverend", "Hon": "Honorable", "Sen": "Senator", "Rep": "Representative", "Gov": "Governor",
    "Pres": "President", "Gen": "General", "Col": "Colonel", "Lt": "Lieutenant", "Capt": "Captain",
    "Sgt": "Sergeant", "Cpl": "Corporal", "Maj": "Major", "Adm": "Admiral", "Cmdr": "Commander",
    "Fr": "Father", "Insp": "Inspector", "Det": "Detective", "Supt": "Superintendent", "Msgr": "Monsignor",
    "Pvt": "Private", "Amb": "Ambassador", "Mme": "Madame", "Mlle": "Mademoiselle", "Atty": "Attorney",
    "Asst": "Assistant", "Assoc": "Associate", "Ens": "Ensign", "Mx": "Mix", "Drs": "Doctors",
    "Profs": "Professors", "Sts": "Saints", "Ft": "Fort", "Pt": "Point", "Esq": "Esquire",
}  # fmt: skip
# A title with its period, before a capitalized name, another title or 'of' ('Supt. of Schools Reyes');
# after 'the' a title stands alone too ('The Col. led the parade').
_NAME_TITLE = re.compile(
    rf"\b(?P<abbr>{'|'.join(_NAME_TITLES)})\.(?=\s+(?:[A-Z]|of\s)|,|$)"
    rf"|(?<=\b[Tt]he )(?P<alone>{'|'.join(_NAME_TITLES)})\."
)
# 'Sr.' is Senior after a name ('John Smith Sr.') and Sister before one ('Sr. Mary Joseph').
_SISTER = re.compile(r"(?<![A-Za-z] )\bSr\.(?=\s+[A-Z][a-z])")
_DOCTOR_OR_DRIVE = re.compile(r"(?P<prev>\b[A-Z][a-z]+\.?[ \t]+)Dr\b\.?")
# The shared vocabulary of 'Dr.' here and 'St.' in normalize.py (Doctor or Drive, Saint or Street): a
# capitalized word after which 'Dr.'/'St.' is not a street's ("The St. Louis team", "Dear Dr. Smith"), and
# the name that follows a title.
NAME_NEXT = re.compile(r"\s+[A-Z][a-z]")
NOT_STREET_NAMES = frozenset({
    "The", "A", "An", "In", "At", "To", "From", "On", "Of", "And", "Visit", "Near", "Take", "Ask", "Call",
    "See", "Dear", "Rev.", "Prof.", "Professor", "Reverend", "Mr.", "Mrs.", "Ms.", "Hi", "Hello",
})  # fmt: skip


def _say_name_title(match: re.Match[str]) -> str:
    return _NAME_TITLES[match["abbr"] or match["alone"]]


def _say_doctor_or_drive(match: re.Match[str]) -> str:
    """'Mulholland Dr.' -> 'Mulholland Drive'; a 'Dr.' before a name is left to the title rule."""
    prev = match["prev"]
    if prev.strip() in NOT_STREET_NAMES or NAME_NEXT.match(match.string, match.end()):
        return match.group()
    ends = match.group().endswith(".")
    return prev + "Drive" + (period_if_sentence_end(match) if ends else "")


def expand_titles(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_DOCTOR_OR_DRIVE, _say_doctor_or_drive)
    text = text.sub(_SISTER, "Sister")
    return text.sub(_NAME_TITLE, _say_name_title)


# --- weekdays and months ----------------------------------------------------------------------------------

_WEEKDAYS = {
    "mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
    "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday",
}  # fmt: skip
_MONTHS = {
    "jan": "January", "feb": "February", "mar": "March", "apr": "April", "jun": "June", "jul": "July",
    "aug": "August", "sep": "September", "sept": "September", "oct": "October", "nov": "November",
    "dec": "December",
}  # fmt: skip
_DAY_ABBR = r"(?:Mon|Tues?|Wed|Thu(?:rs?)?|Fri|Sat|Sun|MON|TUES?|WED|THU(?:RS?)?|FRI|SAT|SUN)"
_MONTH_WORD = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_FULL_DAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
# Two weekdays joined ('Mon–Fri', 'Sat & Sun', 'Tues. and Thurs.'); one with its period; one before a date.
_WEEKDAY_PAIR = re.compile(
    rf"\b(?P<a>{_DAY_ABBR})\.?\s*(?P<sep>[-–—/&]|\band\b|\bor\b)\s*(?P<b>{_DAY_ABBR})\b(?P<dot>\.)?"
)
_WEEKDAY = re.compile(rf"\b(?P<day>{_DAY_ABBR})(?:(?P<dot>\.)|\b(?=,?\s+(?:{_MONTH_WORD}\b|\d)))")
_PAIR_JOINS = {"-": "to", "–": "to", "—": "to", "/": "and", "&": "and", "and": "and", "or": "or"}
# 'the Sun.' at the end of a sentence is the star.
_THE_SUN = re.compile(r"[Tt]he\s+$")
_DAY_RANGE = re.compile(rf"(?P<left>\b{_FULL_DAY})\s*[-–—]\s*(?={_FULL_DAY}\b)")
_MONTH_ABBR_BEFORE_YEAR = re.compile(
    r"\b(?P<month>Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec|JAN|FEB|MAR|APR|JUN|JUL|AUG|SEPT?|OCT|NOV|DEC)"
    r"(?:\b(?!\.)|\.)(?=\s+(?:\d{4}\b|['’]\d\d\b))"
)
_MONTH_RANGE = re.compile(
    rf"\b(?P<left>{_MONTH_WORD})\.?(?P<year>\s+\d{{4}})?\s*[-–—]\s*(?P<right>{_MONTH_WORD})\b\.?"
)
_EXPIRY = re.compile(r"(?<![\d/.-])(?P<month>0?[1-9]|1[0-2])/(?P<year>(?:19|20)\d\d)(?![\d/])")
MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def _say_weekday_pair(match: re.Match[str]) -> str:
    first, second = _WEEKDAYS[match["a"].lower()], _WEEKDAYS[match["b"].lower()]
    return f"{first} {_PAIR_JOINS[match['sep']]} {second}" + (
        period_if_sentence_end(match) if match["dot"] else ""
    )


def _say_weekday(match: re.Match[str]) -> str:
    if match["dot"] and _THE_SUN.search(match.string, 0, match.start()) and period_if_sentence_end(match):
        return match.group()
    return _WEEKDAYS[match["day"].lower()]


def _month_name(written: str) -> str:
    return next(name for name in MONTH_NAMES if name.lower().startswith(written.lower()[:3]))


def _say_month_range(match: re.Match[str]) -> str:
    """'Jan.–Mar.' -> 'January to March', 'Nov 2025–Feb' -> 'November 2025 to February'."""
    left = _month_name(match["left"]) + (match["year"] or "")
    right = _month_name(match["right"])
    return f"{left} to {right}" + (period_if_sentence_end(match) if match.group().endswith(".") else "")


def expand_calendar(text: Tracked, ctx: Context) -> Tracked:
    """'Mon.–Fri.' -> 'Monday to Friday', 'Jan–Mar' -> 'January to March', 'Nov 2025' -> 'November 2025',
    a card's expiry '12/2027' -> 'December 2027'."""
    text = text.sub(_WEEKDAY_PAIR, _say_weekday_pair)
    text = text.sub(_WEEKDAY, _say_weekday)
    text = text.sub(_DAY_RANGE, r"\g<left> to ")
    text = text.sub(_MONTH_ABBR_BEFORE_YEAR, lambda m: _MONTHS[m["month"].lower()])
    text = text.sub(_MONTH_RANGE, _say_month_range)
    return text.sub(_EXPIRY, lambda m: f"{MONTH_NAMES[int(m['month']) - 1]} {m['year']}")


# --- Latin, business and document abbreviations ------------------------------------------------------------

# abbreviation (as written, less its period) -> words. Matched case-sensitively; the capitalized form of
# a lower-case entry is found too and read capitalized ('Sec.' -> 'Section').
_WORDS = {
    "p.a": "per annum", "incl": "including", "excl": "excluding", "a.k.a": "also known as",
    "cf": "compare", "viz": "namely", "N.B": "Nota bene", "max": "maximum", "avg": "average",
    "tel": "telephone", "Tel": "Telephone", "ext": "extension", "attn": "attention", "Attn": "Attention",
    "qty": "quantity", "Qty": "Quantity", "ea": "each", "misc": "miscellaneous", "esp": "especially",
    "resp": "respectively", "appt": "appointment", "mgr": "manager", "asst": "assistant", "doz": "dozen",
    "govt": "government", "Govt": "Government", "Co": "Company", "Cos": "Companies", "Bros": "Brothers",
    "Intl": "International", "Natl": "National", "Univ": "University", "Assn": "Association",
    "Amer": "American", "Mfg": "Manufacturing", "Ln": "Lane", "Ct": "Court", "Pl": "Place",
    "Pkwy": "Parkway", "Sq": "Square", "Cir": "Circle", "Ter": "Terrace", "Hwy": "Highway",
    "Rte": "Route", "Ste": "Suite", "Apt": "Apartment", "Bldg": "Building", "Fl": "Floor", "Rm": "Room",
    "Const": "Constitution", "pcs": "pieces", "pts": "points", "ref": "reference", "dept": "department",
}  # fmt: skip
# Before a number (or a roman numeral or a clause letter): parts of documents and legal references.
_BEFORE_NUMBER = {
    "sec": "section", "secs": "sections", "art": "article", "para": "paragraph", "paras": "paragraphs",
    "cl": "clause", "subsec": "subsection", "subpara": "subparagraph", "ch": "chapter", "vol": "volume",
    "p": "page", "pp": "pages", "figs": "figures", "eq": "equation", "eqs": "equations", "tab": "table",
    "app": "appendix", "sch": "schedule", "reg": "regulation", "refs": "references", "ref": "reference",
    "n": "note", "fn": "footnote", "ll": "lines", "col": "column", "cols": "columns", "pt": "part",
    "bk": "book", "min": "minimum", "max": "maximum", "rev": "revision", "c": "circa", "ca": "circa",
}  # fmt: skip
# After a number: counted words.
_AFTER_NUMBER = {
    "yr": ("year", "years"), "yrs": ("years", "years"), "mo": ("month", "months"),
    "mos": ("months", "months"), "wk": ("week", "weeks"), "wks": ("weeks", "weeks"),
    "pcs": ("pieces", "pieces"), "pts": ("points", "points"),
}  # fmt: skip


def _alternation(words: Iterable[str], capitalize: bool) -> str:
    forms = set(words)
    if capitalize:
        forms |= {word[0].upper() + word[1:] for word in words}
    return "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))


_WORD_ABBREVIATION = re.compile(rf"(?<![\w.])(?P<abbr>{_alternation(_WORDS, False)})(?:\.|(?<=Attn)(?=:))")
_NUMBERED = re.compile(
    rf"(?<![\w.])(?P<abbr>{_alternation(_BEFORE_NUMBER, True)})\."
    r"(?:\s?(?=[(]?\d|[IVXLivxl]+\b|\([a-z]\))|\s(?=[A-Z]\b))"
)
_COUNTED = re.compile(rf"(?<=\d )(?P<abbr>{_alternation(_AFTER_NUMBER, False)})\.")
_SECTION_SIGN = re.compile(r"(?P<signs>§§?|¶¶?)\s?(?=\d|[IVXL]+\b)")
_ESTABLISHED = re.compile(r"\b(?P<e>[Ee])st\.\s+(?=(?P<year>1\d{3}|20\d\d)\b(?!,\d))?")
_VERSUS = re.compile(r"\b(?P<a>[A-Z][a-z]+) v\. (?=[A-Z])")
_MINIMUM = re.compile(r"(?<!\d )(?<![\w.])(?P<m>[Mm])in\.(?=\s+[a-z])")
_WITH = re.compile(r"(?<![\w/])w/(?P<o>o)?(?=\s)")


def _say_word(match: re.Match[str]) -> str:
    ends = match.group().endswith(".")
    return _WORDS[match["abbr"]] + (period_if_sentence_end(match) if ends else "")


def _say_numbered(match: re.Match[str]) -> str:
    abbr = match["abbr"]
    words = _BEFORE_NUMBER[abbr.lower()]
    return (words[0].upper() + words[1:] if abbr[0].isupper() else words) + " "


def _say_counted(match: re.Match[str]) -> str:
    singular, plural = _AFTER_NUMBER[match["abbr"]]
    one = match.string[max(0, match.start() - 3) : match.start()].strip().split(" ")[-1] == "1"
    return (singular if one else plural) + period_if_sentence_end(match)


def _say_section_sign(match: re.Match[str]) -> str:
    plural = len(match["signs"]) == 2
    word = "section" if match["signs"][0] == "§" else "paragraph"
    return f"{word}{'s' if plural else ''} "


def expand_abbreviations(text: Tracked, ctx: Context) -> Tracked:
    """'e.g.'-like Latin and business abbreviations, 'Sec. 5' -> 'Section 5', '§§ 5-7' -> 'sections
    5-7', 'Est. 1892' -> 'Established 1892' (before a year; 'estimated' otherwise), 'Roe v. Wade' ->
    'Roe versus Wade', 'w/o' -> 'without'."""
    text = text.sub(_SECTION_SIGN, _say_section_sign)
    text = text.sub(_NUMBERED, _say_numbered)
    text = text.sub(_COUNTED, _say_counted)
    text = text.sub(
        _ESTABLISHED,
        lambda m: ("E" if m["e"] == "E" else "e") + ("stablished " if m["year"] else "stimated "),
    )
    text = text.sub(_VERSUS, r"\g<a> versus ").sub(_WITH, lambda m: "without" if m["o"] else "with")
    text = text.sub(_MINIMUM, lambda m: "minimum" if m["m"] == "m" else "Minimum")
    return text.sub(_WORD_ABBREVIATION, _say_word)


# --- states -----------------------------------------------------------------------------------------------

_STATES = {
    "AL": "Alabama", "AK": "Alaska", "AZ": "Arizona", "AR": "Arkansas", "CA": "California",
    "CO": "Colorado", "CT": "Connecticut", "DE": "Delaware", "FL": "Florida", "GA": "Georgia",
    "HI": "Hawaii", "ID": "Idaho", "IL": "Illinois", "IN": "Indiana", "IA": "Iowa", "KS": "Kansas",
    "KY": "Kentucky", "LA": "Louisiana", "ME": "Maine", "MD": "Maryland", "MA": "Massachusetts",
    "MI": "Michigan", "MN": "Minnesota", "MS": "Mississippi", "MO": "Missouri", "MT": "Montana",
    "NE": "Nebraska", "NV": "Nevada", "NH": "New Hampshire", "NJ": "New Jersey", "NM": "New Mexico",
    "NY": "New York", "NC": "North Carolina", "ND": "North Dakota", "OH": "Ohio", "OK": "Oklahoma",
    "OR": "Oregon", "PA": "Pennsylvania", "RI": "Rhode Island", "SC": "South Carolina",
    "SD": "South Dakota", "TN": "Tennessee", "TX": "Texas", "UT": "Utah", "VT": "Vermont",
    "VA": "Virginia", "WA": "Washington", "WV": "West Virginia", "WI": "Wisconsin", "WY": "Wyoming",
    "DC": "DC",
}  # fmt: skip
# GPO 9.12's traditional abbreviations, after a city and a comma ('Pasadena, Calif.').
_TRADITIONAL_STATES = {
    "Ala": "Alabama", "Ariz": "Arizona", "Ark": "Arkansas", "Calif": "California", "Colo": "Colorado",
    "Conn": "Connecticut", "Del": "Delaware", "Fla": "Florida", "Ga": "Georgia", "Ill": "Illinois",
    "Ind": "Indiana", "Kans": "Kansas", "Ky": "Kentucky", "La": "Louisiana", "Md": "Maryland",
    "Mass": "Massachusetts", "Mich": "Michigan", "Minn": "Minnesota", "Miss": "Mississippi",
    "Mo": "Missouri", "Mont": "Montana", "Nebr": "Nebraska", "Nev": "Nevada", "Okla": "Oklahoma",
    "Oreg": "Oregon", "Pa": "Pennsylvania", "Tenn": "Tennessee", "Tex": "Texas", "Vt": "Vermont",
    "Va": "Virginia", "Wash": "Washington", "Wis": "Wisconsin", "Wyo": "Wyoming",
}  # fmt: skip
_STATE_AND_ZIP = re.compile(
    rf"(?<=[a-z], )(?P<state>{'|'.join(_STATES)})(?:\s+(?P<zip>\d{{5}})(?:-(?P<plus4>\d{{4}}))?)?\b(?![\w-])"
)
_TRADITIONAL_STATE = re.compile(rf"(?<=[a-z], )(?P<state>{'|'.join(_TRADITIONAL_STATES)})\.")


def _say_state(match: re.Match[str]) -> str:
    if not match["zip"] and match["state"] in ("IN", "OR", "ME", "OK", "HI"):
        return match.group()
    words = _STATES[match["state"]]
    if match["zip"]:
        words += " " + digits_of(match["zip"], "oh")
    if match["plus4"]:
        words += ", " + digits_of(match["plus4"], "oh")
    return words


def expand_states(text: Tracked, ctx: Context) -> Tracked:
    """'Austin, TX 78701' -> 'Austin, Texas seven eight seven oh one', 'Tampa, Fla.' -> 'Tampa, Florida'."""
    text = text.sub(_STATE_AND_ZIP, _say_state)
    return text.sub(
        _TRADITIONAL_STATE,
        lambda m: _TRADITIONAL_STATES[m["state"]] + period_if_sentence_end(m),
    )


# --- words read together with the next one -----------------------------------------------------------------

# Written with their period (or without, for the titles), these are read from the word after them ('Dr.
# Smith', 'Sec. 5', 'Nov. 22', 'e.g. this'); text that arrives in pieces is never cut after one
# (api/text/live_split.py). Lower case: compare a word's lower-case form.
READ_WITH_NEXT = frozenset(
    word.lower()
    for word in (
        *_NAME_TITLES, *_BEFORE_NUMBER, *_WEEKDAYS, *_MONTHS,
        "Dr", "Mr", "Mrs", "Ms", "Prof", "Mt", "St", "Sr", "No", "Nos", "e.g", "i.e", "vs", "v", "cf",
        "approx", "Fig", "Est", "a.k.a", "viz",
    )
)  # fmt: skip
