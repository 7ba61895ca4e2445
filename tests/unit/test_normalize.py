"""English text normalization: a table of written forms and the words expected for each, rule by rule;
options switched off; British and day-first variants; properties; and misaki reading the result."""

from __future__ import annotations

import os
import re
import string
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.text.normalize import NormalizationOptions, normalize_text

pytestmark = pytest.mark.unit

# rule -> [(written, spoken)], American English, default options, month-first dates.
AMERICAN: dict[str, list[tuple[str, str]]] = {
    "cardinals and ordinals": [
        ("I have 5 apples.", "I have five apples."),
        ("0", "zero"),
        ("It has 101 rooms.", "It has one hundred one rooms."),
        ("There were 3,497 people.", "There were three thousand four hundred ninety-seven people."),
        ("1,000,000 views", "one million views"),
        ("Agent 007", "Agent zero zero seven"),
        ("He came 1st.", "He came first."),
        ("2nd and 3rd", "second and third"),
        ("the 23rd time", "the twenty-third time"),
        ("the 101st day", "the one hundred first day"),
        ("the 11th hour", "the eleventh hour"),
        ("1ST PLACE", "first PLACE"),
    ],
    "decimals and negatives": [
        ("Pi is 3.14.", "Pi is three point one four."),
        ("0.05", "zero point zero five"),
        ("add .5 of it", "add point five of it"),
        ("It was -5 outside.", "It was minus five outside."),
        ("\u221212.5", "minus twelve point five"),
        ("(-3)", "(minus three)"),
    ],
    "percentages": [
        ("45%", "forty-five percent"),
        ("12.5% off", "twelve point five percent off"),
        ("-3% growth", "minus three percent growth"),
        ("a 5-10% rise", "a five to ten percent rise"),
        ("100 %", "one hundred percent"),
    ],
    "fractions": [
        ("1/2", "one half"),
        ("3/4 cup", "three quarters cup"),
        ("2 1/2 hours", "two and a half hours"),
        ("1/3", "one third"),
        ("2/3", "two thirds"),
        ("5/8 inch", "five eighths inch"),
        ("1 3/4 miles", "one and three quarters miles"),
        ("\u00bd cup", "one half cup"),
        ("2\u00bc", "two and a quarter"),
        ("open 24/7", "open twenty-four seven"),
        ("1/100", "one one hundredth"),
        ("5/1", "five over one"),
    ],
    "years": [
        ("in 1999", "in nineteen ninety-nine"),
        ("2005 was good", "two thousand five was good"),
        ("It is 2026.", "It is twenty twenty-six."),
        ("1,999 people", "one thousand nine hundred ninety-nine people"),
        ("4000 items", "four thousand items"),
        ("1999 dollars", "one thousand nine hundred ninety-nine dollars"),
        ("in 1066", "in ten sixty-six"),
        ("since 1900", "since nineteen hundred"),
        ("In 1905 he left.", "In nineteen oh five he left."),
        ("about 1500 people", "about one thousand five hundred people"),
        ("page 1234", "page one thousand two hundred thirty-four"),
        ("In 2020 researchers found it.", "In twenty twenty researchers found it."),
        ("1200 runners", "one thousand two hundred runners"),
        ("the summer of 1969", "the summer of nineteen sixty-nine"),
    ],
    "decades": [
        ("the 1990s", "the nineteen nineties"),
        ("the '80s", "the eighties"),
        ("the 80s", "the eighties"),
        ("the 1800s", "the eighteen hundreds"),
        ("mid-90s", "mid-nineties"),
    ],
    "ranges": [
        ("1-2 days", "one to two days"),
        ("pages 10\u201312", "pages ten to twelve"),
        ("1990-1995", "nineteen ninety to nineteen ninety-five"),
        ("from 9:00-17:00", "from nine o'clock to seventeen hundred"),
        ("$5-$10", "five dollars to ten dollars"),
        ("$5-10", "five dollars to ten dollars"),
        ("5 \u2013 10 km", "five to ten kilometers"),
        ("10 - 5 = 5", "ten minus five equals five"),
        ("a 3-2 win", "a three to two win"),
    ],
    "money": [
        ("$3.50", "three dollars and fifty cents"),
        ("\u00a31.05", "one pound and five pence"),
        ("\u20ac20", "twenty euros"),
        ("\u00a5500", "five hundred yen"),
        ("$1", "one dollar"),
        ("$5k", "five thousand dollars"),
        ("$2.5m", "two point five million dollars"),
        ("$2.5M", "two point five million dollars"),
        ("\u20ac3bn", "three billion euros"),
        ("$0.99", "ninety-nine cents"),
        ("\u00a30.01", "one penny"),
        ("$1,000,000", "one million dollars"),
        ("$1.01", "one dollar and one cent"),
        ("$5 million", "five million dollars"),
        ("-$20", "minus twenty dollars"),
        ("20\u20ac", "twenty euros"),
        ("50\u00a2", "fifty cents"),
        ("$5.99/month", "five dollars and ninety-nine cents per month"),
        ("10M users", "ten million users"),
        ("a 5K run", "a five K run"),
    ],
    "times": [
        ("3:30 pm", "three thirty PM"),
        ("3:30PM", "three thirty PM"),
        ("15:45", "fifteen forty-five"),
        ("10:05", "ten oh five"),
        ("9am", "nine AM"),
        ("12:00", "twelve o'clock"),
        ("15:00", "fifteen hundred"),
        ("at 3:00 p.m. Then", "at three PM. Then"),
        ("at 9 a.m. sharp", "at nine AM sharp"),
        ("12pm", "twelve PM"),
        ("10:30:15", "ten thirty and fifteen seconds"),
        ("3-4pm", "three to four PM"),
        ("a 16:9 screen", "a sixteen to nine screen"),
    ],
    "dates": [
        ("2026-11-22", "November twenty-second, twenty twenty-six"),
        ("Nov 22, 2026", "November twenty-second, twenty twenty-six"),
        ("November 22, 2026", "November twenty-second, twenty twenty-six"),
        ("Nov. 22nd, 2026", "November twenty-second, twenty twenty-six"),
        ("11/22/2026", "November twenty-second, twenty twenty-six"),
        ("22/11/2026", "November twenty-second, twenty twenty-six"),
        ("03/04/2026", "March fourth, twenty twenty-six"),
        ("1.2.2026", "January second, twenty twenty-six"),
        ("22 November 2026", "the twenty-second of November, twenty twenty-six"),
        ("the 4th of July", "the fourth of July"),
        ("June 5", "June fifth"),
        ("in May 2026", "in May twenty twenty-six"),
        ("13/13/2026", "thirteen slash thirteen slash twenty twenty-six"),
    ],
    "urls": [
        ("https://example.com/docs", "example dot com slash docs"),
        ("Visit www.github.com.", "Visit www dot github dot com."),
        ("http://localhost:8080/api", "localhost colon eight zero eight zero slash api"),
        ("see example.org/a-b?q=1", "see example dot org slash a dash b question mark q equals one"),
        ("(https://x.com/a_b)", "(x dot com slash a underscore b)"),
    ],
    "emails": [
        ("jane.doe@example.com", "jane dot doe at example dot com"),
        ("Write to user_42@mail.co.uk.", "Write to user underscore four two at mail dot co dot uk."),
    ],
    "phones": [
        ("(555) 123-4567", "five five five, one two three, four five six seven"),
        ("+1 555 123 4567", "plus one, five five five, one two three, four five six seven"),
        ("555-123-4567", "five five five, one two three, four five six seven"),
        ("+44 20 7946 0958", "plus four four, two oh, seven nine four six, oh nine five eight"),
        ("1-800-555-0199", "one, eight hundred, five five five, oh one nine nine"),
        ("(900) 555-0100", "nine hundred, five five five, oh one oh oh"),
        ("+1 888 555 0100", "plus one, eight eight eight, five five five, oh one oh oh"),
    ],
    "units": [
        ("5 km", "five kilometers"),
        ("1 km", "one kilometer"),
        ("5km", "five kilometers"),
        ("1.5 kg", "one point five kilograms"),
        ("100 km/h", "one hundred kilometers per hour"),
        ("60 mph", "sixty miles per hour"),
        ("6 ft", "six feet"),
        ("1 ft", "one foot"),
        ("12 in.", "twelve inches."),
        ("1 in 5 people", "one in five people"),
        ("16 GB", "sixteen gigabytes"),
        ("2 TB and 512 KB", "two terabytes and five hundred twelve kilobytes"),
        ("100 MB/s", "one hundred megabytes per second"),
        ("1 Gbps", "one gigabit per second"),
        ("20 ms", "twenty milliseconds"),
        ("5 s", "five seconds"),
        ("3 h", "three hours"),
        ("50 Hz", "fifty hertz"),
        ("2.4 GHz", "two point four gigahertz"),
        ("60 W and 2 kW", "sixty watts and two kilowatts"),
        ("12 V", "twelve volts"),
        ("5000 mAh", "five thousand milliamp hours"),
        ("2 L", "two liters"),
        ("250 ml", "two hundred fifty milliliters"),
        ("10 lbs, 1 lb, 8 oz", "ten pounds, one pound, eight ounces"),
        ("3 mi", "three miles"),
        ("5 mg and 5 g", "five milligrams and five grams"),
        ("2 cm and 3 mm", "two centimeters and three millimeters"),
        ("5'11\"", "five foot eleven"),
        ("2 1/2 kg", "two and a half kilograms"),
        ("3/4 mi", "three quarters of a mile"),
        ("1/2 h", "one half of an hour"),
    ],
    "temperatures": [
        ("25\u00b0C", "twenty-five degrees Celsius"),
        ("-5 \u00b0F", "minus five degrees Fahrenheit"),
        ("1\u00b0C", "one degree Celsius"),
        ("turn 90\u00b0", "turn ninety degrees"),
        ("37.5\u2103", "thirty-seven point five degrees Celsius"),
    ],
    "abbreviations": [
        ("Dr. Smith", "Doctor Smith"),
        ("Mr. Jones", "Mister Jones"),
        ("Mrs. Brown", "Missus Brown"),
        ("Ms. Lee", "Miz Lee"),
        ("Mr Smith", "Mister Smith"),
        ("St. Louis", "Saint Louis"),
        ("Call St. Jude today.", "Call Saint Jude today."),
        ("Dear St. Nicholas,", "Dear Saint Nicholas,"),
        ("on Main St.", "on Main Street."),
        ("42 Elm St. He left.", "forty-two Elm Street. He left."),
        ("apples, pears, etc. Then", "apples, pears, et cetera. Then"),
        ("e.g. this", "for example this"),
        ("i.e. that", "that is that"),
        ("cats vs. dogs", "cats versus dogs"),
        ("approx. 5 km", "approximately five kilometers"),
        ("No. 5", "number five"),
        ("No. I won't.", "No. I won't."),
        ("see no. 7 and Nos. 8-9", "see number seven and numbers eight to nine"),
        ("Jan. was cold", "January was cold"),
        ("Prof. Xavier", "Professor Xavier"),
        ("King Jr. was", "King Junior was"),
    ],
    "number symbols": [
        ("#1", "number one"),
        ("#ai rocks", "hashtag ai rocks"),
        ("~5 people", "about five people"),
        ("+5 points", "plus five points"),
        ("\u00b12", "plus or minus two"),
        ("10x faster", "ten times faster"),
        ("1920x1080", "nineteen twenty by ten eighty"),
        ("3 \u00d7 4", "three times four"),
    ],
    "remaining symbols": [
        ("R&D", "R and D"),
        ("me @ home", "me at home"),
        ("1 + 1 = 2", "one plus one equals two"),
        ("C# and C++", "C sharp and C plus plus"),
        ("he/she", "he slash she"),
        ("a < b", "a less than b"),
        ("Hello \U0001f600 world", "Hello world"),
        ("Great \u2713\u2122", "Great"),
        ("A -> B", "A to B"),
        ("snake_case", "snake case"),
    ],
    "roman numerals": [
        ("Chapter IV", "Chapter four"),
        ("Part II", "Part two"),
        ("Henry VIII", "Henry the eighth"),
        ("World War II", "World War two"),
        ("Louis XIV's reign", "Louis the fourteenth's reign"),
        ("Super Bowl LVII", "Super Bowl fifty-seven"),
        ("IV.", "Four."),
        ("## IV", "Four"),
        ("IV. The Return", "Four. The Return"),
        ("I think so.", "I think so."),
        ("MIX and DIV", "MIX and DIV"),
        ("USB Type C", "USB Type C"),
        ("Chapter X0", "Chapter X zero"),
    ],
    "markdown and whitespace": [
        ("# Title", "Title"),
        ("Some **bold** text", "Some bold text"),
        ("*italic* and _under_", "italic and under"),
        ("`code` here", "code here"),
        ("[a link](http://example.com/x)", "a link"),
        ("![alt text](img.png)", "alt text"),
        ("- item one\n- item two", "item one\nitem two"),
        ("* star\n+ plus", "star\nplus"),
        ("1. first\n2. second", "first\nsecond"),
        ("> quoted", "quoted"),
        ("a   lot \t of   spaces ", "a lot of spaces"),
        ("para one\n\n\n\npara two", "para one\n\npara two"),
        ("line one\nline two", "line one\nline two"),
        ("~~old~~ new", "old new"),
        ("```python\nprint(1)\n```", "print(one)"),
        ("above\n\n---\n\nbelow", "above\n\nbelow"),
        ("<b>bold</b>", "bold"),
    ],
    "misaki syntax and pause tags": [
        ("[Kokoro](/k\u02c8Ok\u0259\u0279O/) is 5", "[Kokoro](/k\u02c8Ok\u0259\u0279O/) is five"),
        ("say [pause:1.5s] 5", "say [pause:1.5s] five"),
        ("[word](+1) and [w](-0.5)", "[word](+1) and [w](-0.5)"),
        ("**[Kokoro](/k\u02c8Ok\u0259\u0279O/)**", "[Kokoro](/k\u02c8Ok\u0259\u0279O/)"),
        ("[1](/w\u02c8\u028cn/) 2", "[1](/w\u02c8\u028cn/) two"),
        ("http://x.com/a[pause:1s] 3", "x dot com slash a[pause:1s] three"),
    ],
    "versions and lookalikes": [
        ("v2.0", "version two point zero"),
        ("version 1.2.3", "version one point two point three"),
        ("192.168.0.1", "one ninety-two dot one sixty-eight dot zero dot one"),
        ("A-1 sauce", "A-one sauce"),
        ("COVID-19", "COVID-nineteen"),
        ("5G", "five G"),
        ("mp3", "mp three"),
        ("H2O", "H two O"),
        ("I am in.", "I am in."),
        ("s and in", "s and in"),
        ("1-2-3", "one-two-three"),
        ("0x1F", "zero x one F"),
    ],
    "optional plurals": [
        ("file(s)", "files"),
        ("box(es)", "boxes"),
    ],
}

