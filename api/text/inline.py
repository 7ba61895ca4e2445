"""Inline markup that several text layers must recognise: misaki's phoneme links and the bracket tags. Each
layer does its own thing with them (normalization leaves them untouched, captions show a link as its word
and drop the tags, api/text/pauses.py and api/text/markup.py read the tags' values), from one definition."""

from __future__ import annotations

import re

# misaki's `[word](/phonemes/)` and its other bracket forms (`[word](#...#)`, stress `[word](-1)`); group 1
# is the word.
MISAKI_LINK = re.compile(r"\[([^\[\]\n]+)\]\((?:/[^/)\n]*/|#[^#)\n]*#|[+-]?(?:\d+|0\.5))\)")
# `[pause:...]`, well-formed or not (api/text/pauses.py reads the duration).
PAUSE_TAG = re.compile(r"\[pause:[^\]\n]*\]", re.IGNORECASE)
# `[pause:...]` and `[voice:...]`: markup, not words.
BRACKET_TAG = re.compile(r"\[(?:pause|voice):[^\]\n]*\]", re.IGNORECASE)
