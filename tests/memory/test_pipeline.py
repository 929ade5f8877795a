"""run_memory_build: quick/full replace semantics, counted embeds, the swap."""

import pytest
from sqlalchemy import select

from dashboard.blinks.models import Blink
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryChunk
from dashboard.memory.pipeline import preview_memory_build, run_memory_build
from dashboard.orbitpilot.models import ProfileFact
from dashboard.plans.models import SourceAssignment
from dashboard.saved_memories.models import Memory
from tests.factories import (
    CountingEmbedder,
    build,
    make_conversation,
    make_plan,
    make_user,
    user_turns,
)

CHAT = "orbitpilot.chat_history"


@pytest.fixture
def embedder():
    return CountingEmbedder(HashingEmbedder())


@pytest.fixture
def chat_user(db_session):
    """A user whose plan includes chat history (cap 4), with three answered pairs."""
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    db_session.add(ProfileFact(user_id=user.id, key="name", value="Ada"))
    conv, messages = make_conversation(
        db_session, user, [("q0 about Lisbon", "a0"), ("q1 about Porto", "a1"),
                           ("q2 about Faro", "a2")])
    return user, conv, messages


def stored_keys(session, user_id):
    return set(session.execute(
        select(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index,
               MemoryChunk.content_hash).where(MemoryChunk.user_id == user_id)).all())


def chunk_ids(session, user_id):
    return set(session.scalars(select(MemoryChunk.id).where(MemoryChunk.user_id == user_id)))


def test_first_quick_build_embeds_everything(db_session, chat_user, embedder):
    user, conv, _ = chat_user
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed, result.kept, result.embedded) == (4, 0, 0, 4)
    assert len(embedder.texts) == 4
    assert {k[1] for k in stored_keys(db_session, user.id) if k[0] == CHAT} == {
        f"{conv.id}:0", f"{conv.id}:1", f"{conv.id}:2"}


def test_build_with_nothing_changed_embeds_nothing_and_writes_nothing(db_session, chat_user,
                                                                      embedder, count_queries):
    user, _, _ = chat_user
    build(db_session, user, "quick", embedder)
    before = chunk_ids(db_session, user.id)
    with count_queries() as q:
        result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed, result.kept, result.embedded) == (0, 0, 4, 0)
    assert embedder.texts == []
    writes = [s for s in q.statements if s.lstrip().upper().startswith(("INSERT", "DELETE",
                                                                       "UPDATE"))]
    assert writes == []
    assert chunk_ids(db_session, user.id) == before


def test_editing_one_message_reembeds_exactly_that_pair(db_session, chat_user, embedder):
    user, conv, messages = chat_user
    build(db_session, user, "quick", embedder)
    before_ids = chunk_ids(db_session, user.id)
    user_turns(messages)[1].content = "q1 about Porto, edited"
    db_session.flush()
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed, result.embedded) == (1, 1, 1)
    assert embedder.texts == ["User: q1 about Porto, edited\nOrbitPilot: a1"]
    after_ids = chunk_ids(db_session, user.id)
    assert len(before_ids & after_ids) == 3  # the other chunks are the very same rows


def test_flagging_removes_the_chunk_at_the_next_build_not_before(db_session, chat_user,
                                                                 embedder):
    user, conv, messages = chat_user
    build(db_session, user, "quick", embedder)
    user_turns(messages)[1].not_remembered = True
    db_session.flush()
    assert (CHAT, f"{conv.id}:1") in {k[:2] for k in stored_keys(db_session, user.id)}
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed, result.embedded) == (0, 1, 0)
    remaining = {k[1] for k in stored_keys(db_session, user.id) if k[0] == CHAT}
    assert remaining == {f"{conv.id}:0", f"{conv.id}:2"}  # later pairs kept their ids


def test_flag_then_unflag_before_the_build_is_untouched(db_session, chat_user, embedder):
    user, _, messages = chat_user
    build(db_session, user, "quick", embedder)
    before = chunk_ids(db_session, user.id)
    turn = user_turns(messages)[2]
    turn.not_remembered = True
    db_session.flush()
    turn.not_remembered = False
    db_session.flush()
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed, result.embedded) == (0, 0, 0)
    assert chunk_ids(db_session, user.id) == before


def test_unflag_after_a_build_removed_it_comes_back_at_the_following_build(
        db_session, chat_user, embedder):
    user, conv, messages = chat_user
    build(db_session, user, "quick", embedder)
    turn = user_turns(messages)[0]
    turn.not_remembered = True
    db_session.flush()
    build(db_session, user, "quick", embedder)
    turn.not_remembered = False
    db_session.flush()
    assert (CHAT, f"{conv.id}:0") not in {k[:2] for k in stored_keys(db_session, user.id)}
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.embedded) == (1, 1)
    assert (CHAT, f"{conv.id}:0") in {k[:2] for k in stored_keys(db_session, user.id)}


def test_full_rebuild_ends_with_the_same_keys_as_a_quick_update(db_session, chat_user,
                                                                embedder):
    user, _, messages = chat_user
    build(db_session, user, "quick", embedder)
    user_turns(messages)[1].not_remembered = True
    db_session.add(Blink(user_id=user.id, title="t", content="a new blink"))
    db_session.flush()
    build(db_session, user, "quick", embedder)
    quick_keys = stored_keys(db_session, user.id)
    before_ids = chunk_ids(db_session, user.id)
    result = build(db_session, user, "full", embedder)
    assert stored_keys(db_session, user.id) == quick_keys
    assert chunk_ids(db_session, user.id).isdisjoint(before_ids)  # every row replaced
    # ...and every embedding was reused: nothing changed, so nothing is embedded again.
    assert (result.embedded, result.reused, result.removed) == (0, len(quick_keys),
                                                                len(quick_keys))