# (option switched off, written, expected): each optional rule is skipped, everything else still runs.
OPTIONS_OFF: list[tuple[str, str, str]] = [
    ("unit_normalization", "5 km", "five km"),
    ("unit_normalization", "1 kg and 12 in.", "one kg and twelve in."),
    ("unit_normalization", "$5 for 2 L", "five dollars for two L"),
    ("unit_normalization", "2 1/2 kg", "two and a half kg"),
    ("url_normalization", "see https://example.com/a_b now", "see https://example.com/a_b now"),
    ("url_normalization", "Visit www.github.com.", "Visit www.github.com."),
    ("email_normalization", "mail jane.doe@example.com", "mail jane.doe@example.com"),
    ("email_normalization", "a_b_c@example.com at 5", "a_b_c@example.com at five"),
    ("phone_normalization", "call 555-123-4567", "call 555-123-4567"),
    ("phone_normalization", "(555) 123-4567 or 2 more", "(555) 123-4567 or two more"),
    ("optional_pluralization_normalization", "file(s)", "file(s)"),
    ("abbreviation_normalization", "Gen. Patton, e.g. on Mon.", "Gen. Patton, e.g. on Mon."),
    ("abbreviation_normalization", "See Sec. 5 and Main St.", "See Sec. five and Main St."),
    ("address_normalization", "at 742 Evergreen Terrace", "at seven hundred forty-two Evergreen Terrace"),
    ("address_normalization", "10 Downing St. NW", "ten Downing Street. NW"),
    ("identifier_normalization", "flight BA 2490", "flight BA two thousand four hundred ninety"),
    ("identifier_normalization", "Rule 12(b)", "Rule twelve(b)"),
    ("roman_numeral_normalization", "Henry VIII and Chapter IV", "Henry VIII and Chapter IV"),
    ("duration_normalization", "finished in 2:03:45", "finished in two oh three and forty-five seconds"),
    ("score_normalization", "They won 1-0.", "They won one to zero."),
    ("scientific_notation_normalization", "It is 6.02e23.", "It is six point zero two e twenty-three."),
    ("currency_code_normalization", "It costs USD 5.", "It costs USD five."),
    ("replace_remaining_symbols", "R&D", "R&D"),
    ("replace_remaining_symbols", "1 + 1 = 2", "one + one = two"),
    ("replace_remaining_symbols", "\U0001f600 hi", "\U0001f600 hi"),
    ("replace_remaining_symbols", "C# and snake_case", "C# and snake_case"),
    ("normalize", "**$5** at 3:30pm", "**$5** at 3:30pm"),
    ("normalize", "  spaces  and\n\n\n\nlines ", "  spaces  and\n\n\n\nlines "),
]

