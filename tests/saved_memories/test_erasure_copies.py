"""Erasure reaches every copy the product made: a memory holding a canary is saved and
built, the chat draws on it (the built-in responder quotes it) and an export is made —
all committed, through the real pages and job functions. After a redaction or hard
delete (at once, or when a legal hold ends) the canary is in no table of the database
(scanned from the catalogue: messages, chunks, everything), no stored export piece, no
"Drew on" record, no recall result, no log or job; and the receipt says what it searched
and that it found nothing."""

from __future__ import annotations

import io
import json
import logging
import re
import zipfile
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import dashboard.exports.services as export_services
from dashboard.audit.services import Actor
from dashboard.copies import Erasure
from dashboard.exports import (
    DataExport,
    DataExportPart,
    ExportGone,
    build_export,
    open_download,
    request_export,
)
from dashboard.extensions import db
from dashboard.holds import place_hold, release_hold
from dashboard.memory import get_embedder
from dashboard.orbitpilot.copies import erase_chat_copies
from dashboard.orbitpilot.models import Conversation, Message, ReplyRecall
from dashboard.orbitpilot.replies import send_message
from dashboard.orbitpilot.responder import (
    QUOTE_CHARS,
    BuiltinResponder,
    MemoryHit,
    ResponderContext,
    Turn,
)
from dashboard.orbitpilot.source import extract_chat_pairs
from dashboard.retention import complete_released
from dashboard.saved_memories import REDACTED, find_receipt, forget_memory, recall
from dashboard.sources import SAVED
from tests.conftest import AuthActions, csrf_from
from tests.factories import (
    ALL_SCOPES,
    build,
    make_conversation,
    make_memory,
    make_plan,
    make_user,
    queued_triggers,
    settle,
)
from tests.orbitpilot.conftest import send
from tests.saved_memories.helpers import unique_canary
from tests.saved_memories.test_erasure_canary import in_jobs, in_logs, run_queued_build, where_is

QUESTION = "What is the garage door code?"
REASON = "the owner asked"
CLEAN = {"replies": {"removed": 1, "left": 0}, "drew_on": {"removed": 1, "left": 0},
         "exports": {"removed": 1, "left": 0}}


@dataclass
class Copied:
    canary: str
    owner: Any
    memory_id: Any
    reply_id: int
    export_id: int
    client: Any
    session: Session


def committed_session() -> Session:
    return Session(db.engine, expire_on_commit=False)


def export_text(session: Session, export_id: int) -> str:
    data = b"".join(session.scalars(select(DataExportPart.data).where(
        DataExportPart.export_id == export_id).order_by(DataExportPart.seq)))
    archive = zipfile.ZipFile(io.BytesIO(data))
    return "".join(archive.read(name).decode() for name in archive.namelist())


@pytest.fixture
def copied(app, committed, queue, caplog) -> Copied:
    """A committed memory with the canary, built; a chat reply that quoted it (through the
    chat page); an export made after it (asked on the page, built by the job function)."""
    caplog.set_level(logging.DEBUG)
    canary = unique_canary()
    owner = committed.user(plan=committed.plan(cap=5))
    session = committed.session
    memory = make_memory(session, owner, f"The garage door code is {canary}.",
                         source="chatgpt", actor=Actor("api_key", "1"))
    session.commit()
    memory_id = memory.id
    run_queued_build(session, owner.id)

    client = app.test_client()
    assert AuthActions(client).login(owner.email).status_code == 302
    answer = send(client, QUESTION)
    assert answer.status_code == 201
    body = answer.get_json()
    # It drew on the memory, and the built-in responder quoted it.
    assert [(i["source"], i["item_id"]) for i in body["drew_on"]["items"]] == \
        [(SAVED, str(memory_id))]
    assert canary in body["reply"]["content"]
    asked = client.post("/memory/export", data={"csrf_token": csrf_from(client,
                                                                        "/memory/status")})
    assert asked.status_code == 303
    export_id = int(re.search(r"/memory/export/(\d+)", asked.headers["Location"]).group(1))
    with committed_session() as job:
        assert build_export(job, export_id) == "ready"
    with committed_session() as check:
        assert canary in export_text(check, export_id)
    # Before: where the scan finds it (the scan can fail).
    assert {("memories", "content"), ("memory_chunks", "content"),
            ("messages", "content")} <= where_is(canary)
    return Copied(canary, owner, memory_id, body["reply"]["id"], export_id, client, session)


