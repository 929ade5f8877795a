"""The HNSW flag (``memory_chunks.ann``): every row of a user with at least ANN_MIN_CHUNKS
chunks is in the partial HNSW index, no row of a smaller user is, and the build that
crosses the threshold flips the user's rows either way, in its own transaction. Counts,
never times. (A tiny threshold stands in for the real 50,000.)"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from dashboard.extensions import db
from dashboard.memories.models import Memory
from dashboard.memory import execute_build, request_build, settings_from
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryChunk
from dashboard.memory.pipeline import run_memory_build
from dashboard.sources import CHAT_HISTORY
from tests.factories import (
    CountingEmbedder,
    build,
    make_conversation,
    make_plan,
    make_user,
    replace_parts_extract,
)

THRESHOLD = 30


@pytest.fixture
def embedder():
    return CountingEmbedder(HashingEmbedder())


def saved(session, user, count, start=0):
    memories = [Memory(owner_id=user.id, content=f"memory number {i} about topic {i % 7}")
                for i in range(start, start + count)]
    session.add_all(memories)
    session.flush()
    return memories


def flags(session, user_id) -> dict[bool, int]:
    """How many of the user's rows are in the index (True) and how many are not."""
    return dict(session.execute(
        select(MemoryChunk.ann, func.count()).where(MemoryChunk.user_id == user_id)
        .group_by(MemoryChunk.ann)).all())


def ids(session, user_id) -> set[int]:
    return set(session.scalars(select(MemoryChunk.id).where(MemoryChunk.user_id == user_id)))


def test_a_full_build_flags_every_row_of_a_user_at_the_threshold_and_none_below(
        db_session, embedder):
    small, large, exactly = make_user(db_session), make_user(db_session), make_user(db_session)
    saved(db_session, small, THRESHOLD - 1)
    saved(db_session, large, THRESHOLD + 10)
    saved(db_session, exactly, THRESHOLD)
    assert build(db_session, small, "full", embedder, threshold=THRESHOLD).ann is False
    assert build(db_session, large, "full", embedder, threshold=THRESHOLD).ann is True
    assert build(db_session, exactly, "full", embedder, threshold=THRESHOLD).ann is True
    assert flags(db_session, small.id) == {False: THRESHOLD - 1}
    assert flags(db_session, large.id) == {True: THRESHOLD + 10}
    assert flags(db_session, exactly.id) == {True: THRESHOLD}


def test_the_threshold_is_the_apps_setting(app, committed, queue, monkeypatch):
    """The runner builds with the app's ANN_MIN_CHUNKS, as a worker's job does."""
    monkeypatch.setitem(app.config, "ANN_MIN_CHUNKS", 5)
    session = committed.session
    user = committed.user()
    saved(session, user, 6)
    request = request_build(session, user.id, trigger="admin")
    session.commit()
    outcome = execute_build(db.engine, request.build_id, settings=settings_from(app.config),
                            embedder=HashingEmbedder())
    assert outcome == "succeeded"
    assert flags(session, user.id) == {True: 6}


def test_a_quick_update_crossing_up_flips_every_kept_row_and_crossing_down_flips_back(
        db_session, embedder):
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD - 5)
    first = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert (first.ann, first.flipped) == (False, 0)
    before = ids(db_session, user.id)

    saved(db_session, user, 10, start=100)  # 25 + 10 = 35: up
    up = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert (up.added, up.kept, up.embedded, up.ann, up.flipped) == (10, 25, 10, True, 25)
    assert len(embedder.texts) == 10  # flipping re-embeds nothing
    assert flags(db_session, user.id) == {True: 35}

    for memory in memories[:10]:  # 35 - 10 = 25: down
        memory.status = "deleted"
    db_session.flush()
    down = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert (down.removed, down.embedded, down.ann, down.flipped) == (10, 0, False, 25)
    assert flags(db_session, user.id) == {False: 25}
    # The rows kept all along are the very rows of the first build, flipped in place.
    assert len(before & ids(db_session, user.id)) == 15


