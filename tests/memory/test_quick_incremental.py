"""The incremental quick update (it re-reads chat history only for conversations the last
build could not see) against what a full comparison would store, in the situations where
the two could part: a turn committed while a build runs, a database whose transaction
counter started again (a restore), writes in the building transaction itself."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from dashboard.extensions import db
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryChunk, MemoryState
from dashboard.memory.pipeline import (
    fresh_chunks,
    resolve_for_build,
    run_memory_build,
    with_own_transaction,
)
from dashboard.orbitpilot.models import Message, ProfileFact
from dashboard.sources import CHAT_HISTORY, extract
from tests.factories import make_conversation, make_plan, make_user, replace_parts_extract

EMBEDDER = HashingEmbedder()


def stored_chat(session, user_id: int) -> set[tuple]:
    return {tuple(row) for row in session.execute(select(
        MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index,
        MemoryChunk.content_hash).where(MemoryChunk.user_id == user_id,
                                        MemoryChunk.source_key == CHAT_HISTORY))}


def expected_chat(session, user) -> set[tuple]:
    """What a full comparison would store now."""
    included = resolve_for_build(session, user).included_keys
    return {key for key in fresh_chunks(extract(session, user.id, included))
            if key[0] == CHAT_HISTORY}


def test_a_turn_committed_mid_build_costs_no_unchanged_pair(app, committed, monkeypatch):
    session = committed.session
    user = committed.user(plan=committed.plan(cap=5))
    session.add(ProfileFact(user_id=user.id, key="city", value="Lisbon"))
    conversations = [make_conversation(session, user, [(f"q{c}.{i}", f"a{c}.{i}")
                                                       for i in range(4)])
                     for c in range(3)]
    session.commit()
    run_memory_build(user, "quick", session=session, embedder=EMBEDDER)
    session.commit()
    busy, _ = conversations[1]
    def chatting_meanwhile(s, user_id, conversation_ids=None):
        records = original(s, user_id, conversation_ids)
        writer = Session(db.engine)  # the user types in another conversation meanwhile
        writer.add(Message(conversation_id=busy.id, user_id=user.id, role="user",
                           position=1000, content="a new turn"))
        writer.commit()
        writer.close()
        return records

    original = replace_parts_extract(monkeypatch, CHAT_HISTORY, chatting_meanwhile)
    result = run_memory_build(user, "quick", session=session, embedder=EMBEDDER)
    session.commit()
    monkeypatch.undo()
    assert result.removed == 0
    session.expire_all()
    assert stored_chat(session, user.id) == expected_chat(session, user)


def test_a_note_from_another_transaction_history_compares_everything(db_session):
    """After a restore the counter starts lower: every new stamp would look older than
    the last build's note, and a flag set now would never reach the chunks."""
    user = make_user(db_session, plan=make_plan(db_session, cap=5))
    conversation, messages = make_conversation(db_session, user, [("q0", "a0"), ("q1", "a1")])
    run_memory_build(user, "quick", session=db_session, embedder=EMBEDDER)
    db_session.execute(update(MemoryState).where(MemoryState.user_id == user.id)
                       .values(snapshot="900000000:900000000:"))
    first_question = next(m for m in messages if m.role == "user")
    first_question.not_remembered = True
    db_session.flush()
    result = run_memory_build(user, "quick", session=db_session, embedder=EMBEDDER)
    assert result.removed == 1
    assert stored_chat(db_session, user.id) == expected_chat(db_session, user)


def test_the_building_transaction_is_listed_in_its_own_note():
    assert with_own_transaction("100:105:101,103", None) == "100:105:101,103"
    assert with_own_transaction("100:105:101,103", "104") == "100:105:101,103,104"
    assert with_own_transaction("100:105:", "99") == "99:105:99"
    assert with_own_transaction("100:105:", "107") == "100:108:107"


def test_a_write_after_a_build_in_the_same_transaction_reaches_the_next_build(
        app, committed):
    """Write, build, write again, all in one transaction, while another transaction
    commits meanwhile: the second write must not count as seen by the build."""
    session = committed.session
    user = committed.user(plan=committed.plan(cap=5))
    bystander = committed.user()
    conversation, messages = make_conversation(session, user, [("q0", "a0"), ("q1", "a1")])
    session.commit()
    session.add(ProfileFact(user_id=user.id, key="city", value="Lisbon"))
    session.flush()  # this transaction has an id now
    other = Session(db.engine)
    other.add(ProfileFact(user_id=bystander.id, key="city", value="Porto"))
    other.commit()  # a later transaction finished: ours would count as visible
    other.close()
    run_memory_build(user, "quick", session=session, embedder=EMBEDDER)
    first_question = next(m for m in messages if m.role == "user")
    first_question.not_remembered = True
    session.commit()
    result = run_memory_build(user, "quick", session=session, embedder=EMBEDDER)
    session.commit()
    assert result.removed == 1
    assert stored_chat(session, user.id) == expected_chat(session, user)
