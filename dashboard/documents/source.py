"""Uploaded documents as a memory source: each document's title and text."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.documents.models import Document
from dashboard.sources import DOCUMENTS, Record, Source, Watch, by_user


def extract_many_documents(session: Session, user_ids: list[int]) -> dict[int, list[Record]]:
    rows = session.execute(
        select(Document.user_id, Document.id, Document.title, Document.content,
               Document.created_at)
        .where(Document.user_id.in_(user_ids))
        .order_by(Document.user_id, Document.id)
    )
    return by_user(rows, lambda r: Record(DOCUMENTS, str(r.id), f"{r.title}\n\n{r.content}",
                                          r.created_at))


DOCUMENTS_SOURCE = Source(
    DOCUMENTS, "Uploaded documents", False, "each document's text", extract_many_documents,
    (Watch(Document, "user_id", frozenset({"title", "content"})),))
