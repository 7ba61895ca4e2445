"""Numbers that are not quantities, read the way people read them: identifiers and codes ('UA123' -> 'UA
one twenty-three', 'F-150' -> 'F-one fifty'), house numbers ('221B Baker Street' -> 'two twenty-one B
Baker Street'), clause letters ('5(b)' -> '5 B'), durations ('2:03:45' after 'in' -> 'two hours, three
minutes and forty-five seconds', '2h 30m'), scores with a zero ('1-0' -> 'one to nothing') and
apostrophe years ("'05" -> 'oh five'). Sproat and Jaitly's text-normalization classes call these
LETTERS, DIGIT, ADDRESS, TIME and DATE.
"""

from __future__ import annotations

import re

from api.text.normalize.numbers import Context, cardinal, digits_of, number_words, paired
from api.text.tracked import Tracked

# --- identifiers and codes --------------------------------------------------------------------------------

# All-capital words that a number may follow without being a code ('IN 2020', 'PAGE 5').
_CAPITAL_WORDS = frozenset({
    "A", "I", "AM", "AN", "AS", "AT", "BE", "BY", "DO", "GO", "HE", "IF", "IN", "IS", "IT", "ME", "MY", "NO",
    "OF", "OK", "ON", "OR", "SO", "TO", "UP", "US", "WE", "THE", "AND", "FOR", "ARE", "BUT", "NOT", "ALL",
    "CAN", "HAS", "WAS", "OUT", "NOW", "NEW", "TOP", "AGE", "PM", "PAGE", "ROOM", "YEAR", "OVER", "ONLY",
    "JUST", "WITH", "FROM", "INTO", "THAN", "PART", "STEP", "SIZE", "LOT", "VOL", "CH", "BC", "AD",
})  # fmt: skip
_CODE = re.compile(
    r"(?<![\w.'’/-])(?P<letters>[A-Z]{1,4})(?P<sep>-| )?(?P<num>\d{1,5})(?P<suffix>[A-Z]{1,2})?"
    r"(?![\w/]|[.,:]\d|-\w)"
)
_CODE_AFTER_DIGITS = re.compile(r"(?<=\d)(?P<letters>[A-Z]{1,4})(?P<num>\d{3,5})\b")
_ISBN = re.compile(r"\bISBN(?:-1[03])?:?\s+(?P<code>\d[\d-]{8,16}[\dX])(?![\w-])")
# Words after which a 3- or 4-digit number is a code or a section, read in pairs ('Room 101', 'Section
# 230', 'Boeing 747'), and 3-digit numbers after any other capitalized word ('Xbox 360').
_PAIRED_CUES = (
    r"(?i:flight|suite|room|box|gate|platform|highway|route|section|sections|rule|article|extension|bus"
    r"|channel|terminal|unit|apartment|seat)|Boeing|Airbus|Windows|Model|Office|Xbox"
)
_PAIRED_AFTER_CUE = re.compile(
    rf"\b(?P<cue>{_PAIRED_CUES})\s+(?P<num>\d{{1,4}})(?P<suffix>[A-Z])?(?![\w]|[.,:/]\d|\s?%)"
)
_THREE_DIGITS_AFTER_NAME = re.compile(
    r"(?<![.!?]\s)(?<!^)\b(?P<word>[A-Z][a-z]+) (?P<num>\d{3})(?!\w|[.,:/]\d|\s?%|\s+[a-z]{3,}s\b)"
)
_NOT_NAMES = frozenset({
    "The", "A", "An", "In", "On", "At", "About", "Only", "Over", "Under", "Some", "Total", "All", "Page",
    "Pages", "Chapter", "See", "By", "For", "From", "To", "Of", "With", "And", "Or", "Top", "Just", "Nearly",
    "Almost", "Around", "Exactly", "Approximately", "Since", "Until", "After", "Before", "Than", "Year",
    "Day", "Week", "Verse", "Psalm", "Line", "Lines", "Volume", "Issue", "Number", "Numbers",
})  # fmt: skip
_ERROR_CODE = re.compile(r"(?<![\w.])(?P<num>\d{3})(?=\s+error\b)")
# Emergency numbers are said digit by digit ('call 911' -> 'call nine one one'), where the words around
# them say a call is meant: after call/dial/phone/ring/text, or before call/operator/dispatcher/line.
_EMERGENCY = re.compile(
    r"(?:(?P<cue>\b(?i:call|calls|called|calling|dial|dials|dialed|dialled|dialing|dialling|phone|phoned|ring"
    r"|rang|text|texted)\s+)(?P<num>911|999|112|000)(?![\w]|[.,:/]\d))"
    r"|(?:(?<![\w.,$/-])(?P<alone>911|999|112)(?=\s+(?i:call|calls|caller|callers|operator|operators"
    r"|dispatcher|dispatchers|dispatch|line|center|centre|service|services)\b))"
)
_PART_NUMBER = re.compile(
    r"(?P<cue>\b(?i:part|model|serial|order)\s+number\s+)(?P<num>\d{3,5})(?:-(?P<suffix>[A-Z]{1,2}))?\b"
)


