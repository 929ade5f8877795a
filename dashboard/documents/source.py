"""Uploaded documents as a memory source: each document's title and text."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.documents.models import Document
from dashboard.sources import DOCUMENTS, Record, Source, Watch


def extract_documents(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Document.id, Document.title, Document.content)
        .where(Document.user_id == user_id)
        .order_by(Document.id)
    ).all()
    return [Record(DOCUMENTS, str(id_), f"{title}\n\n{content}") for id_, title, content
            in rows]


DOCUMENTS_SOURCE = Source(
    DOCUMENTS, "Uploaded documents", False, "each document's text", extract_documents,
    (Watch(Document, "user_id", frozenset({"title", "content"})),))
