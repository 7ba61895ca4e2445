"""Pause tags: `[pause:1.5s]` (or `[pause:500ms]`) in the input becomes exact silence."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PAUSE_S = 10.0
_PAUSE = re.compile(r"\[pause:\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*\]", re.IGNORECASE)


@dataclass(frozen=True)
class Pause:
    seconds: float


def split_pauses(text: str) -> list[str | Pause]:
    """Text and pauses in order; each pause is bounded by MAX_PAUSE_S; empty text pieces are dropped."""
    parts: list[str | Pause] = []
    position = 0
    for match in _PAUSE.finditer(text):
        parts.append(text[position : match.start()])
        value = float(match.group(1)) / (1000.0 if match.group(2).lower() == "ms" else 1.0)
        parts.append(Pause(min(value, MAX_PAUSE_S)))
        position = match.end()
    parts.append(text[position:])
    return [part for part in parts if isinstance(part, Pause) or part.strip()]