def _say_code(match: re.Match[str], ctx: Context) -> str:
    letters, sep = match["letters"], match["sep"] or ""
    if sep == " " and (len(letters) < 2 or letters in _CAPITAL_WORDS):
        return match.group()
    joiner = "-" if len(letters) == 1 and (sep == "-" or letters in "AI") else " "
    suffix = f" {match['suffix']}" if match["suffix"] else ""
    return f"{letters}{joiner}{paired(match['num'], ctx)}{suffix}"


def _say_paired_after_name(match: re.Match[str], ctx: Context) -> str:
    if match["word"] in _NOT_NAMES:
        return match.group()
    return f"{match['word']} {paired(match['num'], ctx)}"


def expand_codes(text: Tracked, ctx: Context) -> Tracked:
    """'BA 2490' -> 'BA twenty-four ninety', 'A320' -> 'A-three twenty', 'Boeing 747' -> 'Boeing seven
    forty-seven', 'ISBN 978-0-...' digit by digit, a '404 error' -> 'four oh four error', 'call 911' ->
    'call nine one one'."""
    text = text.sub(_EMERGENCY, lambda m: (m["cue"] or "") + digits_of(m["num"] or m["alone"], zero="zero"))
    text = text.sub(_ISBN, lambda m: "ISBN " + digits_of(m["code"].replace("-", "")).replace("X", " X"))
    text = text.sub(_CODE, lambda m: _say_code(m, ctx))
    text = text.sub(_CODE_AFTER_DIGITS, lambda m: f" {m['letters']} {paired(m['num'], ctx)}")
    text = text.sub(
        _PART_NUMBER, lambda m: m["cue"] + paired(m["num"], ctx) + (f" {m['suffix']}" if m["suffix"] else "")
    )
    text = text.sub(
        _PAIRED_AFTER_CUE,
        lambda m: f"{m['cue']} {paired(m['num'], ctx)}" + (f" {m['suffix']}" if m["suffix"] else ""),
    )
    text = text.sub(_THREE_DIGITS_AFTER_NAME, lambda m: _say_paired_after_name(m, ctx))
    return text.sub(_ERROR_CODE, lambda m: paired(m["num"], ctx))


# --- house numbers ----------------------------------------------------------------------------------------

_STREET_TYPES = (
    r"Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Drive|Dr|Lane|Ln|Court|Ct|Place|Pl|Terrace|Ter|Way|Loop"
    r"|Parkway|Pkwy|Square|Sq|Circle|Cir|Highway|Hwy|Plaza|Trail|Row|Broadway"
)
_DIRECTIONS = {
    "N": "North", "S": "South", "E": "East", "W": "West",
    "NE": "Northeast", "NW": "Northwest", "SE": "Southeast", "SW": "Southwest",
}  # fmt: skip
_HOUSE_NUMBER = re.compile(
    r"(?<![\w.,$£€¥#:/-])(?<![Nn]o\. )(?P<num>\d{1,5})(?P<suffix>[A-Z])?(?:\s+(?P<dir>[NSEW]|[NS][EW])\b\.?)?"
    rf"(?=(?:\s+(?:[A-Z][a-z]+\.?|\d+(?:st|nd|rd|th))){{0,3}}\s+(?:{_STREET_TYPES})\b)"
)
_AFTER_STREET_DIRECTION = re.compile(
    r"\b(?P<street>Street|Avenue|Road|Boulevard|Drive|Lane|Court|Place|Way|Parkway)\.?\s+(?P<dir>[NS][EW])\b"
)


