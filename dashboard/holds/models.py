from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
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


HELD_KINDS = ("blink", "profile_fact")


class HeldVersion(db.Model):
    """The text an edit replaced while a legal hold held its owner: kept (and listed in the
    owner's export) until that hold ends, then deleted. Blinks and profile facts keep no
    versions of their own; saved memories do (``memory_versions``)."""

    __tablename__ = "held_versions"
    __table_args__ = (
        CheckConstraint(f"kind IN {HELD_KINDS!r}", name="kind"),
        Index("ix_held_versions_user_id_kind_item_id", "user_id", "kind", "item_id"),
        Index("ix_held_versions_hold_id", "hold_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    hold_id: Mapped[int] = mapped_column(ForeignKey("legal_holds.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    # No foreign key: the item is a Blink or a fact; under the hold it cannot be deleted.
    item_id: Mapped[int] = mapped_column(Integer)
    # A Blink's title and text; a fact's key and value, as they were before the edit.
    title: Mapped[str] = mapped_column(String(200), default="", server_default="")
    content: Mapped[str] = mapped_column(Text)
    held_at: Mapped[datetime] = created_at_column()
