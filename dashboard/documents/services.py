"""Uploaded documents: plain text and Markdown only, checked by name and by content.

Services flush; the view commits. ``memory.changes`` requests the owner's build in the same
transaction as an upload or a deletion (whether the build reads documents at all is the
plan's business: ``docs.documents`` is off unless an administrator switches it on)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.documents.models import Document
from dashboard.holds import refuse_while_held
from dashboard.refusals import FieldError

DEFAULT_MAX_BYTES = 1024 * 1024
# By extension: what the name promises. The content must then bear it out (UTF-8, no NUL).
CONTENT_TYPES = {".txt": "text/plain", ".md": "text/markdown", ".markdown": "text/markdown"}
MAX_TITLE = 200
MAX_FILENAME = 255
PAGE_SIZE = 50
MAX_PAGE = 10_000
BOM = "\ufeff"


class DocumentError(FieldError):
    """An upload refused, with the form field it is about (the file, unless said)."""

    def __init__(self, message: str, field: str = "file") -> None:
        super().__init__(message, field)


def format_size(size: int) -> str:
    """1 MiB, 12.5 KiB, 300 bytes."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} byte{'' if size == 1 else 's'}"


def too_large_message(max_bytes: int) -> str:
    return (f"That file is too large: a document can be at most {format_size(max_bytes)}. "
            "Split it into smaller files, or upload only the part that matters.")


def _clean_filename(filename: str) -> str:
    # Browsers send a bare name, but some older ones sent the whole client path.
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name[-MAX_FILENAME:] if len(name) > MAX_FILENAME else name


def _content_type(filename: str) -> str:
    dot = filename.rfind(".")
    extension = filename[dot:].lower() if dot > 0 else ""
    if extension not in CONTENT_TYPES:
        raise DocumentError("Upload a plain-text or Markdown file: its name must end in .txt, "
                            ".md or .markdown.")
    return CONTENT_TYPES[extension]


def _text(data: bytes, max_bytes: int) -> str:
    if len(data) > max_bytes:
        raise DocumentError(too_large_message(max_bytes))
    if b"\x00" in data:
        raise DocumentError("That file is not text (it holds NUL bytes). Upload a plain-text or "
                            "Markdown file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError("That file is not UTF-8 text. Save it as UTF-8 and upload it "
                            "again.") from None
    text = text.removeprefix(BOM)
    if not text.strip():
        raise DocumentError("That file is empty: there is no text in it to keep.")
    return text


def _title(title: str, filename: str) -> str:
    title = " ".join((title or "").split())
    if len(title) > MAX_TITLE:
        raise DocumentError(f"Use at most {MAX_TITLE} characters for the title.", "title")
    if not title:
        stem = filename.rsplit(".", 1)[0].strip() or filename
        title = stem[:MAX_TITLE]
    return title


def upload_document(session: Session, *, user_id: int, title: str, filename: str,
                    data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Document:
    """Keep an uploaded file as a document: .txt/.md/.markdown by name, UTF-8 without NUL
    by content, not empty, at most ``max_bytes``. ``data`` may be one byte longer than the
    limit (that is how a caller reading at most ``max_bytes + 1`` tells it is over)."""
    filename = _clean_filename(filename)
    if not filename:
        raise DocumentError("Choose a file to upload.")
    content_type = _content_type(filename)
    text = _text(data, max_bytes)
    document = Document(user_id=user_id, title=_title(title, filename), filename=filename,
                        content_type=content_type, content=text)
    session.add(document)
    session.flush()
    return document


@dataclass(frozen=True)
class DocumentRow:
    """A document as the list shows it: no content loaded."""

    id: int
    title: str
    filename: str
    content_type: str
    size: int
    created_at: datetime

    @property
    def size_label(self) -> str:
        return format_size(self.size)


@dataclass(frozen=True)
class DocumentPage:
    documents: list[DocumentRow]
    page: int
    has_next: bool

    @property
    def has_previous(self) -> bool:
        return self.page > 1


def list_documents(session: Session, *, user_id: int, page: int = 1,
                   per_page: int = PAGE_SIZE) -> DocumentPage:
    """One page, newest first, in one query; the texts stay in the database."""
    page = min(max(page, 1), MAX_PAGE)
    rows = session.execute(
        select(Document.id, Document.title, Document.filename, Document.content_type,
               func.octet_length(Document.content), Document.created_at)
        .where(Document.user_id == user_id)
        .order_by(Document.created_at.desc(), Document.id.desc())
        .offset((page - 1) * per_page).limit(per_page + 1)
    ).all()
    documents = [DocumentRow(*row) for row in rows[:per_page]]
    return DocumentPage(documents, page, len(rows) > per_page)


def delete_document(session: Session, document: Document) -> None:
    refuse_while_held(session, document.user_id, "a document")
    session.delete(document)
    session.flush()
