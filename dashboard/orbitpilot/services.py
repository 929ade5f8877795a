"""Chat with OrbitPilot: conversations, sending, the per-message "do not
remember" flag, Catch, and the one sentence about whether chat history is remembered.

Services flush; the view commits. A flag flip (or any edit of a turn) reaches the owner's
next build through ``memory.changes``, which requests it in the same transaction; a new
turn alone requests nothing (a conversation's end or idleness does).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, aliased

from dashboard.access import Action, Reach, may, reach_of
from dashboard.audit.services import Actor, changes, record_event
from dashboard.blinks.models import Blink
from dashboard.blinks.services import MAX_TITLE as BLINK_MAX_TITLE
from dashboard.blinks.services import BlinkError, create_blink
from dashboard.ids import find_owned
from dashboard.memories.models import Memory
from dashboard.memories.reach import attribute
from dashboard.memory import (
    BuildRequest,
    Embedder,
    MemoryBuild,
    MemoryChunk,
    NothingToSearch,
    RecallCut,
    request_build,
    request_builds,
    search_memory,
)
from dashboard.orbitpilot.models import Conversation, Message, ReplyRecall
from dashboard.orbitpilot.responder import (
    DEFAULT_MEMORY_K,
    MemoryHit,
    Reply,
    ResponderContext,
    Turn,
    one_line,
    recalled_as,
    reply_pieces,
)
from dashboard.plans.sentences import CHAT_REMEMBERED, GUEST_INVITATION, state_sentence
from dashboard.plans.services import Resolution, UserPlans, get_user_plan, resolve_sources
from dashboard.refusals import Conflict, Failed, NotFound, Refusal
from dashboard.sources import CHAT_HISTORY, PROFILE, SAVED, get_source, source_keys

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 4000
TITLE_CHARS = 60
SIDEBAR_CONVERSATIONS = 50
DOCK_MESSAGES = 4
# A guest's conversation lives in the signed session cookie (about 4 KB at most): the last
# few turns, each cut short. It is what the responder sees of a guest, nothing more.
GUEST_MAX_TURNS = 6
GUEST_TURN_CHARS = 300
# What the turns may take in the session, as JSON (escaped non-ASCII included): well under
# the ~4 KB a browser keeps of a cookie, after signing.
GUEST_SESSION_BYTES = 2500

DREW_ON_TITLE_CHARS = 80
NOT_REMEMBERED_LABEL = "Not remembered"
REMEMBERED_LABEL = "Remembered"
REMEMBER_TOGGLE_ACTION = "message.remember_toggle"
NO_ANSWER = "OrbitPilot could not answer that. Try again."
ENDED = ("This conversation has ended, so it takes no new messages. Start a new "
         "conversation to keep chatting.")


class ChatError(Refusal):
    """A chat action refused, with a sentence the person should read."""


class ChatNotFound(NotFound):
    # The same answer whether the row belongs to someone else or does not exist.
    def __init__(self, sentence: str = "There is no such conversation or message.") -> None:
        super().__init__(sentence)


class ChatEnded(Conflict):
    pass


class ResponderFailed(Failed):
    pass


# -- the one sentence ---------------------------------------------------------------

@dataclass(frozen=True)
class ChatMemory:
    """What the notice says, and whether chat history is remembered for this person."""

    text: str
    remembered: bool
    guest: bool

    @property
    def honesty_note(self) -> str | None:
        """The reply's note: the notice's sentence, when chat is not remembered."""
        return None if self.remembered else self.text


def honesty_about() -> str:
    """What the honesty note is about, named before its sentence: the sentence alone
    ("Not remembered on the Free plan: your plan includes 3 sources, and …") never says
    it is chat history that is left out."""
    return get_source(CHAT_HISTORY).label


GUEST_CHAT_MEMORY = ChatMemory(GUEST_INVITATION, remembered=False, guest=True)


def chat_memory_for(resolution: Resolution) -> ChatMemory:
    """The notice for a resolution: the full cap logic, in the status page's words."""
    if resolution.guest:
        return GUEST_CHAT_MEMORY
    source = resolution.get(CHAT_HISTORY)
    if source.remembered:
        return ChatMemory(CHAT_REMEMBERED, remembered=True, guest=False)
    return ChatMemory(state_sentence(source, resolution), remembered=False, guest=False)


def _is_guest(user: Any) -> bool:
    return user is None or not getattr(user, "is_authenticated", False)


def get_chat_memory(user: Any, plans: UserPlans) -> ChatMemory:
    """The notice and the honesty note for ``user``: one query the first time ``plans``
    (the request's) reads the plan, shared with every other surface; none after."""
    if _is_guest(user):
        return GUEST_CHAT_MEMORY
    return chat_memory_for(resolve_sources(get_user_plan(user, plans)))