def assert_no_copy_left(app, c: Copied, caplog, queue) -> None:
    """The canary nowhere, every copy changed as the docs say, and the pages agree."""
    assert where_is(c.canary) == set()
    assert in_logs(caplog, c.canary) == []
    assert in_jobs(queue, c.canary) == []
    with committed_session() as check:
        reply = check.get(Message, c.reply_id)
        assert c.canary not in reply.content
        assert f"“{REDACTED}”" in reply.content  # the quote is there, as the marker
        assert reply.drew_on_memory  # still remembered by its question alone
        assert check.scalar(select(func.count()).select_from(ReplyRecall).where(
            ReplyRecall.source_id == str(c.memory_id))) == 0
        export = check.get(DataExport, c.export_id)
        assert (export.status, export.withdrawn_at is not None) == ("withdrawn", True)
        assert check.scalar(select(func.count()).select_from(DataExportPart).where(
            DataExportPart.export_id == c.export_id)) == 0
        hits = recall(check, c.owner.id, QUESTION, 10, embedder=get_embedder("hashing"))
        assert all(c.canary not in hit.content for hit in hits)
    page = c.client.get(f"/memory/export/{c.export_id}")
    assert page.status_code == 200 and b'id="export-withdrawn"' in page.data
    download = c.client.post(f"/memory/export/{c.export_id}/download",
                             data={"csrf_token": csrf_from(c.client, "/memory/status")})
    assert download.status_code == 410
    chat = c.client.get(f"/orbitpilot/c/{reply.conversation_id}")
    assert chat.status_code == 200 and c.canary.encode() not in chat.data


def assert_receipt_says_clean(c: Copied, receipt_id: int) -> None:
    with committed_session() as check:
        receipt = find_receipt(check, c.owner.id, receipt_id)
    assert {k: v for k, v in receipt.copies.items() if k != "export_parts"} == CLEAN
    assert receipt.copies["export_parts"]["removed"] >= 1
    assert receipt.copies["export_parts"]["left"] == 0
    probe = receipt.to_dict()["probe"]
    assert probe["searched"] == ["chunks", "replies", "drew_on", "exports", "export_parts"]
    assert probe["found"] == dict.fromkeys(probe["searched"], 0)
    page = c.client.get(f"/memories/receipts/{receipt_id}").get_data(as_text=True)
    assert 'data-found="0"' in page and "found nothing:" in page
    assert "1 chat reply rewritten" in page and "1 export withdrawn" in page
    assert c.canary not in page


@pytest.mark.parametrize("mode", ["redact", "hard_delete"])
def test_an_erasure_reaches_the_reply_the_drew_on_record_and_the_export(
        app, copied, caplog, queue, mode):
    c = copied
    receipt = forget_memory(c.session, c.owner.id, c.memory_id, mode=mode,
                            actor=Actor.of(c.owner), scopes=ALL_SCOPES, reason=REASON)
    c.session.commit()
    assert c.canary not in json.dumps(receipt.to_dict())
    run_queued_build(c.session, c.owner.id)  # the build the erasure asked for
    assert_no_copy_left(app, c, caplog, queue)
    assert_receipt_says_clean(c, receipt.marker_id)


@pytest.mark.parametrize("mode", ["redact", "hard_delete"])
def test_under_a_legal_hold_the_copies_wait_with_the_erasure_then_follow_it(
        app, copied, committed, caplog, queue, mode):
    c = copied
    admin = committed.user(role="admin")
    hold = place_hold(c.session, c.owner.id, reason="matter 7", ends_at=None,
                      actor=Actor.of(admin))
    c.session.commit()
    pending = forget_memory(c.session, c.owner.id, c.memory_id, mode=mode,
                            actor=Actor.of(c.owner), scopes=ALL_SCOPES, reason=REASON)
    c.session.commit()
    # Pending: recall stops, the copies are kept as the hold keeps the memory.
    assert (pending.pending, pending.copies) == ("legal_hold", None)
    assert pending.to_dict()["probe"]["searched"] == ["chunks"]
    with committed_session() as check:
        assert c.canary in check.get(Message, c.reply_id).content
        assert check.get(DataExport, c.export_id).status == "ready"
        assert check.scalar(select(func.count()).select_from(ReplyRecall).where(
            ReplyRecall.source_id == str(c.memory_id))) == 1
    assert ("messages", "content") in where_is(c.canary)

    # The hold ends: the erasure completes, and its copies go with it, in one transaction.
    release_hold(c.session, c.session.merge(hold), actor=Actor.of(admin))
    assert complete_released(c.session, user_id=c.owner.id) == 1
    c.session.commit()
    run_queued_build(c.session, c.owner.id)
    with committed_session() as check:
        completed_by = find_receipt(check, c.owner.id, pending.marker_id).completed_by
    assert completed_by is not None
    assert_no_copy_left(app, c, caplog, queue)
    assert_receipt_says_clean(c, completed_by)


