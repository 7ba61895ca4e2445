"""Kokoro-82M weights: the directory layout, where to fetch it from, and the start-up check."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.weights.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    OFFICIAL_VOICES,
    VOICES_DIR,
    ConfigMismatchError,
    HashMismatchError,
    WeightsLayout,
    atomic_write,
    check_voice_pack,
    load_voice_pack,
    sha256_file,
)
from api.weights.sources import SOURCES, SourceFactory, SourceUnavailableError, WeightsSource, get_source

if TYPE_CHECKING:
    from collections.abc import Callable

    from api.settings import Settings

__all__ = [
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "OFFICIAL_VOICES",
    "SOURCES",
    "VOICES_DIR",
    "ConfigMismatchError",
    "HashMismatchError",
    "SourceFactory",
    "SourceUnavailableError",
    "WeightsLayout",
    "WeightsSource",
    "atomic_write",
    "check_voice_pack",
    "ensure_weights",
    "get_source",
    "load_voice_pack",
    "sha256_file",
]

logger = logging.getLogger(__name__)


def ensure_weights(
    settings: Settings, *, source_factory: Callable[[str], WeightsSource] = get_source
) -> WeightsLayout:
    """Return the complete layout in settings.weights_dir, fetching it first when allowed.

    Raises FileNotFoundError naming what is missing when fetching is off (or left the layout incomplete).
    """
    layout = WeightsLayout(settings.weights_dir)
    if layout.is_complete():
        return layout
    if not settings.fetch_weights:
        raise FileNotFoundError(
            f"weights in {layout.root} are incomplete, missing: {', '.join(layout.missing())}; "
            "set KOKORO_WEIGHTS_DIR to a directory that has them, or KOKORO_FETCH_WEIGHTS=true to fetch them"
        )
    logger.info("weights incomplete in %s; fetching from %s", layout.root, settings.weights_source)
    source_factory(settings.weights_source).fetch(layout.root, progress=True)
    if not layout.is_complete():
        raise FileNotFoundError(
            f"fetching from {settings.weights_source} left {layout.root} incomplete, "
            f"missing: {', '.join(layout.missing())}"
        )
    return layout
