"""Every relative link in docs/ and README.md reaches a file that exists, and its #anchor a heading there."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6} (.+?)#*\s*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a (?:id|name)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    text = FENCE.sub("", markdown)
    found: set[str] = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        name, n = base, 1
        while name in found:
            name, n = f"{base}-{n}", n + 1
        found.add(name)
    return found


def links(markdown: str) -> list[str]:
    return [a or b for a, b in LINK.findall(INLINE_CODE.sub("", FENCE.sub("", markdown)))]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target} (no such anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_slug_follows_github() -> None:
    assert slug("24. tcmalloc (2026-11-27, a later session)") == "24-tcmalloc-2026-11-27-a-later-session"
    assert slug("2. Threads × replicas, the server") == "2-threads--replicas-the-server"
    assert slug("The `KOKORO_ENGINE` setting") == "the-kokoro_engine-setting"


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Two words\n\n```\n## not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#two-words) [ok](a.md) [ok](#here) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [bad](a.md#not-a-heading) [bad](#nowhere) `[code](not/a/link)`\n\n## Here\n"
    )
    assert broken_links(page) == [
        "missing.md (no such file)",
        "a.md#not-a-heading (no such anchor)",
        "#nowhere (no such anchor)",
    ]


# A file of ours named in prose or code (`api/speech/encoding.py`), outside the journal, which records the
# layout of its day.
NAMED_FILE = re.compile(
    r"(?<![\w./-])((?:api|scripts|tests|docker|deploy)/[\w/.-]+\.(?:py|sh|md|yaml|json|conf))(?![\w.])"
)
CURRENT_PAGES = [page for page in PAGES if "journal" not in page.parts]


def named_files(text: str) -> set[str]:
    return set(NAMED_FILE.findall(text))


@pytest.mark.parametrize("page", CURRENT_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_files_named_in_the_docs_exist(page: Path) -> None:
    missing = sorted(name for name in named_files(page.read_text()) if not (ROOT / name).exists())
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


def test_files_named_in_the_code_exist() -> None:
    sources = [*ROOT.glob("api/**/*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("tests/**/*.py")]
    missing = {
        f"{source.relative_to(ROOT)}: {name}"
        for source in sources
        for name in named_files(source.read_text())
        if not (ROOT / name).exists() and source.name != "test_docs_links.py"
    }
    assert not missing, sorted(missing)


def test_a_moved_file_is_found() -> None:
    assert named_files("the scheduler (`api/engine/scheduler.py`), see docs/x.md") == {
        "api/engine/scheduler.py"
    }
