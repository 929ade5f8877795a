"""The dry run of the next build (the Memory Status page's "what the next build will
change"): after every kind of change it equals the build's own comparison and what the
build then does, while re-reading only the conversations that changed."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, text, update

from dashboard.blinks.models import Blink
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryState
from dashboard.memory.pipeline import (
    _preview_everything,
    preview_memory_build,
    resolve_for_build,
    run_memory_build,
)
from dashboard.orbitpilot.models import Conversation, Message, ProfileFact
from dashboard.sources import BLINKS, CHAT_HISTORY, SOURCE_KEYS
from tests.factories import make_conversation, make_plan, make_user, user_turns

EMBEDDER = HashingEmbedder()


@pytest.fixture
def world(db_session):
    plan = make_plan(db_session, cap=5)
    user = make_user(db_session, plan=plan)
    db_session.add(ProfileFact(user_id=user.id, key="city", value="Lisbon"))
    conversations = [make_conversation(db_session, user, [(f"q{c}.{i}", f"a{c}.{i}")
                                                          for i in range(4)])
                     for c in range(3)]
    db_session.add(Blink(user_id=user.id, title="t", content="a blink"))
    db_session.flush()
    return user, plan, conversations


def build(db_session, user):
    result = run_memory_build(user, "quick", session=db_session, embedder=EMBEDDER)
    # Time passes: every conversation was last touched an hour before the next change.
    db_session.execute(update(Conversation).where(Conversation.user_id == user.id)
                       .values(changed_at=text("clock_timestamp() - interval '1 hour'")))
    db_session.execute(update(MemoryState).where(MemoryState.user_id == user.id)
                       .values(inputs_read_at=text("clock_timestamp() - interval '50 minutes'")))
    return result


def as_counts(preview):
    return {key: (p.to_add, p.to_remove, p.unchanged) for key, p in preview.items()}


def check(db_session, user):
    """The dry run equals the build's own comparison, and then what the build does."""
    db_session.flush()
    db_session.expire_all()
    dry = as_counts(preview_memory_build(user, session=db_session,
                                         embedder_name=EMBEDDER.name))
    included = resolve_for_build(db_session, user).included_keys
    assert dry == as_counts(_preview_everything(db_session, user.id, included, EMBEDDER.name))
    result = build(db_session, user)
    for key in SOURCE_KEYS:
        done = result.per_source.get(key, {})
        assert (dry[key][0], dry[key][1]) == (done.get("added", 0), done.get("removed", 0)), key
    return dry


def test_the_dry_run_equals_the_build_after_every_kind_of_change(db_session, world):
    user, plan, conversations = world
    build(db_session, user)
    (conv0, messages0), (conv1, messages1), (conv2, _) = conversations

    user_turns(messages0)[1].not_remembered = True  # flag a pair
    assert check(db_session, user)[CHAT_HISTORY] == (0, 1, 11)
    user_turns(messages0)[1].not_remembered = False  # and back
    assert check(db_session, user)[CHAT_HISTORY] == (1, 0, 11)
    user_turns(messages1)[2].content = "edited question"
    assert check(db_session, user)[CHAT_HISTORY] == (1, 1, 11)
    # An edit that bypasses the ORM is seen too (the stamp is a database trigger).
    db_session.execute(update(Message).where(Message.id == messages1[1].id)
                       .values(content="raw edit of a reply"))
    assert check(db_session, user)[CHAT_HISTORY] == (1, 1, 11)
    make_conversation(db_session, user, [("new question", "new answer")])
    assert check(db_session, user)[CHAT_HISTORY] == (1, 0, 12)
    db_session.execute(delete(Conversation).where(Conversation.id == conv2.id))
    assert check(db_session, user)[CHAT_HISTORY] == (0, 4, 9)
    db_session.add(Blink(user_id=user.id, title="", content="another blink"))
    assert check(db_session, user)[BLINKS] == (1, 0, 1)
    plan.included_sources = 3  # chat history evicted by the cap
    assert check(db_session, user)[CHAT_HISTORY] == (0, 9, 0)
    plan.included_sources = 5  # and back: every pair is new again
    assert check(db_session, user)[CHAT_HISTORY] == (9, 0, 0)
    assert check(db_session, user) == {key: (0, 0, count) for key, (_, _, count) in
                                       as_counts(preview_memory_build(
                                           user, session=db_session,
                                           embedder_name=EMBEDDER.name)).items()}


def test_only_changed_conversations_are_read_again(db_session, world, count_queries):
    user, _, conversations = world
    build(db_session, user)
    (_, messages), *_ = conversations
    user_turns(messages)[0].not_remembered = True
    db_session.flush()
    with count_queries() as queries:
        preview = preview_memory_build(user, session=db_session, embedder_name=EMBEDDER.name)
    assert as_counts(preview)[CHAT_HISTORY] == (0, 1, 11)
    chat_reads = [s for s in queries.statements if "FROM messages" in s]
    assert len(chat_reads) == 1 and "IN (" in chat_reads[0].replace("\n", " ")
    assert not [s for s in queries.statements
                if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]


def test_without_a_state_or_with_another_model_everything_is_compared(db_session, world):
    user, _, _ = world
    preview = preview_memory_build(user, session=db_session, embedder_name=EMBEDDER.name)
    assert as_counts(preview)[CHAT_HISTORY] == (12, 0, 0)
    build(db_session, user)
    other = preview_memory_build(user, session=db_session, embedder_name="another-model")
    assert as_counts(other)[CHAT_HISTORY] == (12, 12, 0)


def test_every_build_records_what_its_chunks_reflect(db_session, world):
    user, plan, _ = world
    build(db_session, user)
    state = db_session.get(MemoryState, user.id)
    assert (state.embedding_model, state.build_id) == (EMBEDDER.name, None)
    assert set(state.included_keys) == set(resolve_for_build(db_session, user).included_keys)
    plan.included_sources = 1
    build(db_session, user)
    db_session.expire_all()
    assert db_session.get(MemoryState, user.id).included_keys == ["orbitpilot.profile"]