def get_chat_memory_notice(user: Any, plans: UserPlans) -> str:
    """The line under the chat composer: the guest invitation; CHAT_REMEMBERED when chat
    history is included; else exactly the Memory Status page's reason."""
    return get_chat_memory(user, plans).text


# -- what pages show ---------------------------------------------------------------------

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


PERSONAL = "personal"


@dataclass(frozen=True)
class DrewOn:
    """One item a reply drew on, as the page shows it (``item`` is its words, read from
    memory now; ``message_id``: for a chat pair, the user turn it stands for). Whose it
    is: ``owner`` is ``personal`` or the team's slug, ``team`` the team's name; a team's
    saved memory says who saved it with what (``saved_by``, from the credential)."""

    recall_id: int
    source_key: str
    source_id: str
    distance: float
    item: str
    message_id: int | None = None
    owner: str = PERSONAL
    team: str | None = None
    saved_by: str | None = None
    may_forget: bool = False  # a team's item: the person's role there lets them forget it

    @property
    def kind(self) -> str:
        label = get_source(self.source_key).label if self.source_key in source_keys() \
            else self.source_key
        return recalled_as(MemoryHit(self.source_key, label, self.source_id, "", 0.0,
                                     team=self.team))

    @property
    def whose(self) -> str:
        """Personal, or which team's."""
        return "Personal" if self.team is None else f"Team {self.team}"

    @property
    def title(self) -> str:
        first = next((line for line in self.item.splitlines() if line.strip()), "")
        if self.source_key == CHAT_HISTORY and first.startswith("User: "):
            first = first[len("User: "):]
        return "" if self.source_key == PROFILE else one_line(first, DREW_ON_TITLE_CHARS)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.recall_id, "source": self.source_key, "item_id": self.source_id,
                "distance": round(self.distance, 4), "kind": self.kind, "title": self.title,
                "owner": self.owner, "team": self.team, "saved_by": self.saved_by}


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


def drew_on_of(session: Session, conversation_id: int) -> dict[int, tuple[DrewOn, ...]]:
    """Each reply's "Drew on" in one query: an item shows while some chunk of it is in
    memory (its own chunk first), so a forgotten item leaves every list at once; one
    marked "not relevant" is left out, and so is a team's the person no longer reaches
    (membership is read now: one query more, only if a reply drew on a team's memory).
    A chat pair also names its user turn, a team's saved memory who saved it (a few
    queries more, only if there is one)."""
    chunk = aliased(MemoryChunk)
    item_text = (
        select(chunk.content)
        .where(chunk.user_id == ReplyRecall.owner_id,
               chunk.source_key == ReplyRecall.source_key,
               chunk.source_id == ReplyRecall.source_id)
        .order_by((chunk.id == ReplyRecall.chunk_id).desc(), chunk.chunk_index)
        .limit(1).scalar_subquery()
    )
    rows = session.execute(
        select(ReplyRecall.id, ReplyRecall.message_id, ReplyRecall.source_key,
               ReplyRecall.source_id, ReplyRecall.distance, item_text, ReplyRecall.user_id,
               ReplyRecall.owner_id)
        .join(Message, Message.id == ReplyRecall.message_id)
        .where(Message.conversation_id == conversation_id, ReplyRecall.not_relevant.is_(False))
        .order_by(ReplyRecall.message_id, ReplyRecall.rank)
    ).all()
    rows = [row for row in rows if row[5] is not None]
    if not rows:
        return {}
    user_id = rows[0].user_id
    reach = reach_of(session, user_id) if any(r.owner_id != user_id for r in rows) \
        else Reach.personal(user_id)
    rows = [row for row in rows if reach.reaches(row.owner_id)]
    items = _drew_on(session, reach, [(id_, key, source_id, distance, item, owner)
                                      for id_, _, key, source_id, distance, item, _, owner
                                      in rows])
    out: dict[int, list[DrewOn]] = {}
    for row, shown in zip(rows, items, strict=True):
        out.setdefault(row.message_id, []).append(shown)
    return {message_id: tuple(shown) for message_id, shown in out.items()}


def _drew_on(session: Session, reach: Reach,
             rows: list[tuple[int, str, str, float, str, int]]) -> tuple[DrewOn, ...]:
    """``(recall id, source, item id, distance, words, owner)`` rows as shown: whose each
    is, a chat pair with the user turn it stands for (one query, only if there is a
    pair), a team's saved memory with who saved it (``attribute``: a few queries, only
    if there is one)."""
    turns = _pair_turns(session, {source_id for _, key, source_id, _, _, _ in rows
                                  if key == CHAT_HISTORY})
    saved_by = _saved_by(session, reach, [(source_id, owner)
                                          for _, key, source_id, _, _, owner in rows
                                          if key == SAVED and reach.seat_of(owner)])
    shown = []
    for id_, key, source_id, distance, item, owner in rows:
        seat = reach.seat_of(owner)
        memory = saved_by.get(source_id) if seat is not None else None
        shown.append(DrewOn(
            id_, key, source_id, distance, item,
            turns.get(source_id) if key == CHAT_HISTORY else None,
            owner=seat.slug if seat else PERSONAL, team=seat.name if seat else None,
            saved_by=memory[0] if memory else None,
            may_forget=memory[1] if memory else False))
    return tuple(shown)


