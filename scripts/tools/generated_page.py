"""A page whose part between two markers is rendered from the code (docs/settings.md, docs/architecture.md):
the part replaced, and the command line that rewrites the page or, with --check, says it is stale."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def updated(page: str, begin: str, end: str, rendered: str, name: str) -> str:
    """`page` with the part from `begin` to `end` (markers included) replaced by `rendered`."""
    start, stop = page.find(begin), page.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{name} lacks its markers: {begin!r} ... {end!r}")
    return page[:start] + rendered + page[stop + len(end) :]


def main(
    argv: Sequence[str] | None,
    *,
    description: str,
    page: Path,
    command: str,
    update: Callable[[str], str],
) -> int:
    """Rewrites the page (`--page`, default `page`) with `update`; with --check writes nothing and exits 1
    when the page is stale."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale; write nothing")
    parser.add_argument("--page", type=Path, default=page)
    args = parser.parse_args(argv)
    text = args.page.read_text(encoding="utf-8")
    fresh = update(text)
    if args.check:
        if fresh != text:
            print(f"{args.page} is stale: run `{command}`")
            return 1
        return 0
    args.page.write_text(fresh, encoding="utf-8")
    print(f"wrote {args.page}")
    return 0
