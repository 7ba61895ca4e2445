"""Spans no rule may see inside (misaki's syntax, pause tags, URLs, e-mail addresses, phone numbers),
swapped for private-use placeholders and put back at the end, the spoken ones spoken."""

from __future__ import annotations

import re
from collections.abc import Callable

from api.text.normalize.numbers import digits_of
from api.text.normalize.options import NormalizationOptions
from api.text.tracked import Tracked

_PLACEHOLDER_BASE = 0xF0000
_PRIVATE_USE = r"\U000f0000-\U000ffffd"
PLACEHOLDER = re.compile(f"[{_PRIVATE_USE}]")
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


def shield(
    text: Tracked, pattern: re.Pattern[str], spans: list[str], speak: Callable[[str], str] | None = None
) -> Tracked:
    """Swap each match for a placeholder; `spans` keeps what goes back (the match, or how it is spoken)."""

    def put(match: re.Match[str]) -> str:
        spans.append(speak(match.group()) if speak else match.group())
        return chr(_PLACEHOLDER_BASE + len(spans) - 1)

    return text.sub(pattern, put)


def shield_one(spoken: str, spans: list[str]) -> str:
    spans.append(spoken)
    return chr(_PLACEHOLDER_BASE + len(spans) - 1)


def restore(text: Tracked, spans: list[str]) -> Tracked:
    return text.sub(PLACEHOLDER, lambda match: spans[ord(match.group()) - _PLACEHOLDER_BASE])


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


def shield_spans(text: Tracked, options: NormalizationOptions, english: bool, spans: list[str]) -> Tracked:
    """Shield addresses and phone numbers: spoken when their rule is on (English only), else verbatim."""
    text = shield(text, _EMAIL, spans, _speak_address if english and options.email_normalization else None)
    text = shield(text, _URL, spans, _speak_url if english and options.url_normalization else None)
    if english:
        text = shield(text, _PHONE, spans, _speak_phone if options.phone_normalization else None)
    return text
