"""What every weights source is: the WeightsSource protocol and the error for an unreachable source.

The sources (hub.py, registry.py) depend on this module only; sources.py names and builds them."""

from __future__ import annotations

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
