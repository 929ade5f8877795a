from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column


class LegalHold(db.Model):
    """A hold on one user's data, placed by an admin with a reason (staff's words, never
    in the audit log) and an optional end; released by hand or by reaching its end."""

    __tablename__ = "legal_holds"
    __table_args__ = (
        # At most one hold not released per user: a second one would be the same hold.
        Index("uq_legal_holds_one_open", "user_id", unique=True,
              postgresql_where=text("released_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    reason: Mapped[str] = mapped_column(String(500))
    placed_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    placed_at: Mapped[datetime] = created_at_column()
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))

    def holds_at(self, now: datetime) -> bool:
        return self.released_at is None and (self.ends_at is None or self.ends_at > now)
