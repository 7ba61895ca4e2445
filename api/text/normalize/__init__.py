"""English text normalization for TTS: written forms (numbers, money, dates, times, URLs, units,
abbreviations, symbols, markdown) become the words a reader would say, before misaki phonemizes them.

Every rule is a small function from text to text, in the module of its concept (`dates`, `money`,
`units`, ...). `pipeline.normalize_tracked` runs them in a fixed order (`pipeline.RULES`); the order
matters because a rule consumes the digits a later, more general rule would read differently (a date
before a range, money before a plain number, a year after every other 4-digit use).

Spans that must reach misaki untouched (its `[word](/phonemes/)` syntax, `[pause:1.5s]` tags, and URLs,
e-mail addresses and phone numbers, spoken or verbatim) are swapped for private-use placeholder
characters first (`spans`), so no later rule can see inside them, and put back at the end.
"""

from api.text.normalize.options import NormalizationOptions
from api.text.normalize.pipeline import ENGLISH_LANG_CODES, normalize_text, normalize_tracked

__all__ = ["ENGLISH_LANG_CODES", "NormalizationOptions", "normalize_text", "normalize_tracked"]
