from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column


class Blink(db.Model):
    __tablename__ = "blinks"
    __table_args__ = (Index("ix_blinks_user_id_excluded", "user_id", "excluded_from_memory"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200), default="", server_default="")
    content: Mapped[str] = mapped_column(Text)
    # "Excluded from AI memory": never extracted by any build.
    excluded_from_memory: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default="false"
    )
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
