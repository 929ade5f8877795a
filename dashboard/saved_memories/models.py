from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column

if TYPE_CHECKING:
    from dashboard.auth.models import User

MEMORY_SOURCES = ("chatgpt", "claude", "codex", "copilot", "api", "orbitpilot", "connector")
MEMORY_STATUSES = ("active", "deleted", "redacted")
FORGET_MODES = ("soft_delete", "redact", "hard_delete", "restore")
SCOPES = ("memory:read", "memory:write", "memory:delete", "memory:redact", "memory:hard_delete")


class Memory(db.Model):
    __tablename__ = "memories"
    __table_args__ = (
        CheckConstraint(f"source IN {MEMORY_SOURCES!r}", name="source"),
        CheckConstraint(f"status IN {MEMORY_STATUSES!r}", name="status"),
        CheckConstraint("version >= 1", name="version_positive"),
        Index("ix_memories_owner_id_status_created_at", "owner_id", "status", "created_at"),
        Index("ix_memories_owner_id_author_id", "owner_id", "author_id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), primary_key=True, server_default=text("gen_random_uuid()"),
        default=uuid.uuid4,
    )
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    content: Mapped[str] = mapped_column(Text)
    # "metadata" is reserved on declarative classes; the column keeps the API's name.
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, default=dict, server_default=text("'{}'::jsonb")
    )
    source: Mapped[str] = mapped_column(String(16), default="api", server_default="api")
    status: Mapped[str] = mapped_column(String(16), default="active", server_default="active")
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    # The connected app it was saved through, by the name that app gave itself (a claim).
    client_name: Mapped[str | None] = mapped_column(String(200))
    # Who saved it and with which credential (what the credential proves, never what a
    # client says): the person, and the registered app (the key is ``api_key_id``).
    # A team's memory is owned by the team's account; its author is the member.
    author_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    oauth_client_pk: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("oauth_clients.id", ondelete="SET NULL"))
    # A copy shared to a team: the personal memory it was copied from (no foreign key:
    # the copy's provenance outlives the original).
    shared_from_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    redacted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class MemoryVersion(db.Model):
    """A snapshot of a memory before a change; redaction purges its content and metadata."""

    __tablename__ = "memory_versions"
    __table_args__ = (UniqueConstraint("memory_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    memory_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("memories.id", ondelete="CASCADE")
    )
    version: Mapped[int] = mapped_column(Integer)
    content: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = created_at_column()


class ForgetMarker(db.Model):
    """What remains of a forget, redact, hard delete or restore: never any content.

    No foreign key to ``memories``: the marker outlives a hard-deleted memory."""

    __tablename__ = "forget_markers"
    __table_args__ = (
        CheckConstraint(f"mode IN {FORGET_MODES!r}", name="mode"),
        Index("ix_forget_markers_owner_id_created_at", "owner_id", "created_at"),
        Index("ix_forget_markers_memory_id", "memory_id"),
        Index("ix_forget_markers_vacuum_pending", "id",
              postgresql_where=text("vacuum_due AND vacuumed_at IS NULL")),
        Index("ix_forget_markers_pending_hold", "owner_id",
              postgresql_where=text("pending_hold AND completed_by_id IS NULL")),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    mode: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(500), default="", server_default="")
    actor_type: Mapped[str] = mapped_column(String(16))  # api_key, user, admin, system
    actor_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = created_at_column()
    # The erasure receipt: the states it moved between, what it removed (counts), the
    # audit event recording it, and — for redactions and hard deletes — when a VACUUM of
    # the memory tables ran after it (dead row versions gone from tables and indexes).
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str | None] = mapped_column(String(16))
    removed_versions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    removed_chunks: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    audit_event_id: Mapped[int | None] = mapped_column(BigInteger)
    vacuum_due: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    vacuumed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The post-delete probe of a forget: an exact count of the owner's chunks of this
    # memory, in the forget's own transaction after the delete (NULL for a restore).
    probed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    probe_rows: Mapped[int | None] = mapped_column(Integer)
    # A redact or hard delete asked for under a legal hold: the memory was only soft
    # deleted (recall stops at once); the erasure runs when the hold ends, and its own
    # receipt is ``completed_by_id``.
    pending_hold: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    completed_by_id: Mapped[int | None] = mapped_column(BigInteger)
    # A redaction's or hard delete's copies (``dashboard.copies``): each kind of copy, what
    # it changed and what an exact count found left after it, in the same transaction —
    # [{"kind": "replies", "removed": 1, "left": 0}, …] (a list: jsonb keeps its order).
    # Counts only; NULL: no copy was searched (a soft delete, a restore, an erasure
    # waiting for a legal hold).
    copies: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)

    owner: Mapped[User] = relationship(foreign_keys=[owner_id])


class ApiKey(db.Model):
    """Shown once at creation; stored as a prefix (for lookup) and a hash (for comparison)."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(128))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)), default=list)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The teams it may act for (each still needs its owner's membership at every call).
    team_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer), default=list,
                                                server_default="{}")

    owner: Mapped[User] = relationship(foreign_keys=[owner_id])
