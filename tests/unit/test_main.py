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
        "from api.engine.allocator import preload_environment\n"
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


def test_macos_lets_the_apple_gpu_fall_back_to_the_cpu_before_torch_loads() -> None:
    environ: dict[str, str] = {}
    assert entry.allow_mps_fallback(environ, system="Darwin")
    assert environ == {entry.MPS_FALLBACK_ENV: "1"}
    chosen = {entry.MPS_FALLBACK_ENV: "0"}  # the user's own choice stays
    assert not entry.allow_mps_fallback(chosen, system="Darwin")
    assert chosen == {entry.MPS_FALLBACK_ENV: "0"}
    linux: dict[str, str] = {}
    assert not entry.allow_mps_fallback(linux, system="Linux")
    assert linux == {}


def test_setup_hashes_its_inputs_without_sha256sum() -> None:
    """macOS has no sha256sum: the stamp's hash comes from Python, the same digest's first 16 characters."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    script = (root / "scripts" / "setup.sh").read_text()
    assert "sha256sum" not in script.replace("no sha256sum", "")
    line = next(line for line in script.splitlines() if "hashlib.sha256" in line)
    command = line.strip().removeprefix("| ").replace('"$python"', sys.executable).removesuffix(")")
    out = subprocess.run(command, shell=True, input=b"kokoro", capture_output=True, check=True).stdout
    assert out.decode().strip() == hashlib.sha256(b"kokoro").hexdigest()[:16]
