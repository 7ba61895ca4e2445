"""`python -m api`'s start: what it sets in the environment before the workers start."""

from __future__ import annotations

import argparse
import os

import pytest

import api.__main__ as entry
from api.settings import Settings


@pytest.mark.parametrize("preset", [None, "256"])
def test_the_onednn_primitive_cache_is_bounded_unless_the_user_set_it(
    preset: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def serve(args: argparse.Namespace, settings: Settings) -> None:
        seen.append(os.environ.get(entry.ONEDNN_CACHE_ENV))

    monkeypatch.setattr(entry, "serve", serve)
    monkeypatch.setattr(entry, "configure_logging", lambda *args: None)  # the test process's logging stays
    # set first, so that the variable main() sets is removed again after the test
    monkeypatch.setenv(entry.ONEDNN_CACHE_ENV, "unset")
    if preset is None:
        monkeypatch.delenv(entry.ONEDNN_CACHE_ENV)
    else:
        monkeypatch.setenv(entry.ONEDNN_CACHE_ENV, preset)
    entry.main(["--port", "0"])
    assert seen == [preset or entry.ONEDNN_CACHE_DEFAULT]