# British English keeps the "and" inside numbers and spells metre/litre; the rest is the same.
BRITISH: list[tuple[str, str]] = [
    ("3,497", "three thousand four hundred and ninety-seven"),
    ("101", "one hundred and one"),
    ("the 101st", "the one hundred and first"),
    ("2005", "two thousand and five"),
    ("in 1999", "in nineteen ninety-nine"),
    ("5 km", "five kilometres"),
    ("1 m", "one metre"),
    ("2 L", "two litres"),
    ("250 ml", "two hundred and fifty millilitres"),
    ("$1,250", "one thousand two hundred and fifty dollars"),
    ("\u00a31.05", "one pound and five pence"),
    ("Mr Smith", "Mister Smith"),
    ("3/4", "three quarters"),
]

# (date_order, written, spoken): the order resolves ambiguous numeric dates and picks the spoken form.
DATE_ORDERS: list[tuple[str, str, str]] = [
    ("dmy", "03/04/2026", "the third of April, twenty twenty-six"),
    ("mdy", "03/04/2026", "March fourth, twenty twenty-six"),
    ("dmy", "11/22/2026", "the twenty-second of November, twenty twenty-six"),
    ("dmy", "2026-11-22", "the twenty-second of November, twenty twenty-six"),
    ("dmy", "1.2.2026", "the first of February, twenty twenty-six"),
    ("dmy", "Nov 22, 2026", "November twenty-second, twenty twenty-six"),
    ("mdy", "22 Nov 2026", "the twenty-second of November, twenty twenty-six"),
]

