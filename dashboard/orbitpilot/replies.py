"""Sending: the person's turn stored, memory recalled, the responder asked, its reply
stored with what it drew on (in a savepoint: no question is left without its answer);
a guest's turns live in the session cookie, never the database."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.access import Reach, reach_of
from dashboard.memory import Embedder, RecallCut
from dashboard.orbitpilot.conversations import (
    ChatError,
    ShownMessage,
    derive_title,
    get_conversation,
    with_questions,
)
from dashboard.orbitpilot.drew_on import shown_drew_on
from dashboard.orbitpilot.models import Conversation, Message, ReplyRecall
from dashboard.orbitpilot.recall import memory_hits
from dashboard.orbitpilot.responder import (
    DEFAULT_MEMORY_K,
    Reply,
    ResponderContext,
    Turn,
    reply_pieces,
)
from dashboard.refusals import Conflict, Failed

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 4000
# A guest's conversation lives in the signed session cookie (about 4 KB at most): the last
# few turns, each cut short. It is what the responder sees of a guest, nothing more.
GUEST_MAX_TURNS = 6
GUEST_TURN_CHARS = 300
# What the turns may take in the session, as JSON (escaped non-ASCII included): well under
# the ~4 KB a browser keeps of a cookie, after signing.
GUEST_SESSION_BYTES = 2500

NO_ANSWER = "OrbitPilot could not answer that. Try again."
ENDED = ("This conversation has ended, so it takes no new messages. Start a new "
         "conversation to keep chatting.")


class ChatEnded(Conflict):
    pass


class ResponderFailed(Failed):
    pass


def clean_message(text: Any) -> str:
    text = (text if isinstance(text, str) else "").strip()
    if not text:
        raise ChatError("Write a message first.")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ChatError(f"Keep a message to {MAX_MESSAGE_CHARS:,} characters; this one has "
                        f"{len(text):,}.")
    return text


@dataclass(frozen=True)
class Exchange:
    """A question and its reply, as shown (plain data)."""

    conversation_id: int | None
    conversation_title: str
    question: ShownMessage
    reply: ShownMessage
    drew_on: dict[str, Any]
    new_conversation: bool = False


@dataclass
class PendingReply:
    """A question stored, inside a savepoint, waiting for its answer: ``finish_send``
    stores the answer and releases the savepoint, ``abandon_send`` rolls the question
    back (no question is left without its answer)."""

    conversation: Conversation
    question: Message
    context: ResponderContext
    new: bool
    savepoint: Any
    reach: Reach | None = None  # whose memory it searched (None: none)


def _open_conversation(session: Session, user_id: int, conversation_id: Any, *,
                       lock: bool) -> Conversation | None:
    """The conversation a send goes to (None: a new one), refused if it is not the
    user's or has ended."""
    if conversation_id in (None, ""):
        return None
    conversation = get_conversation(session, user_id, conversation_id, lock=lock)
    if conversation.status != "open":
        raise ChatEnded(ENDED)
    return conversation


def check_send(session: Session, *, user_id: int, text: Any,
               conversation_id: Any = None) -> None:
    """Refuse, before anything is written, what ``begin_send`` would refuse: an empty or
    too long message, a conversation that is not the user's or has ended."""
    clean_message(text)
    _open_conversation(session, user_id, conversation_id, lock=False)


def begin_send(
    session: Session,
    *,
    user_id: int,
    text: Any,
    conversation_id: Any = None,
    embedder: Embedder | None = None,
    memory_k: int = DEFAULT_MEMORY_K,
    max_distance: RecallCut = None,
) -> PendingReply:
    """Store the user's turn and gather what the responder will see: every turn of this
    conversation (the ones marked "Not remembered" included) and the top ``memory_k``
    memory chunks of this user and of the teams they are in now (``access.reach_of``:
    a member removed a moment ago reaches nothing of the team)."""
    text = clean_message(text)
    # Locked: two sends at once must not take the same position.
    conversation = _open_conversation(session, user_id, conversation_id, lock=True)
    new = conversation is None
    savepoint = session.begin_nested()
    try:
        if new:
            conversation = Conversation(user_id=user_id, title=derive_title(text))
            session.add(conversation)
            session.flush()
            earlier: list[Message] = []
        else:
            earlier = list(session.scalars(
                select(Message).where(Message.conversation_id == conversation.id)
                .order_by(Message.position)
            ))
        position = earlier[-1].position + 1 if earlier else 0
        question = Message(conversation_id=conversation.id, user_id=user_id, role="user",
                           position=position, content=text)
        session.add(question)
        session.flush()
        turns = tuple(Turn(m.role, m.content, m.id, bool(m.not_remembered))
                      for m in [*earlier, question])
        reach = reach_of(session, user_id) if embedder is not None and memory_k > 0 \
            else None
        hits = memory_hits(session, reach, text, embedder=embedder, k=memory_k,
                           max_distance=max_distance) if reach is not None else ()
    except BaseException:
        savepoint.rollback()
        raise
    return PendingReply(conversation, question, ResponderContext(turns, hits, guest=False),
                        new, savepoint, reach)


