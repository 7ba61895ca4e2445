"""Where weights come from: the WeightsSource protocol and the registry of named sources."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class SourceUnavailableError(ConnectionError):
    """A source could not be reached (no network, server error, offline mode)."""


class WeightsSource(Protocol):
    """Something that can write a complete weights layout (see layout.py) into a directory.

    `fetch` verifies every file before putting it in place and writes each one atomically, so an
    interrupted or rejected fetch leaves only whole, verified files behind.
    """

    name: str

    def fetch(self, dest: Path, *, progress: bool = True) -> None: ...


SourceFactory = Callable[[], WeightsSource]


def _hub_source() -> WeightsSource:
    # Imported here so that listing or choosing sources does not import huggingface_hub.
    from api.weights.hub import HubSource

    return HubSource()


SOURCES: dict[str, SourceFactory] = {"hub": _hub_source}


def get_source(name: str) -> WeightsSource:
    """Build the source registered under `name`; ValueError for unknown names."""
    try:
        factory = SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise ValueError(f"unknown weights source {name!r} (known: {known})") from None
    return factory()