# Other languages: only the markdown and whitespace clean-up.
OTHER_LANGUAGES: list[tuple[str, str, str]] = [
    ("e", "**Hola** 3 y 4 en 2026.", "Hola 3 y 4 en 2026."),
    ("f", "# Titre\n\n- un   deux 1/2", "Titre\n\nun deux 1/2"),
    ("e", "[pause:1s] *amigo* https://x.com/a_b_c", "[pause:1s] amigo https://x.com/a_b_c"),
    ("j", "$5 [Kokoro](/k\u02c8Ok\u0259\u0279O/)", "$5 [Kokoro](/k\u02c8Ok\u0259\u0279O/)"),
]

SYMBOLS_MISAKI_MUST_NOT_SEE = set("0123456789$\u00a3\u20ac\u00a5%&@#+=\u00b0/~*_^|<>")
MIXED_PARAGRAPH = (
    "## Chapter IV: The 2nd Report\n\n"
    "On Nov 22, 2026 at 3:30pm, **Dr. Smith** paid $3.50 (and \u00a31.05) for 2 1/2 kg of apples, "
    "i.e. 45% more than in 1999. Call (555) 123-4567 or mail jane.doe@example.com, see "
    "https://example.com/docs?id=7. The 1990s saw 3,497 people run 5-10 km at -5\u00b0C; "
    "R&D grew 12.5% to \u20ac3bn, #1 in the world, v2.0 ships on 2026-11-22 \U0001f680. "
    "Henry VIII, World War II, 1/3 of 24/7, 10x faster, 100 MB/s, 9am, 15:45, the 23rd of June."
)


