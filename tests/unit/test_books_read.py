"""Reading books: plain text, Markdown's headings, EPUB's spine and contents; and what is refused."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from api.books.read import (
    MAX_EPUB_MEMBERS,
    MAX_EPUB_UNPACKED_BYTES,
    BookError,
    read_book,
    read_markdown,
    read_text,
)

BOOKS = Path(__file__).resolve().parents[1] / "data" / "books"
ALICE_CHAPTERS = [
    "Chapter I. Down the Rabbit-Hole",
    "Chapter II. The Pool of Tears",
    "Chapter III. A Caucus-Race and a Long Tale",
]


def test_plain_text_is_one_chapter_of_paragraphs() -> None:
    book = read_text("First  line\nstill first.\n\n\nSecond.\r\n", title="Notes")
    assert book.title == "Notes"
    assert [chapter.title for chapter in book.chapters] == ["Notes"]
    assert book.chapters[0].text == "First line still first.\n\nSecond."
    assert book.chapters[0].heading == ""  # not read aloud: it is not the book's


def test_markdown_splits_at_the_repeated_heading_level_and_reads_headings() -> None:
    book = read_markdown((BOOKS / "alice.md").read_text())
    assert book.title == "Alice's Adventures in Wonderland"
    assert [chapter.title for chapter in book.chapters] == ALICE_CHAPTERS
    assert [chapter.heading for chapter in book.chapters] == ALICE_CHAPTERS
    assert book.chapters[1].text.startswith('"Curiouser and curiouser!" cried Alice')
    assert "\n\nSo she was considering" in book.chapters[0].text


def test_markdown_leaves_out_code_and_keeps_lower_headings_as_text() -> None:
    book = read_markdown(
        "Intro.\n\n# One\n\nA `b` c.\n\n```\nnot read\n```\n\n## Sub\n\nMore.\n\n# Two\n\n- x\n- y\n"
    )
    assert [(chapter.title, chapter.text) for chapter in book.chapters] == [
        ("Chapter 1", "Intro."),
        ("One", "A b c.\n\nSub\n\nMore."),
        ("Two", "x\n\ny"),
    ]


def test_the_sample_epub_reads_as_its_contents_say() -> None:
    book = read_book((BOOKS / "alice.epub").read_bytes(), "alice.epub")
    assert book.title == "Alice's Adventures in Wonderland"
    # The title page comes before the contents' first entry: front matter under the book's title.
    assert [chapter.title for chapter in book.chapters] == [book.title, *ALICE_CHAPTERS]
    assert book.chapters[2].text.startswith('Chapter II. The Pool of Tears\n\n"Curiouser')
    assert all(chapter.heading == "" for chapter in book.chapters)  # the heading is in the text


def _epub(members: dict[str, bytes | str], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", compression=compression) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return data.getvalue()


def _with(extra: dict[str, bytes | str]) -> bytes:
    with zipfile.ZipFile(BOOKS / "alice.epub") as archive:
        members: dict[str, bytes | str] = {name: archive.read(name) for name in archive.namelist()}
    return _epub({**members, **extra})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not a zip at all", "not an EPUB"),
        (_epub({"mimetype": "application/epub+zip"}), "could not be read"),
        (_with({"META-INF/rights.xml": "<rights/>"}), "DRM-protected"),
        (
            _with(
                {
                    "META-INF/encryption.xml": '<encryption xmlns:enc="http://www.w3.org/2001/04/xmlenc#">'
                    '<enc:EncryptedData><enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
                    "</enc:EncryptedData></encryption>"
                }
            ),
            "DRM-protected",
        ),
        (
            _with(
                {
                    "EPUB/bomb.xhtml": '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
                    '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><l>&b;</l>'
                }
            ),
            "declares XML entities",
        ),
        (
            _with(
                {
                    "EPUB/ext.xhtml": '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                    "<l>&x;</l>"
                }
            ),
            "declares XML entities",
        ),
    ],
    ids=["not-zip", "no-container", "rights", "encrypted", "entities", "external"],
)
def test_bad_epubs_are_refused_with_the_reason(data: bytes, message: str) -> None:
    with pytest.raises(BookError, match=message):
        read_book(data, "book.epub")


def test_font_obfuscation_is_not_drm() -> None:
    encryption = (
        '<encryption xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
        '<enc:EncryptionMethod Algorithm="http://www.idpf.org/2008/embedding"/></enc:EncryptedData></encryption>'
    )
    assert len(read_book(_with({"META-INF/encryption.xml": encryption}), "a.epub").chapters) == 4


def test_a_zip_bomb_is_refused_before_it_is_inflated() -> None:
    # 600 MB of zeros deflate to about 600 KB: the declared sizes give it away.
    data = io.BytesIO()
    block = b"\0" * (1 << 20)
    with (
        zipfile.ZipFile(data, "w", compression=zipfile.ZIP_DEFLATED) as archive,
        archive.open("big.xhtml", "w", force_zip64=True) as member,
    ):
        for _ in range(MAX_EPUB_UNPACKED_BYTES // len(block) + 1):
            member.write(block)
    with pytest.raises(BookError, match="zip bomb"):
        read_book(data.getvalue(), "bomb.epub")


def test_too_many_members_are_refused() -> None:
    data = _epub(
        {f"f{index}.txt": "" for index in range(MAX_EPUB_MEMBERS + 1)}, compression=zipfile.ZIP_STORED
    )
    with pytest.raises(BookError, match="files; the limit"):
        read_book(data, "many.epub")


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (b"   \n\n  ", "empty.txt", "no text to speak"),
        (b"# Only a title\n", "title.md", "no text to speak"),
        (b"\xff\xfe\x00\xd8broken", "bad.txt", "not UTF-8"),
        (b"%PDF-1.7", "book.pdf", "send a .txt, .md or .epub"),
    ],
)
def test_empty_undecodable_or_unknown_files_are_refused(data: bytes, name: str, message: str) -> None:
    with pytest.raises(BookError, match=message):
        read_book(data, name)