# -- each copy, one at a time (in the test's transaction) ---------------------------------------

def drawn_on(session, user, memory, reply_text: str, *, question: str = "the code?",
             conversation=None):
    """A pair whose reply drew on ``memory`` (its "Drew on" record, as finish_send writes
    it); the reply."""
    if conversation is None:
        _, (_, reply) = make_conversation(session, user, [(question, reply_text)])
    else:
        reply = add_pair(session, conversation, question, reply_text)
    reply.drew_on_memory = True
    session.add(ReplyRecall(message_id=reply.id, user_id=user.id, rank=0, source_key=SAVED,
                            source_id=str(memory.id), chunk_id=1, distance=0.2))
    session.flush()
    return reply


def add_pair(session, conversation, question: str, answer: str) -> Message:
    last = session.scalar(select(func.max(Message.position)).where(
        Message.conversation_id == conversation.id))
    asked = Message(conversation_id=conversation.id, user_id=conversation.user_id,
                    role="user", position=last + 1, content=question)
    session.add(asked)
    session.flush()
    reply = Message(conversation_id=conversation.id, user_id=conversation.user_id,
                    role="assistant", position=last + 2, content=answer, reply_to_id=asked.id)
    session.add(reply)
    session.flush()
    return reply


def builtin_quote(memory_text: str) -> str:
    """What the built-in responder answers when recall hands it the memory's chunk."""
    hit = MemoryHit(SAVED, "Saved memories", "x", memory_text, 0.2, 1)
    turns = (Turn("user", "the code?", 1),)
    return BuiltinResponder()(ResponderContext(turns, (hit,))).text


def test_a_rewritten_reply_requests_the_owners_build_in_the_same_transaction(db_session):
    user = make_user(db_session)
    canary = unique_canary()
    memory = make_memory(db_session, user, f"The code is {canary}.")
    reply = drawn_on(db_session, user, memory, builtin_quote(memory.content))
    settle(db_session)
    counts = erase_chat_copies(db_session, Erasure(user.id, SAVED, str(memory.id),
                                                   (memory.content,), "redact", REDACTED))
    assert [(c.kind, c.removed, c.left) for c in counts] == \
        [("replies", 1, 0), ("drew_on", 1, 0)]
    db_session.refresh(reply)
    assert canary not in reply.content and f"“{REDACTED}”" in reply.content
    # The message's change is a watched write: memory.changes asked the build.
    assert queued_triggers(db_session, user) == ["content_change"]


def test_a_quote_the_built_in_responder_cut_short_is_found_and_replaced(db_session):
    user = make_user(db_session)
    canary = unique_canary()
    # One sentence, the canary straddling the responder's cut (QUOTE_CHARS): the reply holds
    # the first half of it, which is no sentence and not the whole text.
    filler = "On the second shelf of the garage, behind the paint tins and the old " \
             "lawnmower manual, sits the small grey box whose code is "
    text = f"{filler}{canary} and nobody else knows it."
    assert len(filler) < QUOTE_CHARS - 1 < len(filler) + len(canary)
    quoted = builtin_quote(text)
    assert canary[:10] in quoted and canary not in quoted and "…" in quoted
    memory = make_memory(db_session, user, text)
    reply = drawn_on(db_session, user, memory, quoted)
    receipt = forget_memory(db_session, user.id, memory.id, mode="redact",
                            actor=Actor.of(user))
    db_session.refresh(reply)
    assert canary[:10] not in reply.content and "garage" not in reply.content
    assert receipt.copies["replies"] == {"removed": 1, "left": 0}


