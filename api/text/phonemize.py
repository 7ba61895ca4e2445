"""Grapheme-to-phoneme through misaki, built as kokoro's KPipeline builds it, one G2P per language.

misaki is used directly rather than through `kokoro.KPipeline(model=False)`: importing kokoro imports
torch and transformers (about 0.45 GiB per worker), which the ONNX engine never needs."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import types
from typing import Any

from api.errors import InvalidRequestError
from api.text.chunk import Word, phoneme_words

logger = logging.getLogger(__name__)

# Every language Kokoro speaks, each with a G2P that works offline: misaki's English, Japanese (cutlet over
# fugashi with the unidic-lite dictionary) and Chinese (jieba, pypinyin, cn2an), and espeak-ng (shipped by
# espeakng-loader) for the others.
LANGUAGES = {
    "a": "American English",
    "b": "British English",
    "e": "Spanish",
    "f": "French",
    "h": "Hindi",
    "i": "Italian",
    "j": "Japanese",
    "p": "Brazilian Portuguese",
    "z": "Mandarin Chinese",
}
# Languages whose G2P gives the text's own words (misaki's English tokens); the others give phonemes only.
WORD_TEXT_LANGUAGES = frozenset("ab")
# espeak-ng's names for the languages it speaks (kokoro.pipeline.LANG_CODES).
ESPEAK_LANGUAGES = {"e": "es", "f": "fr-fr", "h": "hi", "i": "it", "p": "pt-br"}


def build_g2p(lang_code: str) -> Any:
    """The G2P kokoro's KPipeline(lang_code) builds: misaki's English G2P (espeak-ng for words not in
    its lexicons) for a and b, misaki's Japanese (cutlet) and Chinese (the version for Kokoro-82M v1.0)
    G2P for j and z, espeak-ng itself for the others."""
    if lang_code == "j":
        _without_pyopenjtalk()
        from misaki import ja

        return ja.JAG2P()
    if lang_code == "z":
        from misaki import zh

        return zh.ZHG2P(version=None)
    from misaki import espeak

    if lang_code in ESPEAK_LANGUAGES:
        return espeak.EspeakG2P(language=ESPEAK_LANGUAGES[lang_code])
    _without_curated_transformers()
    from misaki import en

    british = lang_code == "b"
    return en.G2P(trf=False, british=british, fallback=espeak.EspeakFallback(british=british), unk="")


# The distribution whose spaCy plug-ins misaki's English G2P never uses (its transformer mode, trf=True).
CURATED_TRANSFORMERS = "spacy_curated_transformers"


def _without_curated_transformers() -> None:
    """spaCy loads every installed package's registered factories when it builds a pipeline (catalogue's
    entry points, read once at its import). misaki[en] installs spacy-curated-transformers for a transformer
    mode this G2P never runs, and its factory imports Hugging Face transformers, for a pipeline
    (en_core_web_sm) that names none of it: 0.9 CPU-s and 29 MB in every process that loads English, the
    servers' workers included (a tone server's worker was ready in 3.2 s instead of 4.1, on a 2-core Xeon).
    Its entry points are left out of catalogue's list."""
    import catalogue

    available = catalogue.AVAILABLE_ENTRY_POINTS
    if isinstance(available, dict):  # group -> entry points (SelectableGroups, Python 3.10-3.11)
        for group, entries in list(available.items()):
            available[group] = type(entries)(entry for entry in entries if not _curated(entry))
    elif any(_curated(entry) for entry in available):  # importlib.metadata.EntryPoints, Python 3.12+
        kept = (entry for entry in available if not _curated(entry))
        catalogue.AVAILABLE_ENTRY_POINTS = type(available)(kept)


def _curated(entry: Any) -> bool:
    return bool(entry.value.startswith(CURATED_TRANSFORMERS))


def _without_pyopenjtalk() -> None:
    """misaki's ja module imports pyopenjtalk at the top, though its default G2P (cutlet) never calls it;
    pyopenjtalk builds from source and downloads its dictionary at first use, which an offline server
    cannot. Where it is not installed, an empty module stands in for the import."""
    if "pyopenjtalk" not in sys.modules and importlib.util.find_spec("pyopenjtalk") is None:
        sys.modules["pyopenjtalk"] = types.ModuleType("pyopenjtalk")


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
        return phoneme_words(str(phonemes or ""))

    def gives_word_text(self, lang_code: str) -> bool:
        """Whether `words` gives the text's own words (misaki's English tokens) rather than phoneme
        words (espeak-ng's languages)."""
        return lang_code in WORD_TEXT_LANGUAGES

    def check_language(self, lang_code: str, param: str = "lang_code") -> None:
        """An error naming `param` (the request's field) where `lang_code` is not a G2P language."""
        if lang_code not in LANGUAGES:
            supported = ", ".join(f"{code} ({name})" for code, name in LANGUAGES.items())
            raise InvalidRequestError(
                f"Language '{lang_code}' is not supported. Supported: {supported}.",
                param=param,
                code="unsupported_language",
            )

    def _get(self, lang_code: str) -> Any:
        self.check_language(lang_code)
        with self._lock:
            if lang_code not in self._g2p:
                logger.info("loading G2P for %s", LANGUAGES[lang_code])
                self._g2p[lang_code] = build_g2p(lang_code)
            return self._g2p[lang_code]
