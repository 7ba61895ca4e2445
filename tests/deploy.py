"""Loads docker/render_nginx.py (a script in a folder that is not a package) for the tests that use it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_render_nginx() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_nginx", ROOT / "docker" / "render_nginx.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