def test_a_later_reply_repeating_it_is_rewritten_and_what_is_not_covered_stays(db_session):
    """Covered: every reply of a conversation where one drew on it, the words matched
    whatever the whitespace. Not covered (docs/architecture/erasure.md): a reply of
    another conversation that drew on no memory, and a paraphrase."""
    user = make_user(db_session)
    canary = unique_canary()
    memory = make_memory(db_session, user, f"Keep this quiet. The code is {canary}.")
    first = drawn_on(db_session, user, memory, builtin_quote(memory.content))
    repeated = add_pair(db_session, db_session.get(Conversation, first.conversation_id),
                        "say it again", f"As I said:\nThe code is\n{canary}.")
    _, (_, elsewhere) = make_conversation(db_session, user, [
        ("and here?", f"The code is {canary}.")])
    paraphrase = add_pair(db_session, db_session.get(Conversation, first.conversation_id),
                          "in other words?", f"It is {canary[::-1]} backwards.")
    receipt = forget_memory(db_session, user.id, memory.id, mode="hard_delete",
                            actor=Actor.of(user), scopes=ALL_SCOPES)
    for message in (first, repeated, elsewhere, paraphrase):
        db_session.refresh(message)
    assert canary not in first.content and canary not in repeated.content
    assert repeated.content == f"As I said:\n{REDACTED}"
    assert canary in elsewhere.content  # another conversation, no memory drawn on
    assert canary[::-1] in paraphrase.content  # other words
    assert receipt.copies["replies"] == {"removed": 2, "left": 0}


def test_a_soft_delete_leaves_every_copy(db_session):
    user = make_user(db_session)
    canary = unique_canary()
    memory = make_memory(db_session, user, f"The code is {canary}.")
    reply = drawn_on(db_session, user, memory, builtin_quote(memory.content))
    export, _ = request_export(db_session, user, interval=600)
    assert build_export(db_session, export.id) == "ready"
    receipt = forget_memory(db_session, user.id, memory.id, mode="soft_delete",
                            actor=Actor.of(user))
    db_session.refresh(reply)
    db_session.refresh(export)
    assert canary in reply.content and export.status == "ready"
    assert receipt.copies is None and receipt.to_dict()["probe"]["searched"] == ["chunks"]


def test_a_withdrawn_export_lets_a_new_one_be_asked_at_once(db_session):
    user = make_user(db_session)
    memory = make_memory(db_session, user, "The code is 4412.")
    first, _ = request_export(db_session, user, interval=600)
    assert build_export(db_session, first.id) == "ready"
    forget_memory(db_session, user.id, memory.id, mode="redact", actor=Actor.of(user))
    db_session.refresh(first)
    assert first.status == "withdrawn"
    with pytest.raises(ExportGone, match="withdrawn"):
        open_download(db_session, user, str(first.id))
    again, new = request_export(db_session, user, interval=600)
    assert new and again.id != first.id


def test_a_reply_that_drew_on_memory_stays_out_of_chat_history_once_its_records_go(
        db_session):
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    canary = unique_canary()
    memory = make_memory(db_session, user, f"The garage door code is {canary}.")
    build(db_session, user, "full")
    asked = "Remind me of the garage door code."  # a statement: its pair is remembered
    exchange = send_message(db_session, responder=BuiltinResponder(), user_id=user.id,
                            text=asked, embedder=get_embedder("hashing"))
    assert canary in exchange.reply.content
    forget_memory(db_session, user.id, memory.id, mode="hard_delete", actor=Actor.of(user),
                  scopes=ALL_SCOPES)
    assert db_session.scalar(select(func.count()).select_from(ReplyRecall).where(
        ReplyRecall.message_id == exchange.reply.id)) == 0
    records = extract_chat_pairs(db_session, user.id, [exchange.conversation_id])
    assert [r.text for r in records] == [f"User: {asked}"]  # the turn alone


# -- an export being made while an erasure commits (two real transactions) -----------------------

def test_an_export_being_made_when_an_erasure_withdraws_it_stores_nothing(
        app, committed, queue, monkeypatch):
    owner = committed.user()
    canary = unique_canary()
    memory = make_memory(committed.session, owner, f"The code is {canary}.")
    export, _ = request_export(committed.session, owner, interval=600)
    committed.session.commit()
    export_id, memory_id = export.id, memory.id
    write_person = export_services.write_person
    erased: list[int] = []

    def erase_meanwhile(*args, **kwargs):
        written = write_person(*args, **kwargs)  # the job has read the memory, canary and all
        with committed_session() as other:
            erased.append(forget_memory(other, owner.id, memory_id, mode="redact",
                                        actor=Actor.of(owner)).marker_id)
            other.commit()
        return written

    monkeypatch.setattr(export_services, "write_person", erase_meanwhile)
    with committed_session() as job:
        assert build_export(job, export_id) == "withdrawn"
    with committed_session() as check:
        assert check.get(DataExport, export_id).status == "withdrawn"
        assert check.scalar(select(func.count()).select_from(DataExportPart).where(
            DataExportPart.export_id == export_id)) == 0
        receipt = find_receipt(check, owner.id, erased[0])
    assert receipt.copies["exports"] == {"removed": 1, "left": 0}
