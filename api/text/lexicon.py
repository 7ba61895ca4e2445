"""A pronunciation lexicon: words the server must say a given way (names, brands, jargon), applied before
G2P as misaki's `[word](/phonemes/)`.

The file is JSON (`{"Kokoro": "kˈOkəɹO", ...}`) or lines of `word<TAB>phonemes` (`#` comments), read at
start. Case: an entry written all in lower case matches the word in any case ("nginx" also matches
"NGINX" and "Nginx"); an entry with a capital letter matches that spelling only ("Nice" the city, not
"nice"). A word is matched whole (not inside a longer word); entries may hold spaces ("New York").
Longer entries win over shorter ones that overlap them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from api.text.tracked import Tracked

# Characters misaki's syntax cannot hold inside the phonemes.
_FORBIDDEN = re.compile(r"[/()\[\]\n]")


class LexiconError(ValueError):
    """The lexicon file cannot be used (the server refuses to start with it)."""


class Lexicon:
    """Word -> phonemes, matched as described in the module docstring."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self.entries = {word.strip(): phonemes.strip() for word, phonemes in entries.items() if word.strip()}
        for word, phonemes in self.entries.items():
            if not phonemes or _FORBIDDEN.search(phonemes) or _FORBIDDEN.search(word):
                raise LexiconError(f"lexicon entry {word!r}: phonemes must be non-empty, without / ( ) [ ]")
        self._exact = {word: ph for word, ph in self.entries.items() if word != word.lower()}
        self._folded = {word: ph for word, ph in self.entries.items() if word == word.lower()}
        self._pattern = _pattern(self.entries)

    @classmethod
    def load(cls, path: Path) -> Lexicon:
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() == ".json":
            data = json.loads(text)
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise LexiconError(f"{path}: a JSON lexicon is one object of word -> phonemes strings")
            return cls(data)
        entries = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            word, tab, phonemes = line.partition("\t")
            if not tab:
                raise LexiconError(f"{path}:{number}: expected 'word<TAB>phonemes'")
            entries[word] = phonemes
        return cls(entries)

    def phonemes_for(self, word: str) -> str | None:
        return self._exact.get(word) or self._folded.get(word.lower())

    def apply(self, text: Tracked, shield: Callable[[str], str]) -> Tracked:
        """Each lexicon word in `text` replaced by what `shield` makes of its misaki markup."""
        if self._pattern is None:
            return text

        def replace(match: re.Match[str]) -> str:
            phonemes = self.phonemes_for(match.group())
            return match.group() if phonemes is None else shield(f"[{match.group()}](/{phonemes}/)")

        return text.sub(self._pattern, replace)

    def __len__(self) -> int:
        return len(self.entries)


def _pattern(entries: Mapping[str, str]) -> re.Pattern[str] | None:
    if not entries:
        return None
    words = sorted(entries, key=len, reverse=True)
    alternatives = "|".join(re.escape(word) for word in words)
    # Case-insensitive search; `phonemes_for` then keeps exact-case entries to their own spelling.
    return re.compile(rf"(?<![\w'])(?:{alternatives})(?![\w'])", re.IGNORECASE)
