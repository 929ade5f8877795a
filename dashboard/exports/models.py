from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column

# "withdrawn": an erasure after it was made took its copy away (docs: compliance.md).
EXPORT_STATUSES = ("queued", "running", "ready", "failed", "expired", "withdrawn")


class DataExport(db.Model):
    """One "download everything about me": built by a job into ``data_export_parts``,
    downloadable by its owner alone until ``expires_at``."""

    __tablename__ = "data_exports"
    __table_args__ = (
        CheckConstraint(f"status IN {EXPORT_STATUSES!r}", name="status"),
        CheckConstraint("progress BETWEEN 0 AND 100", name="progress_range"),
        Index("ix_data_exports_user_id_created_at", "user_id", "created_at"),
        # One export in the making per user: asking again joins it.
        Index("uq_data_exports_one_pending", "user_id", unique=True,
              postgresql_where=text("status IN ('queued', 'running')")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued", server_default="queued")
    progress: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    stage: Mapped[str] = mapped_column(String(32), default="", server_default="")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(String(64))  # the kind of failure, never text
    created_at: Mapped[datetime] = created_at_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    withdrawn_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DataExportPart(db.Model):
    """A piece of an export's zip, in order; read one at a time to stream a download."""

    __tablename__ = "data_export_parts"

    export_id: Mapped[int] = mapped_column(
        ForeignKey("data_exports.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
