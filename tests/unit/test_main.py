"""`python -m api`'s start: what it sets in the environment before the workers start."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

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


def test_the_allocator_is_chosen_before_torch_is_loaded(tmp_path: Path) -> None:
    """An allocator is the process's from its start: `python -m api` decides on it (and on the engine the
    workers will run, which that depends on) without importing torch."""
    probe = (
        "import sys, api.__main__\n"
        "from api.allocator import preload_environment\n"
        "from api.engine.choice import engine_at_start\n"
        "from api.settings import get_settings\n"
        "settings = get_settings()\n"
        "preload_environment(settings.allocator, {}, engine=engine_at_start(settings))\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "KOKORO_WEIGHTS_DIR": str(tmp_path), "KOKORO_DEVICE": "auto"}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