def _table(rules: dict[str, list[tuple[str, str]]]) -> list[Any]:
    return [
        pytest.param(written, spoken, id=f"{rule}-{index}")
        for rule, cases in rules.items()
        for index, (written, spoken) in enumerate(cases)
    ]


@pytest.mark.parametrize(("written", "spoken"), _table(AMERICAN))
def test_american(written: str, spoken: str) -> None:
    assert normalize_text(written) == spoken


@pytest.mark.parametrize(("option", "written", "expected"), OPTIONS_OFF)
def test_option_switched_off_skips_its_rule(option: str, written: str, expected: str) -> None:
    assert normalize_text(written, NormalizationOptions(**{option: False})) == expected


@pytest.mark.parametrize(("written", "spoken"), BRITISH)
def test_british(written: str, spoken: str) -> None:
    assert normalize_text(written, lang_code="b") == spoken


@pytest.mark.parametrize(("order", "written", "spoken"), DATE_ORDERS)
def test_date_order(order: str, written: str, spoken: str) -> None:
    assert normalize_text(written, date_order="dmy" if order == "dmy" else "mdy") == spoken


@pytest.mark.parametrize(("lang_code", "written", "expected"), OTHER_LANGUAGES)
def test_other_languages_get_only_markdown_cleanup(lang_code: str, written: str, expected: str) -> None:
    assert normalize_text(written, lang_code=lang_code) == expected