def test_a_quick_update_that_stays_above_writes_new_rows_flagged_and_flips_nothing(
        db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    saved(db_session, user, 3, start=500)
    result = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert (result.added, result.flipped, result.ann) == (3, 0, True)
    assert flags(db_session, user.id) == {True: THRESHOLD + 4}


def test_a_no_op_quick_update_of_a_user_in_the_index_writes_nothing(db_session, embedder,
                                                                    count_queries):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    with count_queries() as q:
        result = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert (result.added, result.removed, result.embedded, result.flipped) == (0, 0, 0, 0)
    assert not [s for s in q.statements
                if s.lstrip().upper().startswith(("INSERT", "DELETE", "UPDATE", "COPY"))]


def test_a_full_build_of_a_user_in_the_index_keeps_unchanged_rows_in_place(db_session,
                                                                          embedder):
    """Replacing them would re-insert every row into the HNSW graph for the same content;
    only the changed memory's row is replaced."""
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD + 10)
    build(db_session, user, "full", embedder, threshold=THRESHOLD)
    before = ids(db_session, user.id)
    memories[0].content = "an edited memory"
    db_session.flush()
    result = build(db_session, user, "full", embedder, threshold=THRESHOLD)
    assert (result.added, result.removed, result.kept, result.embedded) == (1, 1, 39, 1)
    assert (result.ann, result.flipped) == (True, 0)
    assert len(before & ids(db_session, user.id)) == 39
    assert flags(db_session, user.id) == {True: 40}


def test_a_full_build_crossing_up_keeps_and_flips_the_rows(db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD - 1)
    build(db_session, user, "full", embedder, threshold=THRESHOLD)
    saved(db_session, user, 2, start=700)
    result = build(db_session, user, "full", embedder, threshold=THRESHOLD)
    assert (result.added, result.kept, result.embedded, result.flipped) == (2, 29, 2, 29)
    assert flags(db_session, user.id) == {True: THRESHOLD + 1}


def test_a_full_build_crossing_down_replaces_every_row_unflagged_reusing_embeddings(
        db_session, embedder):
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD + 5)
    build(db_session, user, "full", embedder, threshold=THRESHOLD)
    before = ids(db_session, user.id)
    for memory in memories[:10]:
        memory.status = "deleted"
    db_session.flush()
    result = build(db_session, user, "full", embedder, threshold=THRESHOLD)
    assert (result.removed, result.added, result.reused, result.embedded) == (35, 25, 25, 0)
    assert result.ann is False
    assert embedder.texts == []
    assert ids(db_session, user.id).isdisjoint(before)  # every row replaced
    assert flags(db_session, user.id) == {False: 25}


def test_a_quick_update_reads_only_the_conversations_changed_since_the_last_build(
        committed, monkeypatch):
    """Each step commits, as a worker does (what a build saw is decided by transactions):
    after one flagged pair, the quick update re-reads that conversation alone and embeds
    nothing; after one edited pair, it embeds exactly that pair."""
    session = committed.session
    user = committed.user(plan=committed.plan(cap=5))
    conversations = [make_conversation(session, user, [(f"q{c}.{i}", f"a{c}.{i}")
                                                       for i in range(4)])
                     for c in range(3)]
    session.commit()
    embedder = CountingEmbedder(HashingEmbedder())
    run_memory_build(user, "quick", session=session, embedder=embedder)
    session.commit()
    (conversation, messages), *_ = conversations
    read = []
    def spy(session, user_id, conversation_ids=None):
        records = extract(session, user_id, conversation_ids)
        read.extend(records)
        return records

    extract = replace_parts_extract(monkeypatch, CHAT_HISTORY, spy)
    messages[2].content = "an edited question"
    session.commit()
    embedder.reset()
    result = run_memory_build(user, "quick", session=session, embedder=embedder)
    session.commit()
    assert (result.added, result.removed, result.kept, result.embedded) == (1, 1, 11, 1)
    assert embedder.texts == ["User: an edited question\nOrbitPilot: a0.1"]
    assert {r.source_id.split(":")[0] for r in read} == {str(conversation.id)}
    assert len(read) == 4

    read.clear()
    embedder.reset()
    result = run_memory_build(user, "quick", session=session, embedder=embedder)
    session.commit()
    assert (result.added, result.removed, result.embedded, read) == (0, 0, 0, [])


def test_a_plan_that_includes_chat_history_is_unaffected_by_the_flag(db_session, embedder):
    """Chat chunks of a user in the index are flagged like any other source's."""
    user = make_user(db_session, plan=make_plan(db_session, cap=4))
    make_conversation(db_session, user, [(f"q{i}", f"a{i}") for i in range(THRESHOLD)])
    result = build(db_session, user, "quick", embedder, threshold=THRESHOLD)
    assert result.ann is True
    assert flags(db_session, user.id) == {True: THRESHOLD}
