"""The dry run of the next build (the Memory Status page's "what the next build will
change"): after every kind of change it equals the build's own comparison and what the
build then does, while re-reading only the conversations a build could not have seen.

Each step commits, as the app does: what a build could see is decided by transactions
(a change by a transaction still open while the build read its inputs is re-read, however
long it stayed open), so these tests use really committed rows."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import delete, text, update
from sqlalchemy.orm import Session

from dashboard.blinks.models import Blink
from dashboard.extensions import db
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryState
from dashboard.memory.pipeline import (
    _as_preview,
    compare_everything,
    preview_memory_build,
    resolve_for_build,
    run_memory_build,
)
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.sources import BLINKS, CHAT_HISTORY, source_keys
from tests.factories import build, make_conversation, replace_parts_extract, user_turns

EMBEDDER = HashingEmbedder()


@pytest.fixture
def world(committed):
    session = committed.session
    plan = committed.plan(cap=5)
    user = committed.user(plan=plan)
    session.add(ProfileFact(user_id=user.id, key="city", value="Lisbon"))
    conversations = [make_conversation(session, user, [(f"q{c}.{i}", f"a{c}.{i}")
                                                       for i in range(4)])
                     for c in range(3)]
    session.add(Blink(user_id=user.id, title="t", content="a blink"))
    session.commit()
    return session, user, plan, conversations


def as_counts(preview):
    return {key: (p.to_add, p.to_remove, p.unchanged) for key, p in preview.items()}


def dry_run(session, user):
    session.expire_all()
    return as_counts(preview_memory_build(user, session=session, embedder_name=EMBEDDER.name))


def check(session, user):
    """Commit the change; the dry run equals the build's own comparison, and then what
    the build does."""
    session.commit()
    dry = dry_run(session, user)
    included = resolve_for_build(session, user).included_keys
    # The comparison of everything (extract, chunk, key, ``quick_diff``), as a preview.
    everything = _as_preview(compare_everything(session, user.id, included, EMBEDDER.name,
                                                None), None)
    assert dry == as_counts(everything)
    result = build(session, user, embedder=EMBEDDER, commit=True)
    for key in source_keys():
        done = result.per_source.get(key, {})
        assert (dry[key][0], dry[key][1]) == (done.get("added", 0), done.get("removed", 0)), key
    return dry


def test_the_dry_run_equals_the_build_after_every_kind_of_change(world):
    session, user, plan, conversations = world
    build(session, user, embedder=EMBEDDER, commit=True)
    (conv0, messages0), (conv1, messages1), (conv2, _) = conversations

    user_turns(messages0)[1].not_remembered = True  # flag a pair
    assert check(session, user)[CHAT_HISTORY] == (0, 1, 11)
    user_turns(messages0)[1].not_remembered = False  # and back
    assert check(session, user)[CHAT_HISTORY] == (1, 0, 11)
    user_turns(messages1)[2].content = "edited question"
    assert check(session, user)[CHAT_HISTORY] == (1, 1, 11)
    # An edit that bypasses the ORM is seen too (the stamp is a database trigger).
    session.execute(update(Message).where(Message.id == messages1[1].id)
                    .values(content="raw edit of a reply"))
    assert check(session, user)[CHAT_HISTORY] == (1, 1, 11)
    # A pair moved to another conversation: both conversations are read again.
    last_question, last_answer = messages0[-2:]
    session.execute(update(Message).where(Message.id.in_([last_question.id, last_answer.id]))
                    .values(conversation_id=conv1.id, position=Message.position + 100))
    assert check(session, user)[CHAT_HISTORY] == (1, 1, 11)
    make_conversation(session, user, [("new question", "new answer")])
    assert check(session, user)[CHAT_HISTORY] == (1, 0, 12)
    session.execute(delete(Conversation).where(Conversation.id == conv2.id))
    assert check(session, user)[CHAT_HISTORY] == (0, 4, 9)
    session.add(Blink(user_id=user.id, title="", content="another blink"))
    assert check(session, user)[BLINKS] == (1, 0, 1)
    plan.included_sources = 3  # chat history evicted by the cap
    assert check(session, user)[CHAT_HISTORY] == (0, 9, 0)
    plan.included_sources = 5  # and back: every pair is new again
    assert check(session, user)[CHAT_HISTORY] == (9, 0, 0)
    assert all(add == remove == 0 for add, remove, _ in check(session, user).values())


def test_only_conversations_the_build_could_not_see_are_read_again(world, monkeypatch):
    session, user, _, conversations = world
    build(session, user, embedder=EMBEDDER, commit=True)
    (flagged_conversation, messages), *_ = conversations
    user_turns(messages)[0].not_remembered = True
    session.commit()
    read = []

    def spy(session, user_id, conversation_ids=None):
        records = extract(session, user_id, conversation_ids)
        read.extend(records)
        return records

    extract = replace_parts_extract(monkeypatch, CHAT_HISTORY, spy)
    assert dry_run(session, user)[CHAT_HISTORY] == (0, 1, 11)
    # Only the flagged conversation's three remaining pairs, not the other eight.
    assert {r.source_id.split(":")[0] for r in read} == {str(flagged_conversation.id)}
    assert len(read) == 3


def test_a_change_by_a_transaction_open_across_the_build_is_not_missed(app, world):
    session, user, _, conversations = world
    build(session, user, embedder=EMBEDDER, commit=True)
    (_, messages), *_ = conversations
    with app.app_context():
        writer, builder = Session(db.engine), Session(db.engine)
        try:
            # A slow writer edits a question before the build and commits after it.
            writer.execute(update(Message).where(Message.id == messages[0].id)
                           .values(content="a question edited in a long transaction"))
            writer.add(Blink(user_id=user.id, title="", content="meanwhile"))
            done = threading.Event()

            def build_meanwhile():
                with app.app_context():
                    run_memory_build(builder.get(type(user), user.id), "quick",
                                     session=builder, embedder=EMBEDDER)
                    builder.commit()
                done.set()

            thread = threading.Thread(target=build_meanwhile)
            thread.start()
            thread.join(timeout=30)
            assert done.is_set()
            writer.commit()
        finally:
            writer.close()
            builder.close()
    # The build missed the edit (it was not committed when it read); the dry run sees it.
    assert check(session, user)[CHAT_HISTORY] == (1, 1, 11)


def test_without_a_state_or_with_another_model_everything_is_compared(world):
    session, user, _, _ = world
    assert dry_run(session, user)[CHAT_HISTORY] == (12, 0, 0)
    build(session, user, embedder=EMBEDDER, commit=True)
    other = preview_memory_build(user, session=session, embedder_name="another-model")
    assert as_counts(other)[CHAT_HISTORY] == (12, 12, 0)


def test_chunks_of_a_source_no_longer_in_the_registry_are_removals(world):
    session, user, _, _ = world
    build(session, user, embedder=EMBEDDER, commit=True)
    from dashboard.memory.models import MemoryChunk

    session.execute(update(MemoryChunk).where(MemoryChunk.user_id == user.id,
                                              MemoryChunk.source_key == BLINKS)
                    .values(source_key="retired.source"))
    session.commit()
    assert dry_run(session, user)["retired.source"] == (0, 1, 0)
    result = build(session, user, embedder=EMBEDDER, commit=True)
    assert result.per_source["retired.source"]["removed"] == 1


def test_every_build_records_what_its_chunks_reflect(world):
    session, user, plan, _ = world
    build(session, user, embedder=EMBEDDER, commit=True)
    state = session.get(MemoryState, user.id)
    assert (state.embedding_model, state.build_id) == (EMBEDDER.name, None)
    assert ":" in state.snapshot  # xmin:xmax:xip, as PostgreSQL writes it
    assert set(state.included_keys) == set(resolve_for_build(session, user).included_keys)
    plan.included_sources = 1
    session.commit()
    build(session, user, embedder=EMBEDDER, commit=True)
    session.expire_all()
    assert session.get(MemoryState, user.id).included_keys == ["orbitpilot.profile"]


def _chat_chunk_reads(statements) -> list[str]:
    """The statements that read memory_chunks row by row, other than the grouped count
    and the read of the sources compared whole (filtered to their keys)."""
    return [s for s in statements if "FROM memory_chunks" in s and "count(" not in s
            and "memory_chunks.source_key IN (" not in s]


def test_with_nothing_changed_the_dry_run_reads_no_chat_chunk_whatever_the_size(
        committed, count_queries):
    session = committed.session
    plan = committed.plan(cap=5)
    small, big = committed.user(plan=plan), committed.user(plan=plan)
    make_conversation(session, small, [("q", "a")])
    for c in range(20):
        make_conversation(session, big, [(f"q{c}.{i}", f"a{c}.{i}") for i in range(10)])
    session.commit()
    for user in (small, big):
        build(session, user, embedder=EMBEDDER, commit=True)
    reads = {}
    for user in (small, big):
        session.expire_all()
        with count_queries() as q:
            preview_memory_build(user, session=session, embedder_name=EMBEDDER.name)
        reads[user.id] = q.statements
    assert len(reads[small.id]) == len(reads[big.id])
    assert not _chat_chunk_reads(reads[big.id])
    assert _chat_chunk_reads(reads[big.id]) == _chat_chunk_reads(reads[small.id])


def test_a_deleted_conversation_is_found_by_its_tombstone_through_the_index(world):
    session, user, _, conversations = world
    build(session, user, embedder=EMBEDDER, commit=True)
    (_, _), (_, _), (conv2, _) = conversations
    session.execute(delete(Conversation).where(Conversation.id == conv2.id))
    session.commit()
    assert dry_run(session, user)[CHAT_HISTORY] == (0, 4, 8)
    plan = session.execute(text(
        "EXPLAIN SELECT id FROM memory_chunks WHERE user_id = :u "
        "AND source_key = 'orbitpilot.chat_history' "
        "AND (split_part(memory_chunks.source_id, ':', 1)::integer) IN (:p)"),
        {"u": user.id, "p": conv2.id}).scalars().all()
    assert any("ix_memory_chunks_chat_part" in line for line in plan), plan
    result = build(session, user, embedder=EMBEDDER, commit=True)
    assert result.per_source[CHAT_HISTORY]["removed"] == 4
    assert dry_run(session, user)[CHAT_HISTORY] == (0, 0, 8)
