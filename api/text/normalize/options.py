"""Which optional normalization rules run (NormalizationOptions, as Kokoro-FastAPI's clients send them)."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
