"""Evidence reports and drills: their state and, once made, the signed report's bytes.
Counts, ids and measurements only: never anything a user typed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column

EVIDENCE_STATUSES = ("queued", "running", "ready", "failed")


class EvidenceReport(db.Model):
    """One report: the deployment's (``team_id`` NULL, for staff admins) or a team's part
    (for its owners). ``body`` is the canonical JSON that ``signature`` signs."""

    __tablename__ = "evidence_reports"
    __table_args__ = (
        CheckConstraint(f"status IN {EVIDENCE_STATUSES!r}", name="status"),
        CheckConstraint("progress BETWEEN 0 AND 100", name="progress_range"),
        Index("ix_evidence_reports_team_id_created_at", "team_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    requested_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    stage: Mapped[str] = mapped_column(String(64), default="", server_default="")
    created_at: Mapped[datetime] = created_at_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    passed: Mapped[int | None] = mapped_column(Integer)
    failed: Mapped[int | None] = mapped_column(Integer)
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    signature: Mapped[bytes | None] = mapped_column(LargeBinary)


class EvidenceDrill(db.Model):
    """One deletion/export drill on the sandbox account: each step's receipt (ids,
    counts, times), and whether every step held."""

    __tablename__ = "evidence_drills"
    __table_args__ = (
        CheckConstraint(f"status IN {EVIDENCE_STATUSES!r}", name="status"),
        Index("ix_evidence_drills_team_id_created_at", "team_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    requested_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    created_at: Mapped[datetime] = created_at_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ok: Mapped[bool | None] = mapped_column(Boolean)
    steps: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list,
                                                        server_default="[]")
