"""`python -m api.weights fetch|verify`: put the Kokoro-82M weights in place, or check the ones there."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from api.settings import Settings
from api.weights.base import WeightsSource
from api.weights.hub import CHECKPOINT_SHA256
from api.weights.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    OFFICIAL_VOICES,
    HashMismatchError,
    WeightsLayout,
    config_differences,
    load_config,
    load_voice_pack,
    sha256_file,
    shipped_config,
)
from api.weights.sources import SOURCE_CHOICES, get_source

logger = logging.getLogger(__name__)

EXISTING_WEIGHTS_HINT = "To use weights you already have, point KOKORO_WEIGHTS_DIR (or --dir) at them."

DIR_HELP = "Weights directory (default: KOKORO_WEIGHTS_DIR, else the server's default)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m api.weights", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="Fetch and verify the weights (skipped when already complete).")
    fetch.add_argument("--source", choices=SOURCE_CHOICES, help="Where to fetch from (default: settings).")
    fetch.add_argument("--dir", type=Path, help=DIR_HELP)
    fetch.add_argument("--force", action="store_true", help="Fetch even when the directory is complete.")
    verify = commands.add_parser("verify", help="Check the layout, every voice pack and the checkpoint hash.")
    verify.add_argument("--dir", type=Path, help=DIR_HELP)
    return parser


def main(
    argv: list[str] | None = None, *, source_factory: Callable[[str], WeightsSource] = get_source
) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings()
    root: Path = args.dir if args.dir is not None else settings.weights_dir
    if args.command == "fetch":
        source_name: str = args.source or settings.weights_source
        return fetch(root, source_name, force=args.force, source_factory=source_factory)
    return verify(root)


def fetch(
    root: Path, source_name: str, *, force: bool, source_factory: Callable[[str], WeightsSource] = get_source
) -> int:
    layout = WeightsLayout(root)
    if layout.is_complete() and not force:
        print(f"Weights already complete in {root} ({len(layout.voice_names())} voices); nothing fetched.")
        print("Use --force to fetch them again.")
        return 0
    try:
        source_factory(source_name).fetch(root, progress=True)
    except ConnectionError as exc:
        return _fail(f"{str(exc).rstrip('.')}. {EXISTING_WEIGHTS_HINT}")
    except (HashMismatchError, ValueError, OSError) as exc:
        return _fail(str(exc))
    if not layout.is_complete():
        return _fail(f"source {source_name!r} left {root} incomplete, missing: {', '.join(layout.missing())}")
    print(
        f"Fetched Kokoro-82M from {source_name} into {root}: {CONFIG_FILE}, {CHECKPOINT_FILE} and "
        f"{len(layout.voice_names())} voices."
    )
    return 0


def verify(root: Path) -> int:
    layout = WeightsLayout(root)
    missing = layout.missing()
    if missing:
        return _fail(f"{root} is incomplete, missing: {', '.join(missing)}")
    problems = [*_config_problems(layout), *_voice_problems(layout)]
    _report_checkpoint(layout)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        return _fail(f"{root}: {len(problems)} problem(s) found")
    print(f"OK: {root} holds a usable weights layout.")
    return 0


def _config_problems(layout: WeightsLayout) -> list[str]:
    try:
        config = load_config(layout.config_path)
    except (ValueError, OSError) as exc:
        return [f"{layout.config_path}: not readable JSON ({_one_line(str(exc))})"]
    if not isinstance(config, dict):
        return [f"{layout.config_path}: not a JSON object"]
    differing = config_differences(config, shipped_config())
    if differing:
        print(f"{CONFIG_FILE}: differs from the Kokoro-82M v1.0 config in {', '.join(differing)}")
    else:
        print(f"{CONFIG_FILE}: matches the Kokoro-82M v1.0 config")
    return []


def _voice_problems(layout: WeightsLayout) -> list[str]:
    names = layout.voice_names()
    problems: list[str] = []
    for name in names:
        try:
            load_voice_pack(layout.voice_path(name), name)
        except Exception as exc:  # any failure to load means an unusable pack
            problems.append(f"{layout.voice_path(name)}: {_one_line(str(exc))}")
    official = len(set(names) & set(OFFICIAL_VOICES))
    print(
        f"voices: {len(names) - len(problems)} of {len(names)} usable "
        f"({official} of the {len(OFFICIAL_VOICES)} official voices present)"
    )
    return problems


def _report_checkpoint(layout: WeightsLayout) -> None:
    digest = sha256_file(layout.checkpoint_path)
    if digest == CHECKPOINT_SHA256:
        print(f"{CHECKPOINT_FILE}: the official Kokoro-82M v1.0 checkpoint (sha256 {digest})")
    else:
        print(f"{CHECKPOINT_FILE}: not the official Kokoro-82M v1.0 checkpoint (sha256 {digest})")


def _fail(message: str) -> int:
    print(f"error: {_one_line(message)}", file=sys.stderr)
    return 1


def _one_line(text: str) -> str:
    return " ".join(text.split())
