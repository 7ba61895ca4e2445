"""Where weights come from: the named sources ("hub", "registry") and the "auto" choice between them."""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable

from api.weights.base import WeightsSource

logger = logging.getLogger(__name__)

HUB_ENDPOINT = "https://huggingface.co"
HUB_PROBE_TIMEOUT_S = 3.0


SourceFactory = Callable[[], WeightsSource]


def _hub_source() -> WeightsSource:
    # Imported here so that listing or choosing sources does not import huggingface_hub.
    from api.weights.hub import HubSource

    return HubSource()


def _registry_source() -> WeightsSource:
    from api.weights.registry import RegistrySource

    return RegistrySource()


SOURCES: dict[str, SourceFactory] = {"hub": _hub_source, "registry": _registry_source}
# "auto" is not a source of its own: it picks "hub" when the hub answers quickly, else "registry".
SOURCE_CHOICES = ("auto", *SOURCES)


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Whether the hub answers within `timeout` seconds, and why not when it does not."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False, "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", HUB_ENDPOINT).rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/hexgrad/Kokoro-82M", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True, "the hub answered"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"{endpoint} did not answer within {timeout:.0f} s ({exc})"


def resolve_source_name(name: str, probe: Callable[[], tuple[bool, str]] = hub_reachable) -> str:
    """The concrete source for a setting: "auto" becomes "hub" or "registry" (logged with the reason)."""
    if name != "auto":
        return name
    reachable, reason = probe()
    chosen = "hub" if reachable else "registry"
    logger.info("weights source auto -> %s: %s", chosen, reason)
    return chosen


def get_source(name: str) -> WeightsSource:
    """Build the source registered under `name` ("auto" resolved first); ValueError for unknown names."""
    try:
        factory = SOURCES[resolve_source_name(name) if name == "auto" else name]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise ValueError(f"unknown weights source {name!r} (known: {known})") from None
    return factory()