def test_every_option_has_a_description_and_units_default_on() -> None:
    fields = NormalizationOptions.model_fields
    assert all(field.description for field in fields.values())
    assert all(NormalizationOptions().model_dump().values())
    assert {option for option, _, _ in OPTIONS_OFF} == set(fields)


@given(
    st.text(
        alphabet=string.ascii_letters + string.digits + " .,:;/-$\u00a3\u20ac%#+&@()\u00b0'\n", max_size=40
    )
)
@settings(max_examples=150, deadline=None)
def test_no_digit_survives_and_nothing_raises(text: str) -> None:
    assert not re.search(r"\d", normalize_text(text))


@given(st.integers(min_value=0, max_value=10**13))
@settings(max_examples=100, deadline=None)
def test_thousands_separators_read_like_plain_numbers(n: int) -> None:
    assert normalize_text(f"{n:,} items") == normalize_text(f"{n} items")


@given(st.text(max_size=60))
@settings(max_examples=100, deadline=None)
def test_normalize_false_returns_text_unchanged_but_for_control_characters(text: str) -> None:
    printable = "".join(c for c in text if c in "\n\r\t" or unicodedata.category(c) not in ("Cc", "Cf"))
    assert normalize_text(text, NormalizationOptions(normalize=False)) == printable


# --- through misaki -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def phonemize() -> Any:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from api.text.phonemize import Phonemizer

    phonemizer = Phonemizer()
    return lambda text: phonemizer.phonemize(text, "a")


def test_mixed_paragraph_leaves_misaki_no_digits_or_symbols(phonemize: Any) -> None:
    normalized = normalize_text(MIXED_PARAGRAPH)
    phonemes = "".join(phonemize(line) for line in normalized.splitlines() if line)
    assert not SYMBOLS_MISAKI_MUST_NOT_SEE & set(normalized)
    assert not SYMBOLS_MISAKI_MUST_NOT_SEE & set(phonemes)
    assert len(phonemes) > len(MIXED_PARAGRAPH) // 2


def test_misaki_reads_the_phoneme_syntax_left_intact(phonemize: Any) -> None:
    phonemes = phonemize(normalize_text("[Kokoro](/k\u02c8Ok\u0259\u0279O/) costs $5."))
    assert phonemes.startswith("k\u02c8Ok\u0259\u0279O ")


def test_misaki_spells_am_and_pm_as_letters(phonemize: Any) -> None:
    assert phonemize(normalize_text("at 3:30pm")) == phonemize("at three thirty p.m.")
    assert phonemize(normalize_text("by 9am")) == phonemize("by nine a.m.")


def test_misaki_reads_normalized_money_like_the_words(phonemize: Any) -> None:
    assert phonemize(normalize_text("It costs $2.5m.")) == phonemize(
        "It costs two point five million dollars."
    )
