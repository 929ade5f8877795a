from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dashboard.extensions import db
from dashboard.models_base import created_at_column, updated_at_column


class ProfileFact(db.Model):
    """One fact of a user's profile; all of a user's facts form the one profile record."""

    __tablename__ = "profile_facts"
    __table_args__ = (UniqueConstraint("user_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(64))
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()


class Conversation(db.Model):
    __tablename__ = "conversations"
    __table_args__ = (
        CheckConstraint("status IN ('open', 'ended')", name="status"),
        Index("ix_conversations_user_id_last_activity_at", "user_id", "last_activity_at"),
        Index("ix_conversations_user_id_changed_xid", "user_id", "changed_xid"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200), default="", server_default="")
    status: Mapped[str] = mapped_column(String(8), default="open", server_default="open")
    created_at: Mapped[datetime] = created_at_column()
    last_activity_at: Mapped[datetime] = created_at_column()
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Stamped by triggers (migration 0004) when any of its messages is inserted, updated
    # or deleted, with the time and the writing transaction's id: the next build's dry run
    # re-reads only conversations written by a transaction the last build could not see.
    changed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.clock_timestamp(), nullable=False)
    changed_xid: Mapped[int] = mapped_column(BigInteger, server_default="0", nullable=False)

    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation",
        order_by="Message.position",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class Message(db.Model):
    """A turn. ``position`` orders a conversation; an assistant turn names the user turn
    it answered in ``reply_to_id``, which is what chat-history pairing follows."""

    __tablename__ = "messages"
    __table_args__ = (
        CheckConstraint("role IN ('user', 'assistant')", name="role"),
        # Only user turns carry the flag; an assistant reply follows its question.
        CheckConstraint("role = 'user' OR NOT not_remembered", name="flag_on_user_turns"),
        CheckConstraint("role = 'assistant' OR reply_to_id IS NULL", name="reply_on_assistant"),
        UniqueConstraint("conversation_id", "position"),
        Index("ix_messages_user_id_not_remembered", "user_id", "not_remembered"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    conversation_id: Mapped[int] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE")
    )
    # Denormalised owner: ownership checks and per-user counts need no join.
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))
    position: Mapped[int] = mapped_column(Integer)
    content: Mapped[str] = mapped_column(Text)
    not_remembered: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default="false"
    )
    reply_to_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="SET NULL"), index=True
    )
    # A reply handed memory items when it was made: chat history remembers its pair by the
    # question alone. A column, not the "Drew on" rows: an erasure deletes those, and the
    # reply (which may paraphrase what it was handed) must stay out of memory all the same.
    drew_on_memory: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default="false"
    )
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    conversation: Mapped[Conversation] = relationship(back_populates="messages")


class ReplyRecall(db.Model):
    """One memory chunk a reply was handed ("Drew on"), in the owner's own data: ids and
    the distance, never a copy of the text (a page reads it from memory, so an item
    forgotten since leaves the list with its chunks). ``user_id`` is whose reply it is;
    ``owner_id`` whose memory the chunk was (the person's, or one of their teams')."""

    __tablename__ = "reply_recalls"
    __table_args__ = (UniqueConstraint("message_id", "rank"),
                      Index("ix_reply_recalls_user_id_source", "user_id", "source_key",
                            "source_id"),
                      # An erasure finds the records naming an item by its owner.
                      Index("ix_reply_recalls_owner_id_source", "owner_id", "source_key",
                            "source_id"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    # Unless given, the reply's owner's own memory.
    owner_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"),
        default=lambda context: context.get_current_parameters()["user_id"])
    rank: Mapped[int] = mapped_column(Integer)
    source_key: Mapped[str] = mapped_column(String(64))
    source_id: Mapped[str] = mapped_column(String(128))
    # No foreign key: builds delete chunks by the thousand, and a rebuild replaces an
    # item's chunk; a page finds the item's current chunk by (source_key, source_id).
    chunk_id: Mapped[int] = mapped_column(BigInteger)
    distance: Mapped[float] = mapped_column(Float)
    not_relevant: Mapped[bool] = mapped_column(Boolean, default=False,
                                               server_default="false")
    # How sure recall was: "relevant", or "possibly_related" (shown, labelled so).
    relevance: Mapped[str] = mapped_column(String(20), default="relevant",
                                           server_default="relevant")
    created_at: Mapped[datetime] = created_at_column()
