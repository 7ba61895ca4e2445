"""Markdown read as plain text ('**bold**' -> 'bold', a link -> its text), and whitespace tidied."""

from __future__ import annotations

import re

from api.text.normalize.numbers import Context
from api.text.tracked import Tracked

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


def strip_markdown_links(text: Tracked) -> Tracked:
    """'[text](url)' and '![alt](url)' -> the text; '<https://x.com>' -> the bare URL."""
    return text.sub(_MD_LINK, r"\1").sub(_MD_AUTOLINK, r"\1")


def strip_markdown(text: Tracked) -> Tracked:
    for pattern, replacement in _MD_CLEANUPS:
        text = text.sub(pattern, replacement)
    return text


def tidy_whitespace(text: Tracked) -> Tracked:
    """Collapse runs of spaces, trim lines, keep single line breaks and at most one blank line."""
    text = text.sub(_INLINE_SPACE, " ")
    text = text.sub(_LINE_EDGE_SPACE, "\n")
    return text.sub(_BLANK_LINES, "\n\n").strip()


def tidy_punctuation(text: Tracked, ctx: Context) -> Tracked:
    return text.sub(_INLINE_SPACE, " ").sub(_SPACE_BEFORE_PUNCTUATION, r"\1")