def _say_house_number(match: re.Match[str], ctx: Context) -> str:
    words = paired(match["num"], ctx)
    if match["suffix"]:
        words += f" {match['suffix']}"
    if match["dir"]:
        words += f" {_DIRECTIONS[match['dir']]}"
    return words


def expand_house_numbers(text: Tracked, ctx: Context) -> Tracked:
    """'1600 Pennsylvania Ave.' -> 'sixteen hundred Pennsylvania Ave.', '221B Baker Street' -> 'two
    twenty-one B Baker Street', '123 N. Main St.' -> 'one twenty-three North Main St.'."""
    return text.sub(_HOUSE_NUMBER, lambda m: _say_house_number(m, ctx))


def expand_street_directions(text: Tracked, ctx: Context) -> Tracked:
    """'Avenue NW' -> 'Avenue Northwest' (after the street types are words)."""
    return text.sub(_AFTER_STREET_DIRECTION, lambda m: f"{m['street']} {_DIRECTIONS[m['dir']]}")


# --- clause letters ---------------------------------------------------------------------------------------

_CLAUSE_PARTS = re.compile(
    r"(?P<before>\d|\b(?:subsection|subparagraph|paragraph|clause|section) )"
    r"(?P<parts>(?:\((?:[a-z]|\d{1,2})\))+)(?![\w(])"
)
_CLAUSE_PART = re.compile(r"\(([a-z]|\d{1,2})\)")


def expand_clause_letters(text: Tracked, ctx: Context) -> Tracked:
    """'5(b)' -> '5 B', 'Rule 12(b)(6)' -> 'Rule 12 B 6', 'subsection (a)' -> 'subsection A'."""

    def say(match: re.Match[str]) -> str:
        parts = " ".join(part.upper() for part in _CLAUSE_PART.findall(match["parts"]))
        return f"{match['before'].rstrip()} {parts}"

    return text.sub(_CLAUSE_PARTS, say)


# --- durations --------------------------------------------------------------------------------------------

_CLOCK_WORDS = frozenset({"at", "by", "until", "till", "from", "since", "before", "after", "around", "to"})
_DURATION_CUES = frozenset({
    "in", "took", "takes", "lasted", "lasts", "runs", "ran", "runtime", "duration", "length", "clocked",
    "split", "record", "time", "elapsed",
})  # fmt: skip
# 'The record stands at 2:01:09': after these verbs 'at' gives a level, not a time of day.
_LEVEL_VERBS = frozenset({"stands", "stood", "standing", "sits", "sat", "remains", "remained"})
_AM_PM_NEXT = r"\s?[AaPp]\.?[Mm]\b"
_HOURS_MINUTES_SECONDS = re.compile(
    rf"(?<![\d:.])(?P<h>\d{{1,2}}):(?P<m>[0-5]\d):(?P<s>[0-5]\d(?:\.\d+)?)(?![\d:]|{_AM_PM_NEXT})"
)
_MINUTES_SECONDS = re.compile(rf"(?<![\d:.])(?P<m>\d{{1,2}}):(?P<s>[0-5]\d(?:\.\d+)?)(?![\d:]|{_AM_PM_NEXT})")
_LONG_NEXT = re.compile(r"\s+long\b")
_PREVIOUS_WORDS = re.compile(r"([A-Za-z']+)\W*$")
_COMPOUND_DURATION = re.compile(
    r"(?<![\w.])(?:(?P<h>\d+)\s?h\s+(?P<m>\d+)\s?m(?:\s+(?P<s>\d+)\s?s)?|(?P<m2>\d+)\s?m\s+(?P<s2>\d+)\s?s)\b"
)


def _counted(value: str, singular: str, ctx: Context) -> str:
    said = number_words(value.lstrip("0") or "0", ctx) if "." not in value else number_words(value, ctx)
    return f"{said} {singular}{'' if value.lstrip('0') == '1' else 's'}"


def _say_duration(hours: str, minutes: str, seconds: str, ctx: Context) -> str:
    """'two hours, three minutes and forty-five seconds'; zero parts are left out."""
    parts = [
        _counted(value, unit, ctx)
        for value, unit in ((hours, "hour"), (minutes, "minute"), (seconds, "second"))
        if value.strip("0.")
    ]
    if len(parts) == 3:
        return f"{parts[0]}, {parts[1]} and {parts[2]}"
    return " and ".join(parts) or "zero seconds"


