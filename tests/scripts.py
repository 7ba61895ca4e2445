"""A script under scripts/ imported by its file's name, for the tests of the scripts."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/GROUP/NAME.py (or scripts/NAME.py) as module scripts.GROUP.NAME, the name the scripts
    import each other by."""
    (path,) = [*SCRIPTS.glob(f"{name}.py"), *SCRIPTS.glob(f"*/{name}.py")]
    parts = path.relative_to(SCRIPTS.parent).with_suffix("").parts
    return importlib.import_module(".".join(parts))
