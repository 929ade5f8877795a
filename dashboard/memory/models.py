from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Computed,
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
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column
from dashboard.sources import CHAT_HISTORY

if TYPE_CHECKING:
    from dashboard.auth.models import User

# The multilingual default's width (USE's 512 beside MiniLM's 384); a narrower model's rows
# are padded with zeros (no cosine changes).
EMBEDDING_DIMENSIONS = 896
# The conversation a chat chunk belongs to (``source_id`` is "<conversation>:<pair>"),
# spelled exactly as its index is, so the planner matches the two.
CHAT_PART = "(split_part(source_id, ':', 1)::integer)"
BUILD_MODES = ("quick", "full")  # what a request may ask for
# What a record may say: ``bulk`` is a plan change applied to many users at once
# (``memory.bulk``), never requested.
RECORD_MODES = (*BUILD_MODES, "bulk")
# Characters of scripts written without spaces between words (Han, kana, Hangul, their
# punctuation and full-width forms): set apart before the words are read, so that a Latin
# name or code inside such text ("工单BL-422已关闭") is a word of its own, and each such
# character one too. The same class splits a query (``memory.lexical``).
NO_SPACE_SCRIPTS = (r"\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u31ff"
                    r"\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
                    r"\U00020000-\U0002ffff")
# A chunk's words for full-text recall: the 'simple' configuration neither stems nor drops
# stop words, so it serves any language and keeps identifiers ("BL-422", "ECONNRESET")
# whole. Generated, so every way a row is written (COPY, the full build's server-side
# copy, a test's INSERT) fills it. Migration 0022 spells the same expression.
LEXEMES = (r"to_tsvector('simple'::regconfig, regexp_replace(content, "
           f"'([{NO_SPACE_SCRIPTS}])', "
           r"' \1 ', 'g'))")
BUILD_STATUSES = ("queued", "running", "succeeded", "failed")
# What asked for a build. content_change: content, flags or deletions the user (or the
# API) wrote; plan_change: the user's plan, or the cap or assignments of their plan;
# model_change: the embedding model changed (``memory.model_change``); repair: the truth
# check found stored chunks that should not be there (``memory.verify``); retention:
# records aged out of the plan's retention window (``dashboard.retention``).
BUILD_TRIGGERS = ("conversation_end", "conversation_idle", "user", "admin", "schedule", "system",
                  "content_change", "plan_change", "model_change", "repair", "retention")


