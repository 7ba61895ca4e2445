"""Build tests/data/books/alice.epub from alice.md: an EPUB 3 (ebooklib) with a title page the table of
contents leaves out, one XHTML document per chapter (its heading, its paragraphs), a nav document and an
NCX. Run it again after changing alice.md."""

from __future__ import annotations

import argparse
import html
from pathlib import Path

from ebooklib import epub

from api.books.read import read_markdown

BOOKS = Path(__file__).resolve().parents[2] / "tests" / "data" / "books"


def build(source: Path, output: Path) -> None:
    book_text = read_markdown(source.read_text())
    book = epub.EpubBook()
    book.set_identifier("kokoro-openai-server-sample-alice")
    book.set_title(book_text.title)
    book.set_language("en")
    book.add_author("Lewis Carroll")
    title_page = epub.EpubHtml(title="Title page", file_name="title.xhtml", lang="en")
    title_page.content = (
        f"<html><body><p>{html.escape(book_text.title)}</p><p>Lewis Carroll</p></body></html>"
    )
    book.add_item(title_page)
    chapters = []
    for number, chapter in enumerate(book_text.chapters, start=1):
        document = epub.EpubHtml(title=chapter.title, file_name=f"chapter-{number}.xhtml", lang="en")
        paragraphs = "".join(f"<p>{html.escape(text)}</p>" for text in chapter.text.split("\n\n"))
        document.content = f"<html><body><h1>{html.escape(chapter.title)}</h1>{paragraphs}</body></html>"
        book.add_item(document)
        chapters.append(document)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = [title_page, *chapters]
    epub.write_epub(str(output), book)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=BOOKS / "alice.md")
    parser.add_argument("--out", type=Path, default=BOOKS / "alice.epub")
    args = parser.parse_args()
    build(args.source, args.out)


if __name__ == "__main__":
    main()
