"""Voice packs: listing the store (built-in and custom voices), parsing mixes like `af_bella(2)+af_sky(1)`
or `a-b`, caching results."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api.engine.voice_files import (
    PACK_ROWS,
    STYLE_DIM,
    VOICE_NAME,
    pack_bytes,
    read_voice_file,
    write_atomically,
)
from api.errors import InvalidRequestError, NotFoundError

# A custom voice file's identity: inode, modification time (ns), size. A replacement (os.replace) is a
# new inode.
Stamp = tuple[int, int, int]
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


def mix_packs(packs: list[np.ndarray[Any, Any]], weights: list[float]) -> np.ndarray[Any, Any]:
    """Weighted sum normalized by the added (positive) weights: (2a + b) / 3, and a - b stays a - b."""
    positive = sum(w for w in weights if w > 0)
    if positive <= 0:
        raise InvalidRequestError("A voice mix needs a positive weight.", param="voice", code="invalid_voice")
    mixed = sum(w * p for w, p in zip(weights, packs, strict=True)) / positive
    return np.asarray(mixed, dtype=np.float32)


class VoiceStore:
    """The voices: the built-in packs of the weights directory and, when `custom_dir` is set, the voices
    users saved there. Loads packs once, resolves and caches mixes.

    Worker processes each have a store over the same custom directory, so a custom voice is looked up on
    disk at each use (one stat per custom term): a voice saved or deleted by any worker is served, or
    refused, by every worker at its next request. A custom pack, and a mix with custom terms, is cached
    under its file's identity (inode, mtime, size): a file replaced under the same name is read again.
    """

    def __init__(
        self, voices_dir: Path, aliases: Mapping[str, str] | None = None, custom_dir: Path | None = None
    ) -> None:
        self.voices_dir = voices_dir
        self.custom_dir = custom_dir
        self.aliases = dict(aliases or {})
        self._packs: dict[str, np.ndarray[Any, Any]] = {}  # built-in packs, by name
        self._custom: dict[str, tuple[Stamp, np.ndarray[Any, Any]]] = {}
        self._mixes: dict[tuple[str, tuple[Stamp | None, ...]], np.ndarray[Any, Any]] = {}
        self._builtin: list[str] = []
        self._lock = threading.Lock()

    def builtin_names(self) -> list[str]:
        # Fixed once the weights are in place; until then (still fetching) look again.
        if not self._builtin and self.voices_dir.is_dir():
            self._builtin = sorted(path.stem for path in self.voices_dir.glob("*.pt"))
        return self._builtin

    def custom_names(self) -> list[str]:
        """The voices saved in the custom directory now (a built-in name there is not one: it is shadowed)."""
        if self.custom_dir is None or not self.custom_dir.is_dir():
            return []
        builtin = set(self.builtin_names())
        stems = (path.stem for path in self.custom_dir.glob("*.pt"))
        return sorted(stem for stem in stems if VOICE_NAME.fullmatch(stem) and stem not in builtin)

    def names(self) -> list[str]:
        return sorted([*self.builtin_names(), *self.custom_names()])

    def is_builtin(self, name: str) -> bool:
        return self.aliases.get(name, name) in self.builtin_names()

    def resolve(self, spec: str) -> np.ndarray[Any, Any]:
        """The (510, 256) float32 pack for a voice or a mix; InvalidRequestError names unknown voices."""
        terms = parse_voice_spec(spec)
        sources = [self._source(term.name) for term in terms]
        key = (spec, tuple(stamp for _, stamp in sources))
        with self._lock:
            cached = self._mixes.get(key)
        if cached is not None:
            return cached
        packs = [self._load(name, stamp) for name, stamp in sources]
        pack = packs[0] if len(terms) == 1 else mix_packs(packs, [term.weight for term in terms])
        with self._lock:
            _bounded_put(self._mixes, key, pack)
        return pack

    def canonical_names(self, spec: str) -> list[str]:
        """The store names a spec refers to (aliases resolved), in order."""
        return [self._source(term.name)[0] for term in parse_voice_spec(spec)]

    def save(self, name: str, pack: np.ndarray[Any, Any]) -> None:
        """Writes a custom voice (atomically; replacing one of that name); the caller checked the name."""
        directory = self._writable_dir()
        write_atomically(directory / f"{name}.pt", pack_bytes(pack))

    def delete(self, name: str) -> None:
        """Removes a custom voice; NotFoundError when there is none of that name."""
        directory = self._writable_dir()
        try:
            if VOICE_NAME.fullmatch(name) is None:
                raise FileNotFoundError(name)
            (directory / f"{name}.pt").unlink()
        except FileNotFoundError:
            raise NotFoundError(
                f"There is no custom voice '{name}'.", param="name", code="voice_not_found"
            ) from None

    def _writable_dir(self) -> Path:
        if self.custom_dir is None:
            raise InvalidRequestError(
                "This server has no custom voices directory (KOKORO_CUSTOM_VOICES_DIR).",
                code="voice_uploads_disabled",
            )
        self.custom_dir.mkdir(parents=True, exist_ok=True)
        return self.custom_dir

    def _source(self, name: str) -> tuple[str, Stamp | None]:
        """The canonical name, and for a custom voice its file's stamp (None for a built-in one)."""
        name = self.aliases.get(name, name)
        if name in self.builtin_names():
            return name, None
        stamp = self._custom_stamp(name)
        if stamp is None:
            available = self.names()
            sample = ", ".join(available[:8]) + (", ..." if len(available) > 8 else "")
            raise InvalidRequestError(
                f"Voice '{name}' not found. Available voices include: {sample}. "
                "GET /v1/audio/voices lists them all.",
                param="voice",
                code="voice_not_found",
            )
        return name, stamp

    def _custom_stamp(self, name: str) -> Stamp | None:
        if self.custom_dir is None or VOICE_NAME.fullmatch(name) is None:
            return None  # never a caller's path: only Kokoro-scheme names are looked up
        try:
            stat = (self.custom_dir / f"{name}.pt").stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def _load(self, name: str, stamp: Stamp | None) -> np.ndarray[Any, Any]:
        if stamp is not None:
            return self._load_custom(name, stamp)
        # `name` is one of builtin_names(), i.e. an existing file's stem in voices_dir: never a caller's path.
        with self._lock:
            if name in self._packs:
                return self._packs[name]
        tensor = torch.load(self.voices_dir / f"{name}.pt", map_location="cpu", weights_only=True)
        pack: np.ndarray[Any, Any] = (
            tensor.detach().to(torch.float32).reshape(PACK_ROWS, STYLE_DIM).numpy().copy()
        )
        with self._lock:
            self._packs[name] = pack
        return pack

    def _load_custom(self, name: str, stamp: Stamp) -> np.ndarray[Any, Any]:
        with self._lock:
            cached = self._custom.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        assert self.custom_dir is not None
        try:
            data = (self.custom_dir / f"{name}.pt").read_bytes()
        except FileNotFoundError:  # deleted since its stat
            raise InvalidRequestError(
                f"Voice '{name}' not found (it was just deleted).", param="voice", code="voice_not_found"
            ) from None
        pack = read_voice_file(data)
        with self._lock:
            _bounded_put(self._custom, name, (stamp, pack))
        return pack


def _bounded_put(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value


def style_for(pack: np.ndarray[Any, Any], num_tokens: int) -> np.ndarray[Any, Any]:
    """The pack's row for a chunk of `num_tokens` phoneme tokens (the library's pack[len - 1])."""
    row: np.ndarray[Any, Any] = pack[min(max(num_tokens, 1), PACK_ROWS) - 1]
    return row