def _previous_words(match: re.Match[str], count: int) -> list[str]:
    words = match.string[max(0, match.start() - 40) : match.start()].lower().split()
    return [word.strip(".,;:'\"()") for word in words[-count:]]


def _after_clock_word(match: re.Match[str]) -> bool:
    previous = _previous_words(match, 2)
    if not previous or previous[-1] not in _CLOCK_WORDS:
        return False
    return not (previous[-1] == "at" and previous[0] in _LEVEL_VERBS)


def _say_hms(match: re.Match[str], ctx: Context) -> str:
    cued = set(_previous_words(match, 3)) & _DURATION_CUES or match["h"] in ("0", "00")
    if not cued or _after_clock_word(match):
        return match.group()
    return _say_duration(match["h"], match["m"], match["s"], ctx)


def _say_ms(match: re.Match[str], ctx: Context) -> str:
    cued = set(_previous_words(match, 3)) & _DURATION_CUES or _LONG_NEXT.match(match.string, match.end())
    if "." not in match["s"] and (not cued or _after_clock_word(match)):
        return match.group()
    return _say_duration("0", match["m"], match["s"], ctx)


def _say_compound(match: re.Match[str], ctx: Context) -> str:
    parts = [
        (match["h"], "hour"),
        (match["m"] or match["m2"], "minute"),
        (match["s"] or match["s2"], "second"),
    ]
    return " ".join(_counted(value, unit, ctx) for value, unit in parts if value)


def expand_durations(text: Tracked, ctx: Context) -> Tracked:
    """'finished in 2:03:45' -> 'two hours, three minutes and forty-five seconds' (not after 'at' or with
    AM/PM: then it is a clock time); 'm:ss' after 'took', 'lasted', 'runs', ... or before 'long', or with
    a decimal ('3:43.13'); '2h 30m' -> 'two hours thirty minutes'."""
    text = text.sub(_HOURS_MINUTES_SECONDS, lambda m: _say_hms(m, ctx))
    text = text.sub(_MINUTES_SECONDS, lambda m: _say_ms(m, ctx))
    return text.sub(_COMPOUND_DURATION, lambda m: _say_compound(m, ctx))


# --- scores -----------------------------------------------------------------------------------------------

_SCORE = re.compile(
    r"(?<![\w.,:/$£€¥-])(?P<a>\d{1,3})\s?[-–—]\s?(?P<b>\d{1,3})(?![\w:/%°]|[.,]\d|\s?[-–—]\s?\d)"
)
_NEXT_WORD = re.compile(r"\s+([A-Za-z]+)")
_RANGE_WORDS = frozenset({"ages", "aged", "age", "from", "between", "pages", "chapters", "for"})


def _say_score(match: re.Match[str], ctx: Context) -> str:
    """'went 10-2' / 'a 12-4 record' -> 'ten and two'; a zero in a score -> 'nothing' ('1-0', '0-0')."""
    a, b = match["a"], match["b"]
    following = _NEXT_WORD.match(match.string, match.end())
    next_word = following.group(1).lower() if following else ""
    previous = _previous_words(match, 1)
    if next_word == "record" or previous == ["went"]:
        return f"{cardinal(int(a), ctx)} and {cardinal(int(b), ctx)}"
    if "0" not in (a, b) or next_word.endswith("s") or set(previous) & _RANGE_WORDS:
        return match.group()
    nothing, join = ("nil", " ") if ctx.british else ("nothing", " to ")
    return join.join(nothing if side == "0" else cardinal(int(side), ctx) for side in (a, b))


def expand_scores(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_SCORE, lambda m: _say_score(m, ctx))


# --- apostrophe years -------------------------------------------------------------------------------------

_SHORT_YEAR = re.compile(r"(?<![\w'’‘])['’‘](?P<yy>\d\d)(?![\d'’]|s\b)")


def expand_short_years(text: Tracked, ctx: Context) -> Tracked:
    """ "the class of '05" -> 'the class of oh five', "summer of '69" -> 'summer of sixty-nine'."""
    return text.sub(
        _SHORT_YEAR,
        lambda m: f"oh {cardinal(int(m['yy']), ctx)}" if m["yy"][0] == "0" else cardinal(int(m["yy"]), ctx),
    )
