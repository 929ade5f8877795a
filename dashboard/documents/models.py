from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column


class Document(db.Model):
    __tablename__ = "documents"
    __table_args__ = (Index("ix_documents_user_id", "user_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255), default="", server_default="")
    content_type: Mapped[str] = mapped_column(
        String(100), default="text/plain", server_default="text/plain"
    )
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
