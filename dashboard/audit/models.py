from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, SmallInteger, String, Uuid
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from dashboard.extensions import db
from dashboard.models_base import created_at_column


class AuditEvent(db.Model):
    """One event. Never content: ids, modes, reasons, before/after of settings.

    UPDATE, DELETE and TRUNCATE are refused by triggers (see the initial migration)."""

    __tablename__ = "audit_events"
    __table_args__ = (
        # Each filter of the audit view, ending in seq: a newest-first page is an index
        # range read at any size of log.
        Index("ix_audit_events_action_seq", "action", "seq"),
        Index("ix_audit_events_owner_id_seq", "owner_id", "seq"),
        Index("ix_audit_events_actor_seq", "actor_type", "actor_id", "seq"),
        Index("ix_audit_events_target_seq", "target_type", "target_id", "seq"),
        Index("ix_audit_events_mode_seq", "mode", "seq"),
        Index("ix_audit_events_occurred_at", "occurred_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    occurred_at: Mapped[datetime] = created_at_column()
    action: Mapped[str] = mapped_column(String(64))
    actor_type: Mapped[str] = mapped_column(String(16))
    actor_id: Mapped[str | None] = mapped_column(String(64))
    # No foreign keys: the log outlives what it speaks of.
    owner_id: Mapped[int | None] = mapped_column(BigInteger)
    target_type: Mapped[str | None] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(64))
    mode: Mapped[str | None] = mapped_column(String(16))
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class AuditCheckpoint(db.Model):
    """A chain head (seq, hash) written down so a later log can be proved to extend it.

    Append-only like the events (triggers of migration 0003)."""

    __tablename__ = "audit_checkpoints"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = created_at_column()


class AuditChain(db.Model):
    """The chain's identity: one row made with the database (migration 0018), named by
    every signed anchor, so another database's anchors are told apart from a cut.
    UPDATE, DELETE and TRUNCATE are refused by triggers."""

    __tablename__ = "audit_chain"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    chain_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    created_at: Mapped[datetime] = created_at_column()
