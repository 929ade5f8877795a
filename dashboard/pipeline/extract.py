"""One extractor per registry source (§3). Each takes a session and a user id and returns
records; only the build's included sources are ever extracted.

Nothing forgotten comes back: excluded Blinks, memories not ``active`` and flagged chat
pairs are filtered here, in SQL, for quick updates and full rebuilds alike."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.documents.models import Document
from dashboard.orbitpilot.models import Message, ProfileFact
from dashboard.plans.registry import get_source
from dashboard.xmemo.models import Memory


@dataclass(frozen=True)
class Record:
    source_key: str
    source_id: str
    text: str


Extractor = Callable[[Session, int], list[Record]]


def extract_profile(session: Session, user_id: int) -> list[Record]:
    facts = session.execute(
        select(ProfileFact.key, ProfileFact.value)
        .where(ProfileFact.user_id == user_id)
        .order_by(ProfileFact.key)
    ).all()
    if not facts:
        return []
    text = "\n".join(f"{key}: {value}" for key, value in facts)
    return [Record("orbitpilot.profile", "profile", text)]


def extract_blinks(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Blink.id, Blink.title, Blink.content)
        .where(Blink.user_id == user_id, Blink.excluded_from_memory.is_(False))
        .order_by(Blink.id)
    ).all()
    return [
        Record("blink.blinks", str(id_), f"{title}\n{content}" if title else content)
        for id_, title, content in rows
    ]


def extract_saved_memories(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Memory.id, Memory.content)
        .where(Memory.owner_id == user_id, Memory.status == "active")
        .order_by(Memory.created_at, Memory.id)
    ).all()
    return [Record("xmemo.saved", str(id_), content) for id_, content in rows]


def _extract_chat_history(session: Session, user_id: int) -> list[Record]:
    """Each answered (user message, reply) pair, ``source_id = "<conversation>:<pair>"``.

    ``pair_index`` counts every user turn of the conversation in order. A flagged turn
    emits nothing, and neither does a turn not answered yet, but both still take their
    index: every other pair keeps its exact ``source_id`` across builds, so excluding
    (or later answering) one turn never forces re-embedding of the turns after it.

    The reply is the assistant turn whose ``reply_to_id`` names the user turn (the
    earliest, if regenerated); an assistant turn without a link answers the user turn
    right before it, if that turn has no linked reply."""
    rows = session.execute(
        select(Message.id, Message.conversation_id, Message.role, Message.content,
               Message.not_remembered, Message.reply_to_id)
        .where(Message.user_id == user_id)
        .order_by(Message.conversation_id, Message.position)
    ).all()

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
                "orbitpilot.chat_history",
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
    return [Record("docs.documents", str(id_), f"{title}\n\n{content}") for id_, title, content
            in rows]


def get_extractor(source_key: str) -> Extractor:
    module_name, _, attr = get_source(source_key).extractor.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def extract(session: Session, user_id: int, source_keys: tuple[str, ...]) -> list[Record]:
    records: list[Record] = []
    for key in source_keys:
        records.extend(get_extractor(key)(session, user_id))
    return records