class MemoryChunk(db.Model):
    __tablename__ = "memory_chunks"
    __table_args__ = (
        # The chunk key, per user.
        UniqueConstraint("user_id", "source_key", "source_id", "chunk_index", "content_hash",
                         name="uq_memory_chunks_key"),
        Index("ix_memory_chunks_user_id_source_key", "user_id", "source_key"),
        # A user's chat chunks by conversation and by record time: the dry run reaches
        # the changed conversations' chunks, and the aged ones, without reading the rest.
        Index("ix_memory_chunks_chat_part", "user_id", text(CHAT_PART),
              postgresql_where=text(f"source_key = '{CHAT_HISTORY}'")),
        Index("ix_memory_chunks_chat_record_at", "user_id", "record_at",
              postgresql_where=text(f"source_key = '{CHAT_HISTORY}'")),
        # HNSW over the rows of users large enough to need it (``ann``), and no others:
        # every other user's rows are written at COPY speed and scanned exactly.
        Index(
            "ix_memory_chunks_embedding_ann",
            "embedding",
            postgresql_using="hnsw",
            postgresql_with={"m": 16, "ef_construction": 64},
            postgresql_ops={"embedding": "vector_cosine_ops"},
            postgresql_where=text("ann"),
        ),
        # Full-text recall beside the vectors (``memory.search``).
        Index("ix_memory_chunks_lexemes", "lexemes", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    source_key: Mapped[str] = mapped_column(String(64))
    source_id: Mapped[str] = mapped_column(String(128))
    chunk_index: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    content: Mapped[str] = mapped_column(Text)
    # When its record was made (``Record.at``): what a retention window ages out.
    record_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    embedding: Mapped[Any] = mapped_column(Vector(EMBEDDING_DIMENSIONS))
    embedding_model: Mapped[str] = mapped_column(String(64))
    build_id: Mapped[int | None] = mapped_column(
        ForeignKey("memory_builds.id", ondelete="SET NULL")
    )
    # In the partial HNSW index. Every row of an ``ann_ready`` user (``MemoryState``);
    # no row of a user below the leave mark; in between, the rows the indexing job has
    # moved in so far (docs/architecture/retrieval.md). Retrieval follows the note's flag.
    ann: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = created_at_column()
    # The content's words (``LEXEMES``), never loaded with the row.
    lexemes: Mapped[Any] = mapped_column(TSVECTOR, Computed(LEXEMES, persisted=True),
                                         deferred=True)


class MemoryBuild(db.Model):
    """The record of one build: written before the job is enqueued, the source of truth.

    Its RQ job id is always ``build-<id>``, so nothing about RQ is stored here."""

    __tablename__ = "memory_builds"
    __table_args__ = (
        CheckConstraint(f"mode IN {RECORD_MODES!r}", name="mode"),
        CheckConstraint(f"status IN {BUILD_STATUSES!r}", name="status"),
        CheckConstraint(f"trigger IN {BUILD_TRIGGERS!r}", name="trigger"),
        # One pending request per user (later requests merge into it) and one running
        # build per user. Two indexes, not one over both states: a request made while a
        # build runs must queue behind it, or the change that prompted it is lost.
        Index("uq_memory_builds_one_queued", "user_id", unique=True,
              postgresql_where=text("status = 'queued'")),
        Index("uq_memory_builds_one_running", "user_id", unique=True,
              postgresql_where=text("status = 'running'")),
        Index("ix_memory_builds_user_id_created_at", "user_id", "created_at"),
        Index("ix_memory_builds_status_heartbeat", "status", "heartbeat_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    mode: Mapped[str] = mapped_column(String(8))
    trigger: Mapped[str] = mapped_column(String(24))
    status: Mapped[str] = mapped_column(String(12), default="queued", server_default="queued")
    requested_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    added: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    removed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kept: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    embedded: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Embeddings carried over from stored chunks (a full rebuild of unchanged content).
    reused: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Per source: {"added", "removed", "kept"} chunk counts.
    source_counts: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The source resolution the build used (states, cap, plan), for "why" questions later.
    resolution: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Phase timings in milliseconds (extract, embed, write, total).
    timings: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    embedding_model: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the build began reading its inputs: the schedule compares changes with this,
    # not with the finish (a change made while a build runs is not in it).
    inputs_read_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # For staff lists (the email beside the id); loaded explicitly where listed.
    user: Mapped[User] = relationship(foreign_keys=[user_id])


class MemoryState(db.Model):
    """What a user's stored chunks reflect: written by every build in the transaction
    that swaps the chunks (so the two never disagree). The dry run of the next build
    starts from it and re-reads only what the build could not have seen."""

    __tablename__ = "memory_states"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"),
                                         primary_key=True)
    inputs_read_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The snapshot the build read its inputs in (``pg_snapshot`` as text): what a
    # transaction it does not see wrote may be missing from the chunks.
    snapshot: Mapped[str] = mapped_column(Text)
    included_keys: Mapped[list[str]] = mapped_column(ARRAY(String(64)))
    embedding_model: Mapped[str] = mapped_column(String(64))
    build_id: Mapped[int | None] = mapped_column(BigInteger)
    # Every chunk of the user is ``ann``, so recall may take the HNSW index: set by the
    # indexing job's last batch, cleared by a build that takes the user out (or adds more
    # rows than it moves into the index itself).
    ann_ready: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class MemoryVerification(db.Model):
    """One run of the truth check (``memory.verify``): what it looked at and found, in
    counts only. The staff home shows the latest; violations themselves are audit events."""

    __tablename__ = "memory_verifications"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    users_checked: Mapped[int] = mapped_column(Integer)
    users_pending: Mapped[int] = mapped_column(Integer)  # a build was due: not judged
    chunks_checked: Mapped[int] = mapped_column(BigInteger)
    violations: Mapped[int] = mapped_column(Integer)
    users_with_violations: Mapped[int] = mapped_column(Integer)
    repairs_requested: Mapped[int] = mapped_column(Integer)


class DeletedPart(db.Model):
    """A tombstone: a part of a source in parts (a conversation) was deleted, by the
    transaction ``xid``. Written by a trigger on the parts' table; a build or a dry run
    reads the tombstones its note's snapshot could not see, instead of every chunk."""

    __tablename__ = "deleted_parts"
    __table_args__ = (Index("ix_deleted_parts_user_id_xid", "user_id", "xid"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source_key: Mapped[str] = mapped_column(String(64))
    # No foreign key: written by a trigger while the account may be going too; the
    # tombstones of a deleted user's parts are pruned with the rest.
    user_id: Mapped[int] = mapped_column(Integer)
    part_id: Mapped[int] = mapped_column(Integer)
    xid: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("clock_timestamp()"))