def _saved_by(session: Session, reach: Reach, items: list[tuple[str, int]]
              ) -> dict[str, tuple[str, bool]]:
    """For each team memory (id, owner): "Saved by <member> via <credential>", and whether
    the person's role there lets them delete it."""
    ids = set()
    for source_id, _ in items:
        try:
            ids.add(uuid.UUID(source_id))
        except ValueError:
            continue
    if not ids:
        return {}
    memories = list(session.scalars(select(Memory).where(
        Memory.id.in_(ids), Memory.owner_id.in_(sorted({owner for _, owner in items})))))
    said = attribute(session, reach, memories)
    out = {}
    for memory in memories:
        seat = reach.seat_of(memory.owner_id)
        out[str(memory.id)] = (said[memory.id].sentence, seat is not None and may(
            seat, Action.FORGET, author=memory.author_id == reach.user_id))
    return out


def _pair_turns(session: Session, pair_ids: set[str]) -> dict[str, int]:
    """The user turn each chat pair ``"<conversation>:<n>"`` stands for (its n-th)."""
    conversations = {int(p.split(":", 1)[0]) for p in pair_ids if p.split(":", 1)[0].isdigit()}
    if not conversations:
        return {}
    rows = session.execute(
        select(Message.id, Message.conversation_id).where(
            Message.conversation_id.in_(conversations), Message.role == "user")
        .order_by(Message.conversation_id, Message.position)
    ).all()
    turns: dict[str, int] = {}
    counts: dict[int, int] = {}
    for id_, conversation in rows:
        n = counts.get(conversation, 0)
        counts[conversation] = n + 1
        turns[f"{conversation}:{n}"] = id_
    return {p: turns[p] for p in pair_ids if p in turns}


@dataclass(frozen=True)
class NotRelevant:
    recall_id: int
    message_id: int
    conversation_id: int


def mark_not_relevant(session: Session, *, user_id: int, recall_id: Any) -> NotRelevant:
    """The owner says one item did not bear on a reply: it leaves that reply's list."""
    recall = find_owned(session, ReplyRecall, recall_id, user_id, lock=True, bits=64)
    if recall is None:
        raise ChatNotFound("There is no such item under a reply.")
    recall.not_relevant = True
    session.flush()
    conversation_id = session.scalar(select(Message.conversation_id)
                                     .where(Message.id == recall.message_id))
    return NotRelevant(recall.id, recall.message_id, conversation_id)


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


# -- sending -----------------------------------------------------------------------------

def clean_message(text: Any) -> str:
    text = (text if isinstance(text, str) else "").strip()
    if not text:
        raise ChatError("Write a message first.")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ChatError(f"Keep a message to {MAX_MESSAGE_CHARS:,} characters; this one has "
                        f"{len(text):,}.")
    return text


def memory_hits(session: Session, reach: Reach | int, query: str, *, embedder: Embedder,
                k: int = DEFAULT_MEMORY_K, max_distance: RecallCut = None
                ) -> tuple[MemoryHit, ...]:
    """The chunks nearest the message, of the person's own memory and of every team they
    reach (a user id alone: their own), in one search (each naming whose it is); none
    when it has nothing to search on ("!!!"): the reply still comes, drawing on no
    memory."""
    if isinstance(reach, int):
        reach = Reach.personal(reach)
    try:
        hits = search_memory(session, reach.owner_ids, query, k, embedder=embedder,
                             max_distance=max_distance)
    except NothingToSearch:
        return ()
    out = []
    for h in hits:
        seat = reach.seat_of(h.owner_id)
        out.append(MemoryHit(
            h.source_key, get_source(h.source_key).label if h.source_key in source_keys()
            else h.source_key, h.source_id, h.content, float(h.distance), h.chunk_id,
            owner_id=h.owner_id or reach.user_id, team=seat.name if seat else None))
    return tuple(out)


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
                               chunk_id=hit.chunk_id, distance=hit.distance)
                   for rank, hit in enumerate(hits) if hit.chunk_id is not None]
        session.add_all(recalls)
        session.flush()
    except BaseException:
        pending.savepoint.rollback()
        raise
    pending.savepoint.commit()
    words = {hit.chunk_id: hit.content for hit in hits}
    reach = pending.reach or Reach.personal(question.user_id)
    drew_on = _drew_on(session, reach, [(r.id, r.source_key, r.source_id, r.distance,
                                         words[r.chunk_id], r.owner_id) for r in recalls])
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