def finish_send(session: Session, pending: PendingReply, reply: Reply) -> Exchange:
    """Store the answer and what it drew on, and release the savepoint."""
    conversation, question, hits = pending.conversation, pending.question, \
        pending.context.memory
    try:
        answer = Message(conversation_id=conversation.id, user_id=question.user_id,
                         role="assistant", position=question.position + 1,
                         content=reply.text, reply_to_id=question.id,
                         drew_on_memory=any(hit.chunk_id is not None for hit in hits))
        session.add(answer)
        conversation.last_activity_at = func.now()
        session.flush()
        recalls = [ReplyRecall(message_id=answer.id, user_id=question.user_id,
                               owner_id=hit.owner_id or question.user_id, rank=rank,
                               source_key=hit.source_key, source_id=hit.source_id,
                               chunk_id=hit.chunk_id, distance=hit.distance,
                               relevance=hit.relevance)
                   for rank, hit in enumerate(hits) if hit.chunk_id is not None]
        session.add_all(recalls)
        session.flush()
    except BaseException:
        pending.savepoint.rollback()
        raise
    pending.savepoint.commit()
    words = {hit.chunk_id: hit.content for hit in hits}
    reach = pending.reach or Reach.personal(question.user_id)
    drew_on = shown_drew_on(session, reach, [(r.id, r.source_key, r.source_id, r.distance,
                                              words[r.chunk_id], r.owner_id, r.relevance)
                                             for r in recalls])
    asked, answered = with_questions([ShownMessage.of(question),
                                      ShownMessage.of(answer, drew_on)], {answer.id: question.id})
    return Exchange(conversation.id, conversation.title, asked, answered, dict(reply.drew_on),
                    new_conversation=pending.new)


def abandon_send(pending: PendingReply) -> None:
    """No answer came: the question goes too."""
    if pending.savepoint.is_active:
        pending.savepoint.rollback()


def send_message(session: Session, *, responder: Any, **send: Any) -> Exchange:
    """Store the user's turn, ask the responder, store its reply (``begin_send``'s
    arguments)."""
    pending = begin_send(session, **send)
    try:
        reply = _respond(responder, pending.context)
    except BaseException:
        abandon_send(pending)
        raise
    return finish_send(session, pending, reply)


def stream_reply(responder: Any, context: ResponderContext) -> Iterator[str]:
    """The reply's pieces as the responder produces them; any failure (or nothing said)
    is ``ResponderFailed``, logged by kind."""
    said = False
    with _no_answer_on_failure():
        for piece in reply_pieces(responder, context):
            said = said or bool(piece.strip())
            yield piece
    if not said:
        raise ResponderFailed(NO_ANSWER)


@contextmanager
def _no_answer_on_failure() -> Iterator[None]:
    """A pluggable responder: any failure is "no answer", logged by kind only."""
    try:
        yield
    except Exception as exc:
        log.warning("responder failed: %s", type(exc).__name__)
        raise ResponderFailed(NO_ANSWER) from None


def _respond(responder: Any, context: ResponderContext) -> Reply:
    with _no_answer_on_failure():
        reply = responder(context)
    text = (reply.text or "").strip() if isinstance(reply, Reply) else ""
    if not text:
        raise ResponderFailed(NO_ANSWER)
    return reply


# -- guests: the session cookie, never the database --------------------------------------

def guest_turns(stored: Any) -> list[ShownMessage]:
    """A guest's conversation from the session (tolerant of anything tampered: the
    cookie is signed, but its shape is ours to check)."""
    turns: list[ShownMessage] = []
    for item in stored if isinstance(stored, list) else []:
        if (isinstance(item, list | tuple) and len(item) == 2
                and item[0] in ("user", "assistant") and isinstance(item[1], str)):
            turns.append(ShownMessage(None, item[0], item[1][:GUEST_TURN_CHARS]))
    return turns[-GUEST_MAX_TURNS:]


def guest_send(stored: Any, text: Any, *, responder: Any) -> tuple[Exchange, list[list[str]]]:
    """Answer a guest from the session's turns only (no memory); return the exchange and
    what the session keeps: the last GUEST_MAX_TURNS turns, each cut short."""
    text = clean_message(text)
    earlier = guest_turns(stored)
    turns = tuple(Turn(m.role, m.content) for m in earlier) + (Turn("user", text),)
    reply = _respond(responder, ResponderContext(turns, (), guest=True))
    kept = [[m.role, m.content] for m in earlier]
    kept += [["user", text[:GUEST_TURN_CHARS]], ["assistant", reply.text[:GUEST_TURN_CHARS]]]
    kept = kept[-GUEST_MAX_TURNS:]
    # The session lives in a cookie, which browsers drop silently above about 4 KB (and
    # non-ASCII text neither compresses nor encodes small): the oldest turns go first.
    while len(kept) > 2 and len(json.dumps(kept)) > GUEST_SESSION_BYTES:
        kept = kept[2:]
    exchange = Exchange(None, "", ShownMessage(None, "user", text),
                        ShownMessage(None, "assistant", reply.text), dict(reply.drew_on))
    return exchange, kept