def test_full_rebuild_of_changed_content_embeds_only_the_change(db_session, chat_user,
                                                                embedder):
    user, _, messages = chat_user
    build(db_session, user, "full", embedder)
    user_turns(messages)[0].content = "q0 changed"
    db_session.flush()
    result = build(db_session, user, "full", embedder)
    assert (result.embedded, result.reused) == (1, 3)  # of 4 chunks, 1 changed


def test_switching_embedders_reembeds_at_the_next_build(db_session, chat_user, embedder):
    user, _, _ = chat_user
    build(db_session, user, "quick", embedder)

    class OtherModel(HashingEmbedder):
        name = "hashing-v2"

    other = CountingEmbedder(OtherModel())
    result = run_memory_build(user, "quick", session=db_session, embedder=other)
    assert (result.added, result.removed, result.embedded) == (4, 4, 4)
    models = set(db_session.scalars(select(MemoryChunk.embedding_model)
                                    .where(MemoryChunk.user_id == user.id)))
    assert models == {"hashing-v2"}


def test_cap_and_assignment_changes_act_at_the_next_build_only(db_session, embedder):
    plan = make_plan(db_session, cap=3)
    user = make_user(db_session, plan=plan)
    conv, _ = make_conversation(db_session, user, [("q", "a")])
    db_session.add(Blink(user_id=user.id, title="b", content="blink"))
    db_session.flush()
    first = build(db_session, user, "quick", embedder)
    assert {k[0] for k in stored_keys(db_session, user.id)} == {"blink.blinks"}
    chat_state = {s["key"]: s["state"] for s in first.resolution["sources"]}[CHAT]
    assert chat_state == "evicted_by_cap"

    plan.included_sources = 4
    db_session.flush()
    assert {k[0] for k in stored_keys(db_session, user.id)} == {"blink.blinks"}  # not yet
    second = build(db_session, user, "quick", embedder)
    assert {k[0] for k in stored_keys(db_session, user.id)} == {"blink.blinks", CHAT}
    assert second.resolution["cap"] == 4

    db_session.add(SourceAssignment(plan_id=plan.id, source_key="blink.blinks",
                                    enabled=False))
    db_session.flush()
    third = build(db_session, user, "quick", embedder)
    assert {k[0] for k in stored_keys(db_session, user.id)} == {CHAT}
    assert (third.added, third.removed) == (0, 1)
    assert {s["key"]: s["decided_by"] for s in third.resolution["sources"]}["blink.blinks"] \
        == "plan_row"


def test_forgotten_memories_never_come_back_quick_or_full(db_session, embedder):
    user = make_user(db_session)
    memory = Memory(owner_id=user.id, content="remember me")
    db_session.add(memory)
    db_session.flush()
    build(db_session, user, "quick", embedder)
    assert {k[0] for k in stored_keys(db_session, user.id)} == {"xmemo.saved"}
    memory.status = "deleted"
    db_session.flush()
    for mode in ("quick", "full"):
        build(db_session, user, mode, embedder)
        assert stored_keys(db_session, user.id) == set()


def test_preview_counts_what_the_next_quick_update_would_do_without_writing(
        db_session, chat_user, embedder, count_queries):
    user, _, messages = chat_user
    build(db_session, user, "quick", embedder)
    user_turns(messages)[0].not_remembered = True
    user_turns(messages)[1].content = "edited"
    db_session.add(Blink(user_id=user.id, title="t", content="new blink"))
    db_session.flush()
    with count_queries() as q:
        preview = preview_memory_build(user, session=db_session, embedder_name=embedder.name)
    assert not [s for s in q.statements if s.lstrip().upper().startswith(
        ("INSERT", "DELETE", "UPDATE"))]
    assert (preview[CHAT].to_add, preview[CHAT].to_remove, preview[CHAT].unchanged) == (1, 2, 1)
    assert (preview["blink.blinks"].to_add, preview["blink.blinks"].to_remove) == (1, 0)
    assert (preview["orbitpilot.profile"].to_add, preview["orbitpilot.profile"].unchanged) == \
        (0, 1)
    result = build(db_session, user, "quick", embedder)
    assert (result.added, result.removed) == (2, 2)


def test_an_exception_mid_build_leaves_the_previous_chunks(db_session, chat_user, embedder):
    user, _, messages = chat_user
    build(db_session, user, "quick", embedder)
    db_session.commit()  # the previous build is committed
    before = stored_keys(db_session, user.id)
    user_turns(messages)[0].content = "changed"
    db_session.flush()

    class Exploding(HashingEmbedder):
        def embed(self, texts):
            raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        run_memory_build(user, "full", session=db_session, embedder=Exploding())
    db_session.rollback()
    assert stored_keys(db_session, user.id) == before


def test_unknown_mode_is_refused(db_session, chat_user, embedder):
    with pytest.raises(ValueError, match="mode must be"):
        run_memory_build(chat_user[0], "fast", session=db_session, embedder=embedder)
