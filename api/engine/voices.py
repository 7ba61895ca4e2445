"""Voice packs: listing the store, parsing mixes like `af_bella(2)+af_sky(1)` or `a-b`, caching results."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from api.errors import InvalidRequestError

PACK_ROWS = 510
STYLE_DIM = 256
# A term of a mix: a name, then an optional weight in parentheses.
_TERM = re.compile(r"\s*([A-Za-z0-9_.]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*")
_MAX_TERMS = 16
_MAX_CACHED = 256


@dataclass(frozen=True)
class VoiceTerm:
    name: str
    weight: float  # negative for a subtracted voice


def parse_voice_spec(spec: str) -> list[VoiceTerm]:
    """Parse `a`, `a(2)+b(1)`, `a-b`; names are looked up later, never used as paths."""
    terms: list[VoiceTerm] = []
    sign = 1.0
    position = 0
    while True:
        match = _TERM.match(spec, position)
        if not match or not match.group(1):
            raise InvalidRequestError(f"Cannot parse voice '{spec}'.", param="voice", code="invalid_voice")
        weight = float(match.group(2)) if match.group(2) else 1.0
        terms.append(VoiceTerm(match.group(1), sign * weight))
        position = match.end()
        if position == len(spec):
            break
        if spec[position] not in "+-" or len(terms) >= _MAX_TERMS:
            raise InvalidRequestError(f"Cannot parse voice '{spec}'.", param="voice", code="invalid_voice")
        sign = 1.0 if spec[position] == "+" else -1.0
        position += 1
    return terms


def mix_packs(packs: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Weighted sum normalized by the added (positive) weights: (2a + b) / 3, and a - b stays a - b."""
    positive = sum(w for w in weights if w > 0)
    if positive <= 0:
        raise InvalidRequestError("A voice mix needs a positive weight.", param="voice", code="invalid_voice")
    mixed = sum(w * p for w, p in zip(weights, packs, strict=True)) / positive
    return np.asarray(mixed, dtype=np.float32)


class VoiceStore:
    """The voices in a weights directory: lists them, loads packs once, resolves and caches mixes."""

    def __init__(self, voices_dir: Path, aliases: Mapping[str, str] | None = None) -> None:
        self.voices_dir = voices_dir
        self.aliases = dict(aliases or {})
        self._packs: dict[str, np.ndarray] = {}
        self._names: list[str] = []
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        # The store is fixed once the weights are in place; until then (still fetching) look again.
        if not self._names and self.voices_dir.is_dir():
            self._names = sorted(path.stem for path in self.voices_dir.glob("*.pt"))
        return self._names

    def resolve(self, spec: str) -> np.ndarray:
        """The (510, 256) float32 pack for a voice or a mix; InvalidRequestError names unknown voices."""
        with self._lock:
            cached = self._packs.get(spec)
        if cached is not None:
            return cached
        terms = parse_voice_spec(spec)
        packs = [self._load(self._canonical(term.name)) for term in terms]
        pack = packs[0] if len(terms) == 1 else mix_packs(packs, [term.weight for term in terms])
        with self._lock:
            if len(self._packs) >= _MAX_CACHED:
                self._packs.clear()
            self._packs[spec] = pack
        return pack

    def canonical_names(self, spec: str) -> list[str]:
        """The store names a spec refers to (aliases resolved), in order."""
        return [self._canonical(term.name) for term in parse_voice_spec(spec)]

    def _canonical(self, name: str) -> str:
        name = self.aliases.get(name, name)
        available = self.names()
        if name not in available:
            sample = ", ".join(available[:8]) + (", ..." if len(available) > 8 else "")
            raise InvalidRequestError(
                f"Voice '{name}' not found. Available voices include: {sample}. "
                "GET /v1/audio/voices lists them all.",
                param="voice",
                code="voice_not_found",
            )
        return name

    def _load(self, name: str) -> np.ndarray:
        # `name` is one of names(), i.e. an existing file's stem in voices_dir: never a caller's path.
        with self._lock:
            if name in self._packs:
                return self._packs[name]
        tensor = torch.load(self.voices_dir / f"{name}.pt", map_location="cpu", weights_only=True)
        pack: np.ndarray = tensor.detach().to(torch.float32).reshape(PACK_ROWS, STYLE_DIM).numpy().copy()
        with self._lock:
            self._packs[name] = pack
        return pack


def style_for(pack: np.ndarray, num_tokens: int) -> np.ndarray:
    """The pack's row for a chunk of `num_tokens` phoneme tokens (the library's pack[len - 1])."""
    row: np.ndarray = pack[min(max(num_tokens, 1), PACK_ROWS) - 1]
    return row
