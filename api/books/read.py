"""Books in, chapters of plain text out: plain text (one chapter), Markdown (its headings), EPUB (its spine
in reading order, its table of contents for the chapters and their titles).

An EPUB is a zip of XML: before ebooklib opens it, its members are checked against a zip bomb (sizes
and counts as declared, which is as far as zipfile ever inflates a member), its XML against entity
and external-reference tricks (defusedxml), and its META-INF against DRM. Anything wrong is a
BookError with a message for the user; nothing is written before a book has been read whole.
"""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ebooklib
import lxml.html
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as defused_fromstring
from ebooklib import epub
from lxml import etree
from markdown_it import MarkdownIt
from markdown_it.token import Token

# What a zip may hold before it is refused as a zip bomb (sizes as its directory declares them).
MAX_EPUB_MEMBERS = 10_000
MAX_EPUB_UNPACKED_BYTES = 512 * 1024 * 1024
_XML_SUFFIXES = (".xml", ".opf", ".ncx", ".xhtml", ".html", ".htm")
# META-INF/encryption.xml may only obfuscate fonts (IDPF's and Adobe's schemes); anything else is DRM.
_FONT_OBFUSCATION = frozenset({"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"})
_ENCRYPTION_NS = "http://www.w3.org/2001/04/xmlenc#"
_DRM_MEMBERS = frozenset({"META-INF/rights.xml"})
_DRM_FREE = "only DRM-free books can be read"
_BLOCK_TAGS = frozenset(
    {"p", "div", "li", "blockquote", "br", "tr", "section", "article", "aside", "header", "footer", "pre"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "figcaption", "table", "ul", "ol", "hr"}
)
_SKIPPED_TAGS = ("script", "style", "head", "nav", "rt", "rp")
_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_BLANK_LINES = re.compile(r"\n\s*\n")
_SPACES = re.compile(r"\s+")


class BookError(ValueError):
    """A book that cannot be read: the message says why, for the user."""


@dataclass(frozen=True)
class Chapter:
    title: str
    text: str  # paragraphs separated by blank lines
    heading: str = ""  # a heading that is not in `text` and is read before it (Markdown's)


@dataclass(frozen=True)
class Book:
    title: str
    chapters: tuple[Chapter, ...]

    @property
    def characters(self) -> int:
        return sum(len(chapter.text) for chapter in self.chapters)


def read_book(data: bytes, filename: str, *, title: str | None = None) -> Book:
    """The book in `data`, its kind told by `filename`'s suffix (.txt, .md/.markdown, .epub)."""
    suffix = posixpath.splitext(filename.lower())[1]
    if suffix == ".epub":
        return read_epub(data, title=title)
    text = _decoded(data, filename)
    if suffix in (".md", ".markdown"):
        return read_markdown(text, title=title)
    if suffix in (".txt", ".text", ""):
        return read_text(text, title=title)
    raise BookError(f"'{filename}' is not a book this server reads: send a .txt, .md or .epub file.")


def read_text(text: str, *, title: str | None = None) -> Book:
    """Plain text: one chapter."""
    body = _paragraphs(text.split("\n\n"))
    return _book(title or "Text", [Chapter(title or "Text", body)])


def read_markdown(text: str, *, title: str | None = None) -> Book:
    """Markdown: a chapter per heading of the highest level used more than once (a single top heading
    at the start is the book's title); text before the first such heading is a chapter of its own."""
    tokens = MarkdownIt("commonmark").parse(text)
    headings = [
        (int(token.tag[1]), index) for index, token in enumerate(tokens) if token.type == "heading_open"
    ]
    levels = sorted({level for level, _ in headings})
    book_title = title
    split_level = levels[0] if levels else 0
    if levels and sum(level == levels[0] for level, _ in headings) == 1 and headings[0][1] == 0:
        book_title = book_title or _inline_text(tokens[1])
        split_level = levels[1] if len(levels) > 1 else 0
        tokens = tokens[3:]
    chapters: list[Chapter] = []
    chapter_title, title_next = "", False
    paragraphs: list[str] = []
    for token in tokens:  # code blocks are not inline tokens: they are not read aloud
        if token.type == "heading_open" and int(token.tag[1]) == split_level:
            chapters.append(Chapter(chapter_title, _paragraphs(paragraphs), heading=chapter_title))
            paragraphs, title_next = [], True
        elif token.type == "inline" and title_next:
            chapter_title, title_next = _inline_text(token), False
        elif token.type == "inline":
            paragraphs.append(_inline_text(token))
    chapters.append(Chapter(chapter_title, _paragraphs(paragraphs), heading=chapter_title))
    return _book(book_title or chapters[0].title or "Text", _titled(chapters))


def read_epub(data: bytes, *, title: str | None = None) -> Book:
    """An EPUB 2 or 3: its spine in reading order, cut into chapters where its table of contents points
    (at a document; a document the contents skip joins the chapter before it)."""
    _check_zip(data)
    try:
        book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": False})
    except (epub.EpubException, KeyError, zipfile.BadZipFile, etree.LxmlError, IndexError) as exc:
        raise BookError(f"The EPUB could not be read: {exc}") from exc
    metadata = book.get_metadata("DC", "title")
    book_title = title or (metadata[0][0].strip() if metadata and metadata[0][0] else "") or "Book"
    starts = _toc_starts(book.toc)
    chapters: list[Chapter] = []
    chapter_title: str | None = book_title  # what comes before the contents' first entry: front matter
    texts: list[str] = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
            continue
        text, heading = _document_text(item.get_content())
        name = posixpath.normpath(item.get_name())
        if name in starts or (not starts and text):
            if texts:
                chapters.append(Chapter(chapter_title or "", _paragraphs(texts)))
            chapter_title, texts = starts.get(name) or heading, []
        texts.append(text)
    if texts:
        chapters.append(Chapter(chapter_title or "", _paragraphs(texts)))
    return _book(book_title, _titled(chapters))


