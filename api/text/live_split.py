"""Text that arrives in pieces (an LLM's tokens) cut into phrases, each spoken as soon as its end is certain.

A cut is only made where the text after it has been seen, so no word, number or abbreviation is ever cut
before its end: 'Hel' + 'lo' is one word, '$3,' + '497.50' one number, 'Dr.' + ' Smith' one name. Where:

- after a sentence end ('.', '!', '?', '…', closing quotes after them, or a line break), once the first
  character of the next word shows it is one: not before a lower-case word ('5 p.m. today'), not after a
  word read with the next one ('Dr.', 'Sec.', 'Nov.', 'e.g.': `READ_WITH_NEXT`) or an initial ('J.');
- after a clause mark (',', ';', ':', '—') followed by a space, once `clause_words` words wait before it;
- after any whole word (a space seen after it, not a word read with the next one) once `max_words` wait,
  or when asked (`idle`: no new text for a while);
- Chinese and Japanese sentence and clause marks, which take no space, once any character follows them.

Every phrase is a stretch of the text appended, in order: joined, they give back exactly that text.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from api.text.chunk import CLAUSE_ENDS, CLOSERS, SENTENCE_ENDS
from api.text.normalize.abbreviations import READ_WITH_NEXT

_WORD = re.compile(r"\S+")
_OPENERS = "\"'“‘([«"
_INITIAL = re.compile(r"[A-Za-z]\.")
# Titles written without their period ('Mr Smith'): read with the next word all the same.
_BARE_TITLES = frozenset({"Mr", "Mrs", "Ms", "Dr", "Prof", "St"})
_CJK_SENTENCE_ENDS = "。！？"
_CJK_CLAUSE_ENDS = "，、；："
_CJK_CLOSERS = "」』”’）)]"
# A cut is never made inside a tag ('[pause: 1 s]', '[voice:af_bella]') opened this close before it.
_TAG_REACH = 64


class Cut(enum.IntEnum):
    """How good a place to cut is: any whole word, a clause boundary, a sentence end."""

    WORD = 1
    CLAUSE = 2
    SENTENCE = 3


@dataclass(frozen=True)
class Boundary:
    """A place to cut the waiting text: its index, its kind, and how many words come before it."""

    at: int
    cut: Cut
    words: int


@dataclass(frozen=True)
class SplitRules:
    clause_words: int = 6
    max_words: int = 40

    def __post_init__(self) -> None:
        if not 1 <= self.clause_words <= self.max_words:
            raise ValueError("need 1 <= clause_words <= max_words")


class PhraseSplitter:
    """Holds the text not yet spoken and cuts phrases off its front when the rules above allow: `append`
    (new text), `idle` (no text for a while: every whole word), `flush` (everything)."""

    def __init__(self, rules: SplitRules | None = None) -> None:
        self.rules = rules or SplitRules()
        self._text = ""

    @property
    def pending(self) -> str:
        return self._text

    def append(self, text: str) -> list[str]:
        self._text += text
        phrases = []
        while (at := self._next_cut()) is not None:
            phrases.append(self._take(at))
        return phrases

    def idle(self) -> list[str]:
        """Every whole word waiting, cut at the last place that is not inside a word or an abbreviation's
        reach; a word still being written stays."""
        found = boundaries(self._text)
        return [self._take(found[-1].at)] if found else []

    def flush(self) -> list[str]:
        return [self._take(len(self._text))] if self._text else []

    def clear(self) -> None:
        self._text = ""

    def _next_cut(self) -> int | None:
        found = boundaries(self._text)
        sentence = [b for b in found if b.cut is Cut.SENTENCE]
        if sentence:
            return sentence[-1].at
        clause = [b for b in found if b.cut is Cut.CLAUSE and b.words >= self.rules.clause_words]
        if clause:
            return clause[-1].at
        if found and found[-1].words >= self.rules.max_words:
            return found[-1].at
        return None

    def _take(self, at: int) -> str:
        phrase, self._text = self._text[:at], self._text[at:]
        return phrase


def boundaries(text: str) -> list[Boundary]:
    """Every place `text` may be cut now, in order (see the module docstring)."""
    found: list[Boundary] = []
    words = list(_WORD.finditer(text))
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else None
        found += _inside(word, index, text)
        if word.end() == len(text) or _in_tag(text, word.end()):
            continue  # the word may go on, or a tag is open
        space = text[word.end() : following.start() if following else len(text)]
        cut = _after(word.group(), space, following)
        if cut is not None:
            found.append(Boundary(word.end(), cut, index + 1))
    return found


def ends_sentence(text: str) -> bool:
    """Whether `text` ends at a sentence end with a space after it that no next word is needed to confirm,
    for clients that send whole sentences (Wyoming's, whose servers cut at a period and a space): not after
    a word read with the next one ('Dr.', 'J.') or one with a period inside ('p.m.', 'U.S.'), which a
    following word could still carry on."""
    words = _WORD.findall(text)
    if not words or not text[-1:].isspace():
        return False
    word = words[-1]
    if "\n" in text[text.rfind(word) :]:
        return True
    core = word.rstrip("".join(CLOSERS) + _CJK_CLOSERS)
    if not core or core[-1] not in SENTENCE_ENDS or _read_with_next(word):
        return False
    return "." not in core.rstrip("".join(SENTENCE_ENDS))


def _after(word: str, space: str, following: re.Match[str] | None) -> Cut | None:
    """The kind of cut after a whole `word` followed by `space` and the next word (None: not yet seen)."""
    if "\n" in space:
        return Cut.SENTENCE
    if _read_with_next(word):
        return None
    core = word.rstrip("".join(CLOSERS) + _CJK_CLOSERS)
    if core and (core[-1] in SENTENCE_ENDS or core[-1] in _CJK_SENTENCE_ENDS):
        next_start = following.group().lstrip(_OPENERS)[:1] if following else ""
        return Cut.SENTENCE if next_start and not next_start.islower() else Cut.WORD
    if core and core[-1] in CLAUSE_ENDS:
        return Cut.CLAUSE
    return Cut.WORD


def _read_with_next(word: str) -> bool:
    bare = word.lstrip(_OPENERS)
    if bare in _BARE_TITLES:
        return True
    if not bare.endswith("."):
        return False
    return bare[:-1].lower() in READ_WITH_NEXT or bool(_INITIAL.fullmatch(bare))


def _inside(word: re.Match[str], index: int, text: str) -> list[Boundary]:
    """Cuts after Chinese and Japanese sentence and clause marks inside a word, once a character follows."""
    found = []
    token = word.group()
    for position, char in enumerate(token):
        if char not in _CJK_SENTENCE_ENDS and char not in _CJK_CLAUSE_ENDS:
            continue
        end = position + 1
        while end < len(token) and token[end] in _CJK_CLOSERS:
            end += 1
        if end < len(token):
            cut = Cut.SENTENCE if char in _CJK_SENTENCE_ENDS else Cut.CLAUSE
            found.append(Boundary(word.start() + end, cut, index + 1))
    return found


def _in_tag(text: str, at: int) -> bool:
    before = text[max(0, at - _TAG_REACH) : at]
    return before.rfind("[") > before.rfind("]")
