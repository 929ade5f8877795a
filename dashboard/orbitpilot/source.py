"""OrbitPilot's two sources: the profile (one record of the user's facts) and chat
history (each answered pair, in parts by conversation, and the turns the user marked
"do not remember" left out; a pair is what the person said and what the reply said of
its own — a question alone, answered with nothing of the reply's own, is no fact and is
not remembered)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.orbitpilot.responder import is_builtin_reply
from dashboard.sources import CHAT_HISTORY, PROFILE, Parts, Record, Source, Watch

# A sentence's end: after it, whitespace or the end of the text (full-width marks, which
# Chinese and Japanese use, need no space after them).
_SENTENCES = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])\s*")


def is_question_only(turn: str) -> bool:
    """Whether every sentence of ``turn`` asks (ends in "?" or "？"): "What do I like on
    planes?" says nothing, "I fly Friday. Which seat do I like?" says something. A
    question typed without its mark counts as a statement: it is remembered."""
    sentences = [s for s in _SENTENCES.split(turn.strip()) if s.strip()]
    return bool(sentences) and all(s.rstrip().endswith(("?", "？")) for s in sentences)


def pair_text(question: str, answer: str, drew_on_memory: bool) -> str | None:
    """What a chat pair is remembered as, None for nothing. The reply counts only for
    what it says of its own: not when it drew on memory (it restates items remembered
    anyway, and a copy of one here would outlive its forgetting), not the built-in
    responder's (it echoes the turn and reports what recall found). Without it, the pair
    is the person's turn alone, and a turn that only asks is no fact: remembered, it
    would outrank the very fact it asked about (nearer the same question than any
    answer), so it is not remembered at all."""
    if drew_on_memory or is_builtin_reply(answer):
        return None if is_question_only(question) else f"User: {question}"
    return f"User: {question}\nOrbitPilot: {answer}"


def extract_many_profiles(session: Session, user_ids: list[int]) -> dict[int, list[Record]]:
    facts: dict[int, list[str]] = {}
    for user_id, key, value in session.execute(
            select(ProfileFact.user_id, ProfileFact.key, ProfileFact.value)
            .where(ProfileFact.user_id.in_(user_ids))
            .order_by(ProfileFact.user_id, ProfileFact.key)):
        facts.setdefault(user_id, []).append(f"{key}: {value}")
    return {uid: [Record(PROFILE, "profile", "\n".join(lines))] for uid, lines in facts.items()}


def _extract_chat_history(session: Session, user_id: int) -> list[Record]:
    """Each answered (user message, reply) pair, ``source_id = "<conversation>:<pair>"``."""
    return extract_chat_pairs(session, user_id)


def extract_chat_pairs(session: Session, user_id: int,
                       conversation_ids: Any = None) -> list[Record]:
    return extract_many_chat_pairs(session, [user_id], conversation_ids).get(user_id, [])


def extract_many_chat_pairs(session: Session, user_ids: list[int],
                            conversation_ids: Any = None) -> dict[int, list[Record]]:
    """The chat-history records of the user's conversations, or of some of them (ids, or a
    query of ids: the dry run re-reads only conversations changed since the last build).

    ``pair_index`` counts every user turn in order; a flagged or unanswered turn emits
    nothing but keeps its index, so every other pair keeps its ``source_id`` across builds.
    The reply is the assistant turn whose ``reply_to_id`` names the user turn (the earliest,
    if regenerated); one without a link answers the user turn right before it."""
    # What a pair is remembered as: ``pair_text``.
    query = (
        select(Message.user_id, Message.id, Message.conversation_id, Message.role,
               Message.content, Message.drew_on_memory, Message.not_remembered,
               Message.reply_to_id, Message.created_at)
        .where(Message.user_id.in_(user_ids))
        .order_by(Message.conversation_id, Message.position)
    )
    if conversation_ids is not None:
        query = query.where(Message.conversation_id.in_(conversation_ids))
    rows = session.execute(query).all()

    records: dict[int, list[Record]] = {}
    owner: int | None = None
    conversation_id: int | None = None
    # (message id, content, not_remembered, when asked)
    turns: list[tuple[int, str, bool, Any]] = []
    replies: dict[int, tuple[str, bool]] = {}  # user turn -> (reply, drew on memory)

    def flush() -> None:
        for pair_index, (message_id, question, flagged, asked_at) in enumerate(turns):
            answer = replies.get(message_id)
            text = None if flagged or answer is None else pair_text(question, *answer)
            if text is None:
                continue
            records.setdefault(owner, []).append(Record(
                CHAT_HISTORY, f"{conversation_id}:{pair_index}", text, asked_at))

    previous_user_turn: int | None = None
    for user_id, id_, conv_id, role, content, drew, flagged, reply_to, created_at in rows:
        if conv_id != conversation_id:
            if conversation_id is not None:
                flush()
            conversation_id, turns, replies, previous_user_turn = conv_id, [], {}, None
            owner = user_id  # a conversation has one owner
        if role == "user":
            turns.append((id_, content, bool(flagged), created_at))
            previous_user_turn = id_
        else:
            target = reply_to if reply_to is not None else previous_user_turn
            if target is not None and target not in replies:
                replies[target] = (content, bool(drew))
            previous_user_turn = None
    if conversation_id is not None:
        flush()
    return records


def count_not_remembered(session: Session, user_id: int) -> int:
    return session.scalar(
        select(func.count()).select_from(Message)
        .where(Message.user_id == user_id, Message.not_remembered.is_(True))
    ) or 0


PROFILE_SOURCE = Source(
    PROFILE, "Your profile", True, "the user's profile facts (one record)",
    extract_many_profiles, (Watch(ProfileFact, "user_id", frozenset({"key", "value"})),),
    aged=False)

CHAT_HISTORY_SOURCE = Source(
    CHAT_HISTORY, "Chat history", True,
    "each answered (user message, assistant reply) pair not marked not-remembered",
    extract_many_chat_pairs,
    # A new turn alone requests nothing: the conversation's end (or idleness) does.
    # Edits, flags and deletions request a build at once.
    (Watch(Message, "user_id", frozenset({"content", "not_remembered", "reply_to_id"}),
           on_insert=False),
     Watch(Conversation, "user_id", on_insert=False, stamp=None)),
    parts=Parts(Conversation, "user_id", "changed_xid", extract_chat_pairs),
    not_remembered=count_not_remembered)