def _book(title: str, chapters: Iterable[Chapter]) -> Book:
    spoken = tuple(chapter for chapter in chapters if chapter.text.strip())
    if not spoken:
        raise BookError("The book contains no text to speak.")
    return Book(" ".join(title.split()), spoken)


def _titled(chapters: Sequence[Chapter]) -> list[Chapter]:
    """Chapters without a title get 'Chapter N' (N counts the chapters with text)."""
    titled, number = [], 0
    for chapter in chapters:
        if not chapter.text.strip():
            continue
        number += 1
        title = " ".join(chapter.title.split())
        heading = title if chapter.heading else ""
        titled.append(Chapter(title or f"Chapter {number}", chapter.text, heading))
    return titled


def _paragraphs(texts: Iterable[str]) -> str:
    paragraphs = (_SPACES.sub(" ", part).strip() for text in texts for part in _BLANK_LINES.split(text))
    return "\n\n".join(paragraph for paragraph in paragraphs if paragraph)


def _decoded(data: bytes, filename: str) -> str:
    for encoding in ("utf-8-sig", "utf-16"):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        if "\x00" not in text:
            return text.replace("\r\n", "\n").replace("\r", "\n")
    raise BookError(f"'{filename}' is not UTF-8 (or UTF-16) text.")


def _inline_text(token: Token) -> str:
    """The words of a Markdown inline token: text, code spans and link text; images' alt text is not read."""
    parts = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return "".join(parts)


def _check_zip(data: bytes) -> None:
    """Refuses what is not a zip, a zip bomb, DRM, and XML with entity declarations or external references."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise BookError("The file is not an EPUB: an EPUB is a zip archive, and this is not one.") from exc
    with archive:
        members = archive.infolist()
        if len(members) > MAX_EPUB_MEMBERS:
            raise BookError(f"The EPUB holds {len(members)} files; the limit is {MAX_EPUB_MEMBERS}.")
        unpacked = sum(member.file_size for member in members)
        if unpacked > MAX_EPUB_UNPACKED_BYTES:
            raise BookError(
                f"The EPUB unpacks to {unpacked} bytes; the limit is {MAX_EPUB_UNPACKED_BYTES} (a zip bomb?)."
            )
        names = {member.filename for member in members}
        if names & _DRM_MEMBERS:
            raise BookError(
                "The EPUB is DRM-protected (META-INF/rights.xml): only DRM-free books can be read."
            )
        for member in members:
            if member.filename.lower().endswith(_XML_SUFFIXES):
                _check_xml(member.filename, _read_member(archive, member))
        if "META-INF/encryption.xml" in names:
            _check_encryption(archive.read("META-INF/encryption.xml"))


def _read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> bytes:
    try:
        return archive.read(member)
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError) as exc:
        raise BookError(f"The EPUB's '{member.filename}' cannot be unpacked: {exc}") from exc


def _check_xml(name: str, content: bytes) -> None:
    try:
        defused_fromstring(content, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as exc:
        raise BookError(
            f"The EPUB's '{name}' declares XML entities or external references, which are refused."
        ) from exc
    except Exception:  # noqa: BLE001 - malformed XML is ebooklib's and lxml's to recover from, or refuse
        return


def _check_encryption(content: bytes) -> None:
    root = defused_fromstring(content)
    for method in root.iter(f"{{{_ENCRYPTION_NS}}}EncryptionMethod"):
        if method.get("Algorithm") not in _FONT_OBFUSCATION:
            raise BookError(
                "The EPUB is DRM-protected (its content is encrypted): only DRM-free books can be read."
            )


def _toc_starts(toc: Any) -> dict[str, str]:
    """Document name -> the title of the first contents entry that points into it."""
    starts: dict[str, str] = {}
    for entry_title, href in _toc_entries(toc):
        name = posixpath.normpath(href.split("#", 1)[0])
        if name and name not in starts:
            starts[name] = entry_title
    return starts


def _toc_entries(toc: Any) -> Iterator[tuple[str, str]]:
    for entry in toc:
        if isinstance(entry, tuple | list):
            section, children = entry[0], entry[1]
            if getattr(section, "href", ""):
                yield section.title or "", section.href
            yield from _toc_entries(children)
        elif getattr(entry, "href", ""):
            yield entry.title or "", entry.href


def _document_text(content: bytes) -> tuple[str, str]:
    """A content document's text (a blank line between blocks) and its first heading."""
    if not content.strip():
        return "", ""
    try:
        root = lxml.html.document_fromstring(content)
    except (etree.ParserError, ValueError):
        return "", ""
    for element in list(root.iter(*_SKIPPED_TAGS)):
        element.drop_tree()
    heading = next((element.text_content() for element in root.iter(*_HEADING_TAGS)), "")
    for element in root.iter():
        if isinstance(element.tag, str) and element.tag.lower() in _BLOCK_TAGS:
            element.tail = "\n\n" + (element.tail or "")
    body = root.find("body")
    text = (body if body is not None else root).text_content()
    return text, " ".join(heading.split())
