from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column

DEFAULT_INCLUDED_SOURCES = 3
# How long a soft-deleted memory can be restored before retention purges it.
DEFAULT_RESTORE_WINDOW_DAYS = 30


class Plan(db.Model):
    __tablename__ = "plans"
    __table_args__ = (
        CheckConstraint("included_sources >= 0", name="included_sources_non_negative"),
        CheckConstraint("monthly_price_cents >= 0", name="price_non_negative"),
        CheckConstraint("restore_window_days >= 1", name="restore_window_positive"),
        # At most one plan is the default (free) plan that users without a plan are on.
        Index("uq_plans_single_default", "is_default", unique=True,
              postgresql_where=text("is_default")),
        # Names are unique regardless of case ("Family" and "FAMILY" are one plan to a
        # person), also against two saves at once.
        Index("uq_plans_name_lower", func.lower(text("name")), unique=True),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(80), unique=True)
    slug: Mapped[str] = mapped_column(String(80), unique=True)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    # The cap: how many assigned sources a build may include.
    included_sources: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_INCLUDED_SOURCES, server_default=str(DEFAULT_INCLUDED_SOURCES)
    )
    monthly_price_cents: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Retention: source_key -> days of records a build keeps (no key: all of them); and
    # the days a soft-deleted memory stays restorable before it is purged.
    retention: Mapped[dict[str, int]] = mapped_column(
        JSONB, default=dict, server_default=text("'{}'::jsonb"))
    restore_window_days: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_RESTORE_WINDOW_DAYS,
        server_default=str(DEFAULT_RESTORE_WINDOW_DAYS))
    active: Mapped[bool] = mapped_column(Boolean, default=True, server_default="true")
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    # Set by triggers when the cap or any assignment row changes (what the plan's builds
    # include), and by the fan-out job once every user of the plan has a build requested
    # for that change. The sweeper re-pushes a fan-out while the first is ahead.
    memory_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fanned_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    assignments: Mapped[list[SourceAssignment]] = relationship(
        back_populates="plan", cascade="all, delete-orphan", passive_deletes=True
    )

    def __str__(self) -> str:
        return self.name


class SourceAssignment(db.Model):
    """The admin's "In-RAG" switch for one source on one plan. No row: the registry decides."""

    __tablename__ = "source_assignments"
    __table_args__ = (UniqueConstraint("plan_id", "source_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"))
    source_key: Mapped[str] = mapped_column(String(64))
    enabled: Mapped[bool] = mapped_column(Boolean)
    updated_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    plan: Mapped[Plan] = relationship(back_populates="assignments")
