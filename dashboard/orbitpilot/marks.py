"""What a person does to one message: marks their turn "do not remember" (it takes
effect at the next build), marks an item a reply drew on "not relevant", catches a reply
as a Blink."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.audit.services import Actor, changes, record_event
from dashboard.blinks.models import Blink
from dashboard.blinks.services import MAX_TITLE as BLINK_MAX_TITLE
from dashboard.blinks.services import BlinkError, create_blink
from dashboard.demotions import Item
from dashboard.ids import find_owned
from dashboard.orbitpilot.conversations import (
    ChatError,
    ChatNotFound,
    derive_title,
    remember_label,
)
from dashboard.orbitpilot.models import Conversation, Message, ReplyRecall

REMEMBER_TOGGLE_ACTION = "message.remember_toggle"


# -- the "do not remember" flag -----------------------------------------------------

def _owned_message(session: Session, user_id: int, message_id: Any) -> Message:
    # Locked: two taps at once flip twice, in order, each with its own audit event.
    message = find_owned(session, Message, message_id, user_id, lock=True)
    if message is None:
        raise ChatNotFound("There is no such message.")
    return message


@dataclass(frozen=True)
class ToggleResult:
    message_id: int
    conversation_id: int
    not_remembered: bool

    @property
    def label(self) -> str:
        return remember_label(self.not_remembered)


def toggle_remember(session: Session, *, user: Any, message_id: Any,
                    not_remembered: bool | None = None) -> ToggleResult:
    """Flip one of the owner's own messages between remembered and not — or set it to
    ``not_remembered`` when given (a form sends the state it shows, so a double submit
    lands where the person meant). Writes the flag and one audit event (ids and the
    flag's before/after, never the text) when it changes; the build it changes is
    requested by ``memory.changes`` and takes effect then, not now."""
    message = _owned_message(session, user.id, message_id)
    if message.role != "user":
        raise ChatError("Only your own messages can be marked. OrbitPilot's replies follow "
                        "the message they answer.")
    before = bool(message.not_remembered)
    after = (not before) if not_remembered is None else not_remembered
    if after == before:
        return ToggleResult(message.id, message.conversation_id, after)
    message.not_remembered = after
    session.flush()
    record_event(session, action=REMEMBER_TOGGLE_ACTION, actor=Actor.of(user),
                 owner_id=user.id, target_type="message", target_id=message.id,
                 details=changes({"not_remembered": before}, {"not_remembered": after}))
    return ToggleResult(message.id, message.conversation_id, after)


# -- an item a reply drew on, not relevant -----------------------------------------------

@dataclass(frozen=True)
class NotRelevant:
    recall_id: int
    message_id: int
    conversation_id: int


def mark_not_relevant(session: Session, *, user_id: int, recall_id: Any) -> NotRelevant:
    """The owner says one item did not bear on a reply: it leaves that reply's list, and
    ranks last in their later searches (``not_relevant_items``)."""
    recall = find_owned(session, ReplyRecall, recall_id, user_id, lock=True, bits=64)
    if recall is None:
        raise ChatNotFound("There is no such item under a reply.")
    recall.not_relevant = True
    session.flush()
    conversation_id = session.scalar(select(Message.conversation_id)
                                     .where(Message.id == recall.message_id))
    return NotRelevant(recall.id, recall.message_id, conversation_id)


def not_relevant_items(session: Session, user_id: int) -> frozenset[Item]:
    """Every item the person marked not relevant under any reply, as (whose memory,
    source, item id): what their later searches demote (``dashboard.demotions``)."""
    rows = session.execute(
        select(ReplyRecall.owner_id, ReplyRecall.source_key, ReplyRecall.source_id)
        .where(ReplyRecall.user_id == user_id, ReplyRecall.not_relevant.is_(True))
        .distinct())
    return frozenset((owner, key, item) for owner, key, item in rows)


# -- Catch: a reply saved as a Blink -----------------------------------------------------

@dataclass(frozen=True)
class CatchResult:
    message_id: int
    conversation_id: int
    blink_id: int
    title: str


def catch_reply(session: Session, *, user_id: int, message_id: Any) -> CatchResult:
    message = _owned_message(session, user_id, message_id)
    if message.role != "assistant":
        raise ChatError("Only OrbitPilot's replies can be caught as a Blink.")
    # Titled by where it came from: the reply's own first words would show twice.
    conversation_title = session.scalar(select(Conversation.title).where(
        Conversation.id == message.conversation_id)) or "a conversation"
    title = f"Caught from “{derive_title(conversation_title, BLINK_MAX_TITLE // 2)}”"
    try:
        blink: Blink = create_blink(session, user_id=user_id, title=title,
                                    content=message.content)
    except BlinkError as exc:
        raise ChatError(exc.sentence) from None
    return CatchResult(message.id, message.conversation_id, blink.id, blink.title)
