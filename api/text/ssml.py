"""A safe translator for a subset of SSML: the document becomes the server's own inline markup
(`[pause:0.4s]`, misaki's `[word](/phonemes/)`, line breaks as sentence breaks) plus segments that say
which voice speaks each stretch of the text and at what rate.

Parsing goes through defusedxml with DTDs forbidden, so entity expansion ("billion laughs") and external
references are refused before any of them is read. Only the predefined XML entities and numeric character
references work. Unknown elements keep their text: spoken text is never dropped or reordered.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import defusedxml
import defusedxml.ElementTree as defused_et
from num2words import num2words

from api.errors import InvalidRequestError
from api.text.pauses import MAX_PAUSE_S

MAX_DEPTH = 32
BREAK_STRENGTHS: dict[str, float] = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.25,
    "medium": 0.4,
    "strong": 0.7,
    "x-strong": 1.2,
}
PROSODY_RATES: dict[str, float] = {
    "x-slow": 0.6,
    "slow": 0.8,
    "medium": 1.0,
    "default": 1.0,
    "fast": 1.25,
    "x-fast": 1.6,
}
RATE_RANGE = (0.5, 2.0)

_SPEAK_START = re.compile(r"\A\ufeff?\s*(?:<\?xml[^>]*\?>\s*)?<speak[\s>/]")
_WHITESPACE = re.compile(r"\s+")
# Bounded digit counts keep float() and num2words away from absurd inputs.
_BREAK_TIME = re.compile(r"(\d{1,9}(?:\.\d{1,9})?|\.\d{1,9})(ms|s)")
_RATE = re.compile(r"([+-])?(\d{1,9}(?:\.\d{1,9})?|\.\d{1,9})(%)?")
_INTEGER = re.compile(r"[+-]?\d{1,30}")
_SENTENCE_END = re.compile(r"[.!?…][\"'”’»)\]]*\Z")
_PAUSE_TAG = re.compile(r"\[pause:[\d.]+s\]")
_PHONEME_FORBIDDEN = frozenset("/)][\n")
_PHONEME_ALPHABETS = (None, "ipa", "x-kokoro")
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SHOWN_CHARS = 40


@dataclass(frozen=True)
class SsmlSegment:
    """[start, end) of SsmlScript.text, spoken by `voice` (None: the request's) at `rate` x its speed."""

    start: int
    end: int
    voice: str | None
    rate: float


@dataclass(frozen=True)
class SsmlScript:
    """A translated SSML document: the text in inline markup and the voice/rate segments that cover it."""

    text: str
    segments: tuple[SsmlSegment, ...]


@dataclass(frozen=True)
class _Context:
    voice: str | None = None
    rate: float = 1.0


@dataclass
class _Run:
    context: _Context
    parts: list[str]


@dataclass
class _Output:
    """Collects translated pieces into runs of one voice and rate, joining whitespace as it goes and
    counting the pieces that say something, so sentence breaks know whether their element was empty.
    Runs keep their pieces apart so a sentence end touches only the last few, never the whole text."""

    runs: list[_Run] = field(default_factory=list)
    spoken: int = 0
    pauses: int = 0

    def add_text(self, text: str, context: _Context) -> None:
        text = _collapse(text)
        if text.strip():
            self._append(text, context)
            self.spoken += 1
        elif not self._ends_with_space():
            # Whitespace never opens a run: it only separates, so it joins whatever came before.
            self.runs[-1].parts.append(" ")

    def add_pause(self, tag: str, context: _Context) -> None:
        self._append(f" {tag} ", context)
        self.pauses += 1

    def end_sentence(self, newlines: int, *, period: bool) -> None:
        """Close the sentence with line break(s) and, when asked, a period if it has no punctuation."""
        newlines = max(newlines, self._trim_end())
        if period:
            self._add_period()
        self.runs[-1].parts.append("\n" * newlines)

    def _ends_with_space(self) -> bool:
        return not self.runs or self.runs[-1].parts[-1][-1:].isspace()

    def _append(self, text: str, context: _Context) -> None:
        if self._ends_with_space():
            text = text.lstrip()
        if self.runs and self.runs[-1].context == context:
            self.runs[-1].parts.append(text)
        else:
            self.runs.append(_Run(context, [text]))

    def _trim_end(self) -> int:
        """Drop the trailing whitespace; the number of line breaks it held."""
        parts = self.runs[-1].parts
        removed = ""
        # Every run holds something besides whitespace, so this stops before the run is empty.
        while not parts[-1].strip():
            removed = parts.pop() + removed
        kept = parts[-1].rstrip()
        removed = parts[-1][len(kept) :] + removed
        parts[-1] = kept
        return removed.count("\n")

    def _add_period(self) -> None:
        # The period goes after the last spoken piece, before any pauses that follow it.
        for run in reversed(self.runs):
            for index in reversed(range(len(run.parts))):
                part = run.parts[index]
                if not part.strip() or _PAUSE_TAG.fullmatch(part.strip()):
                    continue
                kept = part.rstrip()
                if not _SENTENCE_END.search(kept):
                    run.parts[index] = kept + "." + part[len(kept) :]
                return


def looks_like_ssml(text: str) -> bool:
    """Whether the text (after whitespace and an optional XML declaration) opens with a <speak> element."""
    return _SPEAK_START.match(text) is not None


def translate(text: str) -> SsmlScript:
    """The SSML document as inline-markup text plus voice/rate segments; InvalidRequestError (400,
    param "input", code "invalid_ssml") for anything unsafe, malformed or unsupported."""
    root = _parse(text)
    if _local_name(root.tag) != "speak":
        raise _invalid(f"The SSML root element must be <speak>, not <{_shown(_local_name(root.tag))}>.")
    _check_depth(root)
    output = _Output()
    _walk_children(root, _Context(), output)
    return _script(output.runs)


def _parse(text: str) -> ET.Element:
    try:
        root: ET.Element = defused_et.fromstring(
            text, forbid_dtd=True, forbid_entities=True, forbid_external=True
        )
    except (
        defusedxml.DTDForbidden,
        defusedxml.EntitiesForbidden,
        defusedxml.ExternalReferenceForbidden,
    ) as exc:
        raise _invalid("SSML may not declare a DTD, entities or external references.") from exc
    except defusedxml.NotSupportedError as exc:
        raise _invalid(f"The SSML uses an XML feature the server does not support: {exc}") from exc
    except ET.ParseError as exc:
        line, column = exc.position
        reason = re.sub(r": line \d+, column \d+\Z", "", str(exc))
        # expat counts columns from 0; people (and editors) count from 1.
        raise _invalid(f"The SSML is malformed at line {line}, column {column + 1}: {reason}") from exc
    return root


def _check_depth(root: ET.Element) -> None:
    # Iterative, so an absurdly deep document cannot exhaust the stack before it is refused; the
    # recursive walk that follows is then bounded by MAX_DEPTH.
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _invalid(f"The SSML nests elements more than {MAX_DEPTH} deep.")
        stack.extend((child, depth + 1) for child in element)


def _walk(element: ET.Element, context: _Context, output: _Output) -> None:
    handler = _HANDLERS.get(_local_name(element.tag), _walk_children)
    handler(element, context, output)


def _walk_children(element: ET.Element, context: _Context, output: _Output) -> None:
    output.add_text(element.text or "", context)
    for child in element:
        _walk(child, context, output)
        # A child's tail belongs to its parent: it is spoken in the parent's voice and rate.
        output.add_text(child.tail or "", context)


def _sentence(newlines: int) -> Callable[[ET.Element, _Context, _Output], None]:
    def handle(element: ET.Element, context: _Context, output: _Output) -> None:
        spoken, pauses = output.spoken, output.pauses
        _walk_children(element, context, output)
        if output.spoken > spoken or output.pauses > pauses:
            # With only silence inside there is no sentence of its own to put a period on.
            output.end_sentence(newlines, period=output.spoken > spoken)

    return handle


def _break(element: ET.Element, context: _Context, output: _Output) -> None:
    seconds = min(_break_seconds(element), MAX_PAUSE_S)
    shown = f"{seconds:.3f}".rstrip("0").rstrip(".")
    if float(shown) > 0:
        output.add_pause(f"[pause:{shown}s]", context)
    else:
        # No silence, but a break still stands between words: "one<break strength='none'/>two".
        output.add_text(" ", context)


def _break_seconds(element: ET.Element) -> float:
    time = element.get("time")
    if time is not None:
        match = _BREAK_TIME.fullmatch(time.strip())
        if match is None:
            raise _invalid(
                f"Invalid <break> time {_shown(time)!r}: use seconds or milliseconds, like '1.5s' or '500ms'."
            )
        return float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
    strength = element.get("strength", "medium")
    if strength not in BREAK_STRENGTHS:
        raise _invalid(
            f"Invalid <break> strength {_shown(strength)!r}: use one of {', '.join(BREAK_STRENGTHS)}."
        )
    return BREAK_STRENGTHS[strength]


def _prosody(element: ET.Element, context: _Context, output: _Output) -> None:
    rate = element.get("rate")
    if rate is not None:
        low, high = RATE_RANGE
        context = replace(context, rate=min(max(context.rate * _rate_factor(rate), low), high))
    _walk_children(element, context, output)


def _rate_factor(rate: str) -> float:
    if rate.strip() in PROSODY_RATES:
        return PROSODY_RATES[rate.strip()]
    match = _RATE.fullmatch(rate.strip())
    # A signed number is only meaningful as a relative percentage ("+20%").
    if match is None or (match.group(1) and not match.group(3)):
        raise _invalid(
            f"Invalid <prosody> rate {_shown(rate)!r}: use {', '.join(PROSODY_RATES)}, a percentage "
            "('80%', '+20%', '-10%') or a multiplier ('1.2')."
        )
    sign, number, percent = match.groups()
    value = float(number)
    if not percent:
        return value
    if sign:
        return 1.0 + (value if sign == "+" else -value) / 100.0
    return value / 100.0


def _voice(element: ET.Element, context: _Context, output: _Output) -> None:
    name = (element.get("name") or "").strip()
    if not name:
        raise _invalid("The SSML <voice> element needs a name attribute.")
    _walk_children(element, replace(context, voice=name), output)


def _phoneme(element: ET.Element, context: _Context, output: _Output) -> None:
    phonemes = _phonemes(element)
    # The brackets would end misaki's `[word]` early; the word is only shown, the phonemes are spoken.
    word = _collapse(_content(element).replace("[", " ").replace("]", " ")).strip()
    if not word:
        raise _invalid("The SSML <phoneme> element needs text to pronounce.")
    output.add_text(f"[{word}](/{phonemes}/)", context)


def _phonemes(element: ET.Element) -> str:
    alphabet = element.get("alphabet")
    if alphabet not in _PHONEME_ALPHABETS:
        raise _invalid(f"Unsupported <phoneme> alphabet {_shown(alphabet or '')!r}: use 'ipa' or 'x-kokoro'.")
    phonemes = (element.get("ph") or "").strip()
    if not phonemes:
        raise _invalid("The SSML <phoneme> element needs a ph attribute.")
    if _PHONEME_FORBIDDEN & set(phonemes):
        raise _invalid(
            f"Invalid <phoneme> ph {_shown(phonemes)!r}: "
            "it may not contain '/', ')', '[', ']' or a line break."
        )
    return phonemes


def _sub(element: ET.Element, context: _Context, output: _Output) -> None:
    alias = element.get("alias")
    if alias is None:
        raise _invalid("The SSML <sub> element needs an alias attribute.")
    output.add_text(alias, context)


def _say_as(element: ET.Element, context: _Context, output: _Output) -> None:
    content = _collapse(_content(element)).strip()
    reader = _SAY_AS.get(element.get("interpret-as", ""), _as_is)
    output.add_text(reader(content), context)


def _as_is(content: str) -> str:
    return content


def _cardinal(content: str) -> str:
    number = content.replace(",", "")
    if not _INTEGER.fullmatch(number):
        return content
    # num2words reads British "two hundred and thirty-four"; American readers drop the "and".
    return str(num2words(int(number))).replace(" and ", " ")


def _ordinal(content: str) -> str:
    number = content.replace(",", "")
    if not _INTEGER.fullmatch(number) or int(number) < 0:
        return content
    return str(num2words(int(number), to="ordinal")).replace(" and ", " ")


def _characters(content: str) -> str:
    # Upper case so a lone "a" is read as the letter, not the article.
    return " ".join(char.upper() for char in content if char.isalnum())


def _digits(content: str) -> str:
    return " ".join(_DIGIT_WORDS[int(char)] for char in content if char.isdecimal())


def _nothing(element: ET.Element, context: _Context, output: _Output) -> None:
    """Elements that say nothing themselves (a mark, an audio description); their tails still are."""


def _content(element: ET.Element) -> str:
    return "".join(element.itertext())


def _collapse(text: str) -> str:
    return _WHITESPACE.sub(" ", text)


def _local_name(tag: str) -> str:
    return tag.rpartition("}")[2]


def _shown(value: str) -> str:
    return value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="input", code="invalid_ssml")


def _script(runs: list[_Run]) -> SsmlScript:
    # Each run is one segment: runs never hold only whitespace, neighbours always differ in voice or
    # rate, and the first piece lost its leading whitespace when it was added (see _Output).
    texts = ["".join(run.parts) for run in runs]
    segments = []
    position = 0
    for run, run_text in zip(runs, texts, strict=True):
        start = position + len(run_text) - len(run_text.lstrip())
        end = position + len(run_text.rstrip())
        segments.append(SsmlSegment(start, end, run.context.voice, run.context.rate))
        position += len(run_text)
    return SsmlScript("".join(texts).rstrip(), tuple(segments))


_HANDLERS: dict[str, Callable[[ET.Element, _Context, _Output], None]] = {
    "p": _sentence(2),
    "s": _sentence(1),
    "break": _break,
    "prosody": _prosody,
    "voice": _voice,
    "phoneme": _phoneme,
    "sub": _sub,
    "say-as": _say_as,
    "mark": _nothing,
    "desc": _nothing,
}
_SAY_AS: dict[str, Callable[[str], str]] = {
    "cardinal": _cardinal,
    "number": _cardinal,
    "ordinal": _ordinal,
    "characters": _characters,
    "spell-out": _characters,
    "digits": _digits,
}
