"""What a request's text says besides its words: who speaks and how fast. Inline `[voice:NAME]` tags or an
SSML document become one script: a text (what captions name) cut into parts, each spoken by one voice at
one rate. The rest (pauses, phonemes) stays in the text as inline markup for the layers below."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from api.text.ssml import looks_like_ssml, translate

InputFormat = Literal["auto", "text", "ssml"]
# `[voice:am_michael]`, `[voice:af_bella(2)+af_sky(1)]`, `[voice:alloy]`; `[voice:]` returns to the
# request's own voice.
VOICE_TAG = re.compile(r"\[voice:\s*([^\[\]\n]*?)\s*\]", re.IGNORECASE)


@dataclass(frozen=True)
class Part:
    """[start, end) of the script's text, spoken by `voice` (None: the request's) at `rate` x its speed."""

    start: int
    end: int
    voice: str | None = None
    rate: float = 1.0


@dataclass(frozen=True)
class Script:
    text: str
    parts: tuple[Part, ...]
    ssml: bool = False

    @property
    def voices(self) -> set[str]:
        return {part.voice for part in self.parts if part.voice is not None}


def _looks_like_xml(text: str) -> bool:
    """SSML, or any XML document (a DTD before <speak> must reach the parser, which refuses it)."""
    return looks_like_ssml(text) or text.lstrip().startswith(("<?xml", "<!DOCTYPE"))


def read_script(text: str, *, input_format: InputFormat, voice_tags: bool, ssml: bool) -> Script:
    """The request's script: SSML when asked (or, with `ssml` on, detected), else text whose voice tags
    (when `voice_tags` is on) switch the speaker for what follows them."""
    if input_format == "ssml" or (input_format == "auto" and ssml and _looks_like_xml(text)):
        translated = translate(text)
        parts = tuple(Part(seg.start, seg.end, seg.voice, seg.rate) for seg in translated.segments)
        return Script(translated.text, parts, ssml=True)
    if not voice_tags:
        return Script(text, (Part(0, len(text)),))
    tagged: list[Part] = []
    start, voice = 0, None
    for tag in VOICE_TAG.finditer(text):
        tagged.append(Part(start, tag.start(), voice))
        start, voice = tag.end(), tag.group(1) or None
    tagged.append(Part(start, len(text), voice))
    return Script(text, tuple(part for part in tagged if text[part.start : part.end].strip()))
