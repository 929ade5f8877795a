"""Conversations and their messages as pages show them, the chat's refusals, and a
conversation's end (which asks for a quick build of its owner's memory)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from dashboard.ids import find_owned
from dashboard.memory import BuildRequest, MemoryBuild, request_build, request_builds
from dashboard.orbitpilot.drew_on import DrewOn, drew_on_of
from dashboard.orbitpilot.models import Conversation, Message
from dashboard.refusals import NotFound, Refusal

TITLE_CHARS = 60
SIDEBAR_CONVERSATIONS = 50
DOCK_MESSAGES = 4
NOT_REMEMBERED_LABEL = "Not remembered"
REMEMBERED_LABEL = "Remembered"


class ChatError(Refusal):
    """A chat action refused, with a sentence the person should read."""


class ChatNotFound(NotFound):
    # The same answer whether the row belongs to someone else or does not exist.
    def __init__(self, sentence: str = "There is no such conversation or message.") -> None:
        super().__init__(sentence)


@dataclass(frozen=True)
class ShownMessage:
    """A message as templates and JSON show it: plain data, safe across a commit."""

    id: int | None
    role: str
    content: str
    not_remembered: bool = False
    conversation_id: int | None = None
    # A reply's "Drew on": what it was handed that is still in memory, in rank order.
    drew_on: tuple[DrewOn, ...] = ()
    # A reply: the user turn it answers, and whether that turn is marked (the pair is
    # then left out of memory as a whole, and the page says so under the reply too).
    answers: int | None = None
    covered: bool = False

    @classmethod
    def of(cls, message: Message, drew_on: tuple[DrewOn, ...] = ()) -> ShownMessage:
        return cls(message.id, message.role, message.content, bool(message.not_remembered),
                   message.conversation_id, drew_on)

    @property
    def label(self) -> str:
        return remember_label(self.not_remembered)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "content": self.content,
                "not_remembered": self.not_remembered}


def with_questions(messages: list[ShownMessage], reply_to: dict[int, int | None],
                   ) -> list[ShownMessage]:
    """Each reply told which user turn it answers, as the build pairs them: the turn its
    ``reply_to`` names, else the user turn right before it."""
    flagged = {m.id: m.not_remembered for m in messages if m.role == "user"}
    shown, last_user = [], None
    for m in messages:
        if m.role == "user":
            last_user = m.id
        elif m.id is not None:
            asked = reply_to.get(m.id) or last_user
            if asked is not None:
                m = replace(m, answers=asked, covered=flagged.get(asked, False))
        shown.append(m)
    return shown


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    status: str


def remember_label(not_remembered: bool) -> str:
    return NOT_REMEMBERED_LABEL if not_remembered else REMEMBERED_LABEL


def derive_title(text: str, limit: int = TITLE_CHARS) -> str:
    """A short title from a first message: its first line, cut at a word."""
    line = next((part for part in text.splitlines() if part.strip()), "")
    flat = " ".join(line.split())
    if len(flat) <= limit:
        return flat or "New conversation"
    cut = flat[: limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.-") + "…"


def list_conversations(session: Session, user_id: int,
                       limit: int = SIDEBAR_CONVERSATIONS) -> list[ConversationSummary]:
    rows = session.execute(
        select(Conversation.id, Conversation.title, Conversation.status)
        .where(Conversation.user_id == user_id)
        .order_by(Conversation.last_activity_at.desc(), Conversation.id.desc())
        .limit(limit)
    ).all()
    return [ConversationSummary(*row) for row in rows]


def get_conversation(session: Session, user_id: int, conversation_id: Any, *,
                     lock: bool = False) -> Conversation:
    """The owner's conversation, or ChatNotFound (for anyone else's too)."""
    conversation = find_owned(session, Conversation, conversation_id, user_id, lock=lock)
    if conversation is None:
        raise ChatNotFound()
    return conversation


def latest_open_conversation(session: Session, user_id: int) -> Conversation | None:
    return session.scalars(
        select(Conversation)
        .where(Conversation.user_id == user_id, Conversation.status == "open")
        .order_by(Conversation.last_activity_at.desc(), Conversation.id.desc())
        .limit(1)
    ).first()


def conversation_messages(session: Session, conversation_id: int) -> list[ShownMessage]:
    rows = session.scalars(
        select(Message).where(Message.conversation_id == conversation_id)
        .order_by(Message.position)
    ).all()
    drew_on = drew_on_of(session, conversation_id) if any(
        m.role == "assistant" for m in rows) else {}
    return with_questions([ShownMessage.of(m, drew_on.get(m.id, ())) for m in rows],
                          {m.id: m.reply_to_id for m in rows if m.role == "assistant"})


@dataclass(frozen=True)
class DockState:
    conversation_id: int | None
    title: str
    messages: list[ShownMessage]


def dock_state(session: Session, user_id: int, limit: int = DOCK_MESSAGES) -> DockState:
    """The latest open conversation's last few messages, in ONE query whatever the
    number of conversations or messages (the dock is on every page)."""
    latest = (
        select(Conversation.id)
        .where(Conversation.user_id == user_id, Conversation.status == "open")
        .order_by(Conversation.last_activity_at.desc(), Conversation.id.desc())
        .limit(1).scalar_subquery()
    )
    rows = session.execute(
        select(Message.id, Message.role, Message.content, Message.not_remembered,
               Message.conversation_id, Message.reply_to_id, Conversation.title)
        .join(Conversation, Conversation.id == Message.conversation_id)
        .where(Message.conversation_id == latest)
        .order_by(Message.position.desc())
        .limit(limit)
    ).all()
    if not rows:
        return DockState(None, "", [])
    messages = with_questions(
        [ShownMessage(r.id, r.role, r.content, bool(r.not_remembered), r.conversation_id)
         for r in reversed(rows)],
        {r.id: r.reply_to_id for r in rows if r.role == "assistant"})
    return DockState(rows[0].conversation_id, rows[0].title, messages)


def end_conversation(session: Session, conversation: Conversation) -> BuildRequest:
    """Close a conversation and ask for a quick build of its owner's memory."""
    conversation.status = "ended"
    conversation.ended_at = func.now()
    session.flush()
    return request_build(session, conversation.user_id, trigger="conversation_end")


def end_user_conversation(session: Session, *, user_id: int,
                          conversation_id: Any) -> BuildRequest | None:
    """End the owner's conversation; None if it had ended already (nothing to do)."""
    conversation = get_conversation(session, user_id, conversation_id, lock=True)
    if conversation.status != "open":
        return None
    return end_conversation(session, conversation)


def request_idle_conversation_builds(session: Session, *, idle_minutes: int,
                                     now: datetime | None = None) -> int:
    """A quick build for every user with a conversation idle since their last request: an
    idle conversation counts as ended for memory (``jobs.periodic`` runs this)."""
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(minutes=idle_minutes)
    last_request = (
        select(func.max(MemoryBuild.created_at))
        .where(MemoryBuild.user_id == Conversation.user_id)
        .scalar_subquery()
    )
    user_ids = session.scalars(
        select(Conversation.user_id).distinct().where(
            Conversation.status == "open",
            Conversation.last_activity_at < cutoff,
            or_(last_request.is_(None), Conversation.last_activity_at > last_request),
        )
    ).all()
    request_builds(session, user_ids, trigger="conversation_idle")
    return len(user_ids)
