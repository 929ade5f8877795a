"""The source registry: defined in code, ordered, and the order is the rank. Each entry owns
its label and default, the extractor that turns a user's rows into records, and what it
*watches* (the writes that change those records: ``memory.changes`` requests builds from
them, the schedule probes them). Nothing forgotten comes back: excluded Blinks, memories
not ``active`` and flagged chat pairs are filtered here, in SQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, exists, false, or_, select
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.memories.models import Memory
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact


@dataclass(frozen=True)
class Record:
    source_key: str
    source_id: str
    text: str


Extractor = Callable[[Session, int], list[Record]]


@dataclass(frozen=True)
class Watch:
    """Writes to ``model`` that change its owner's records of a source.

    ``fields``: the columns whose change matters on an UPDATE (empty: none do);
    ``on_insert`` / ``on_delete``: whether a new or deleted row does. ``stamp`` is the
    column the schedule compares with the last build (``None``: deletes only, which no
    timestamp can show, so they always request a build in their own transaction)."""

    model: type
    owner: str
    fields: frozenset[str] = frozenset()
    on_insert: bool = True
    on_delete: bool = True
    stamp: str | None = "updated_at"

    def owner_column(self) -> Any:
        return getattr(self.model, self.owner)


@dataclass(frozen=True)
class Source:
    key: str
    label: str
    default_visible: bool
    records: str  # what one record is, in words (staff pages)
    extract: Extractor
    watches: tuple[Watch, ...]

    def changed_since(self, user_id: ColumnElement[int],
                      since: ColumnElement[datetime]) -> ColumnElement[bool]:
        """SQL: some watched row of this user was written after ``since``."""
        probes = [
            exists().where(w.owner_column() == user_id, getattr(w.model, w.stamp) > since)
            for w in self.watches if w.stamp
        ]
        return or_(*probes) if probes else false()


# -- extractors ---------------------------------------------------------------------------

def extract_profile(session: Session, user_id: int) -> list[Record]:
    facts = session.execute(
        select(ProfileFact.key, ProfileFact.value)
        .where(ProfileFact.user_id == user_id)
        .order_by(ProfileFact.key)
    ).all()
    if not facts:
        return []
    text = "\n".join(f"{key}: {value}" for key, value in facts)
    return [Record(PROFILE, "profile", text)]


def extract_blinks(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Blink.id, Blink.title, Blink.content)
        .where(Blink.user_id == user_id, Blink.excluded_from_memory.is_(False))
        .order_by(Blink.id)
    ).all()
    return [
        Record(BLINKS, str(id_), f"{title}\n{content}" if title else content)
        for id_, title, content in rows
    ]


def extract_saved_memories(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Memory.id, Memory.content)
        .where(Memory.owner_id == user_id, Memory.status == "active")
        .order_by(Memory.created_at, Memory.id)
    ).all()
    return [Record(SAVED, str(id_), content) for id_, content in rows]


def _extract_chat_history(session: Session, user_id: int) -> list[Record]:
    """Each answered (user message, reply) pair, ``source_id = "<conversation>:<pair>"``."""
    return extract_chat_pairs(session, user_id)


def extract_chat_pairs(session: Session, user_id: int,
                       conversation_ids: Any = None) -> list[Record]:
    """The chat-history records of the user's conversations, or of some of them (ids, or a
    query of ids: the dry run re-reads only conversations changed since the last build).

    ``pair_index`` counts every user turn in order; a flagged or unanswered turn emits
    nothing but keeps its index, so every other pair keeps its ``source_id`` across builds.
    The reply is the assistant turn whose ``reply_to_id`` names the user turn (the earliest,
    if regenerated); one without a link answers the user turn right before it."""
    query = (
        select(Message.id, Message.conversation_id, Message.role, Message.content,
               Message.not_remembered, Message.reply_to_id)
        .where(Message.user_id == user_id)
        .order_by(Message.conversation_id, Message.position)
    )
    if conversation_ids is not None:
        query = query.where(Message.conversation_id.in_(conversation_ids))
    rows = session.execute(query).all()

    records: list[Record] = []
    conversation_id: int | None = None
    turns: list[tuple[int, str, bool]] = []  # (message id, content, not_remembered)
    replies: dict[int, str] = {}

    def flush() -> None:
        for pair_index, (message_id, question, flagged) in enumerate(turns):
            answer = replies.get(message_id)
            if flagged or answer is None:
                continue
            records.append(Record(
                CHAT_HISTORY,
                f"{conversation_id}:{pair_index}",
                f"User: {question}\nOrbitPilot: {answer}",
            ))

    previous_user_turn: int | None = None
    for id_, conv_id, role, content, flagged, reply_to in rows:
        if conv_id != conversation_id:
            if conversation_id is not None:
                flush()
            conversation_id, turns, replies, previous_user_turn = conv_id, [], {}, None
        if role == "user":
            turns.append((id_, content, bool(flagged)))
            previous_user_turn = id_
        else:
            target = reply_to if reply_to is not None else previous_user_turn
            if target is not None and target not in replies:
                replies[target] = content
            previous_user_turn = None
    if conversation_id is not None:
        flush()
    return records


def extract_documents(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Document.id, Document.title, Document.content)
        .where(Document.user_id == user_id)
        .order_by(Document.id)
    ).all()
    return [Record(DOCUMENTS, str(id_), f"{title}\n\n{content}") for id_, title, content
            in rows]


# -- the registry -------------------------------------------------------------------------

PROFILE = "orbitpilot.profile"
BLINKS = "blink.blinks"
SAVED = "xmemo.saved"
CHAT_HISTORY = "orbitpilot.chat_history"
DOCUMENTS = "docs.documents"

SOURCES: tuple[Source, ...] = (
    Source(PROFILE, "Your profile", True, "the user's profile facts (one record)",
           extract_profile,
           (Watch(ProfileFact, "user_id", frozenset({"key", "value"})),)),
    Source(BLINKS, "Your Blinks", True, "each Blink not excluded from memory",
           extract_blinks,
           (Watch(Blink, "user_id", frozenset({"title", "content", "excluded_from_memory"})),)),
    Source(SAVED, "Saved memories", True,
           "each memory saved through /v1/memories with status active",
           extract_saved_memories,
           (Watch(Memory, "owner_id", frozenset({"content", "status"})),)),
    Source(CHAT_HISTORY, "Chat history", True,
           "each answered (user message, assistant reply) pair not marked not-remembered",
           _extract_chat_history,
           # A new turn alone requests nothing: the conversation's end (or idleness)
           # does. Edits, flags and deletions request a build at once.
           (Watch(Message, "user_id", frozenset({"content", "not_remembered", "reply_to_id"}),
                  on_insert=False),
            Watch(Conversation, "user_id", on_insert=False, stamp=None))),
    Source(DOCUMENTS, "Uploaded documents", False, "each document's text",
           extract_documents,
           (Watch(Document, "user_id", frozenset({"title", "content"})),)),
)

SOURCE_KEYS: tuple[str, ...] = tuple(s.key for s in SOURCES)
_BY_KEY = {s.key: s for s in SOURCES}


def get_source(key: str) -> Source:
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown source {key!r}; known: {', '.join(SOURCE_KEYS)}") from None


def extract(session: Session, user_id: int, source_keys: tuple[str, ...]) -> list[Record]:
    records: list[Record] = []
    for key in source_keys:
        records.extend(get_source(key).extract(session, user_id))
    return records
