"""Grapheme-to-phoneme through misaki (kokoro's KPipeline without a model), one pipeline per language."""

from __future__ import annotations

import logging
import threading
from typing import Any

from api.errors import InvalidRequestError
from api.text.chunk import Word

logger = logging.getLogger(__name__)

REPO_ID = "hexgrad/Kokoro-82M"
# Languages whose G2P works offline here: misaki's English, and espeak-ng (shipped by espeakng-loader).
LANGUAGES = {
    "a": "American English",
    "b": "British English",
    "e": "Spanish",
    "f": "French",
    "h": "Hindi",
    "i": "Italian",
    "p": "Brazilian Portuguese",
}


class Phonemizer:
    """Text -> phoneme string in kokoro's alphabet. Builds each language's G2P on first use.

    Not thread-safe: the speech service calls it from one G2P thread.
    """

    def __init__(self) -> None:
        self._g2p: dict[str, Any] = {}
        self._lock = threading.Lock()

    def phonemize(self, text: str, lang_code: str) -> str:
        g2p = self._get(lang_code)
        phonemes, _ = g2p(text)
        return str(phonemes or "")

    def words(self, text: str, lang_code: str) -> list[Word]:
        """The text as G2P words: misaki's tokens for English (text and phonemes aligned), the phoneme
        string's space-separated words for the espeak languages."""
        g2p = self._get(lang_code)
        phonemes, tokens = g2p(text)
        if tokens is not None:
            return [Word(token.text, token.phonemes or "", bool(token.whitespace)) for token in tokens]
        parts = str(phonemes or "").split()
        return [Word(part, part, index < len(parts) - 1) for index, part in enumerate(parts)]

    def check_language(self, lang_code: str) -> None:
        if lang_code not in LANGUAGES:
            supported = ", ".join(f"{code} ({name})" for code, name in LANGUAGES.items())
            raise InvalidRequestError(
                f"Language '{lang_code}' is not supported. Supported: {supported}.",
                param="lang_code",
                code="unsupported_language",
            )

    def _get(self, lang_code: str) -> Any:
        self.check_language(lang_code)
        with self._lock:
            if lang_code not in self._g2p:
                from kokoro import KPipeline

                logger.info("loading G2P for %s", LANGUAGES[lang_code])
                self._g2p[lang_code] = KPipeline(lang_code=lang_code, repo_id=REPO_ID, model=False).g2p
            return self._g2p[lang_code]
