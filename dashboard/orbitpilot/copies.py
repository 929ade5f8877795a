"""The chat's copies of an erased item: the replies that drew on it (the built-in responder
quotes what it was handed), the other replies of those conversations (a responder is
handed every earlier turn, so it may repeat a quote), and the "Drew on" records naming
it. Its words in those replies become the redaction marker; the records go.

What is covered: the item's every text (content and earlier versions), each of its chunks
as the built-in responder quotes them (flattened, cut at ``QUOTE_CHARS``), and each of
its sentences, whatever whitespace separates the words. Not covered: a paraphrase (an LLM
responder may restate the item in other words), another conversation's reply that was
handed no memory but repeats it, the owner's own messages, a Blink caught from a reply."""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Text,
    bindparam,
    delete,
    func,
    select,
    text,
)
from sqlalchemy.orm import Session

from dashboard.copies import CopyCount, Erasure, literal_forms, sentences, words_pattern
from dashboard.memory import chunk_text
from dashboard.orbitpilot.models import Message, ReplyRecall
from dashboard.orbitpilot.responder import one_line

REPLIES = "replies"
DREW_ON = "drew_on"

# An exact search: every form as a plain substring, over the replies by primary key.
_LEFT = text("""
SELECT count(*) FROM messages AS m
WHERE m.id = ANY(:ids) AND EXISTS (
    SELECT 1 FROM unnest(:forms) AS f(form) WHERE strpos(m.content, f.form) > 0)
""").bindparams(bindparam("ids", type_=ARRAY(Integer)), bindparam("forms", type_=ARRAY(Text)))


def quoted_forms(texts: tuple[str, ...]) -> list[str]:
    """Every form in which a reply may hold the item's words verbatim."""
    forms: list[str] = []
    for item in texts:
        forms.append(item)
        for piece in chunk_text(item):
            forms += [piece, one_line(piece)]
        forms += sentences(item)
    return forms


def _recalls(erasure: Erasure) -> tuple[ColumnElement[bool], ...]:
    """The "Drew on" records naming the item: of its owner's memory, in anyone's replies
    (a team's memory is drawn on by each member, in their own conversations)."""
    return (ReplyRecall.owner_id == erasure.owner_id,
            ReplyRecall.source_key == erasure.source_key,
            ReplyRecall.source_id == erasure.source_id)


def erase_chat_copies(session: Session, erasure: Erasure) -> list[CopyCount]:
    """Rewrite the replies that hold the item's words (each change requests the build of
    the reply's owner through ``memory.changes``, as any edit of a message does), delete
    the "Drew on" records naming it, then count both again. The people whose replies drew
    on it (other than its owner: a team's members) become the erasure's ``holders``."""
    drew = select(ReplyRecall.message_id).where(*_recalls(erasure))
    drawn = session.execute(
        select(Message.conversation_id, Message.user_id).distinct()
        .where(Message.id.in_(drew))).all()
    conversations = [conversation for conversation, _ in drawn]
    erasure.holders.update(user for _, user in drawn if user != erasure.owner_id)
    forms = quoted_forms(erasure.texts)
    pattern = words_pattern(forms)
    searched: list[int] = []
    rewritten = 0
    if conversations:
        replies = session.scalars(
            select(Message).where(Message.conversation_id.in_(conversations),
                                  Message.role == "assistant")
            .order_by(Message.id).with_for_update()
            .execution_options(populate_existing=True)).all()
        for reply in replies:
            searched.append(reply.id)
            changed = pattern.sub(erasure.marker, reply.content) if pattern else reply.content
            if changed != reply.content:
                reply.content = changed
                rewritten += 1
        session.flush()
    removed = session.execute(delete(ReplyRecall).where(*_recalls(erasure))).rowcount or 0
    literal = literal_forms(forms)
    left = session.execute(_LEFT, {"ids": searched, "forms": literal}).scalar_one() \
        if searched and literal else 0
    still_named = session.scalar(select(func.count()).select_from(ReplyRecall)
                                 .where(*_recalls(erasure))) or 0
    return [CopyCount(REPLIES, rewritten, left), CopyCount(DREW_ON, removed, still_named)]
