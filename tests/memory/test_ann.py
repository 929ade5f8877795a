"""The HNSW flag (``memory_chunks.ann``) and the note's ``ann_ready``: a build never moves a
user's rows into the partial HNSW index (beyond a few new rows of a user already in it);
the build that takes a user to ANN_MIN_CHUNKS writes every row outside it and asks for the
indexing job, which moves them in a committed batch at a time and sets ``ann_ready`` with
the last. A user leaves only below the leave mark. Counts, never times. (A tiny threshold
stands in for the real 50,000.)"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import event, func, select, update

from dashboard.extensions import db
from dashboard.memory import execute_build, request_build, settings_from
from dashboard.memory.ann import index_batch, index_user_ann
from dashboard.memory.embedders import HashingEmbedder
from dashboard.memory.models import MemoryChunk, MemoryState
from dashboard.memory.pipeline import run_memory_build
from dashboard.memory.search import search_memory
from dashboard.memory.settings import EngineSettings
from dashboard.memory.verify import verify_memory
from dashboard.saved_memories.models import Memory
from dashboard.sources import CHAT_HISTORY
from tests.factories import (
    CountingEmbedder,
    build,
    make_conversation,
    make_plan,
    make_user,
    replace_parts_extract,
    settle,
)

THRESHOLD = 20
LEAVE = 16  # ANN_LEAVE_FRACTION's default, 0.8, of THRESHOLD
WORDS = ("lisbon porto budget flight hotel museum dinner recipe garden meeting project "
         "deadline invoice puppy training running marathon coffee book chapter river "
         "violin tax dentist bicycle").split()


@pytest.fixture
def embedder():
    return CountingEmbedder(HashingEmbedder())


def saved(session, user, count, start=0):
    """``count`` memories of distinct random words (no two at the same distance from a
    query, so "exact order" is one order)."""
    rng = np.random.default_rng(1000 + start)
    memories = [Memory(owner_id=user.id,
                       content=f"memory {i}: " + " ".join(rng.choice(WORDS, 6)))
                for i in range(start, start + count)]
    session.add_all(memories)
    session.flush()
    return memories


def flags(session, user_id) -> dict[bool, int]:
    """How many of the user's rows are in the index (True) and how many are not."""
    return dict(session.execute(
        select(MemoryChunk.ann, func.count()).where(MemoryChunk.user_id == user_id)
        .group_by(MemoryChunk.ann)).all())


def ready(session, user_id) -> bool | None:
    return session.scalar(select(MemoryState.ann_ready).where(MemoryState.user_id == user_id))


def ids(session, user_id) -> set[int]:
    return set(session.scalars(select(MemoryChunk.id).where(MemoryChunk.user_id == user_id)))


def index_all(session, user, batch: int = 7) -> int:
    """The indexing job's batches in the test's transaction; how many moved rows."""
    moved = 0
    while not (step := index_batch(session, user.id, leave=LEAVE, batch=batch)).done:
        moved += 1
    return moved + (1 if step.rows else 0)


def up(session, user, mode="quick", embedder=None):
    return build(session, user, mode, embedder, threshold=THRESHOLD)


def exact_top(session, user_id, query: str, k: int) -> list[tuple[float, int]]:
    """numpy's exact answer: the user's k nearest chunks, (distance to 5 places, id),
    nearest first, ties by id."""
    vector = HashingEmbedder().embed([query])[0]
    rows = session.execute(select(MemoryChunk.id, MemoryChunk.embedding)
                           .where(MemoryChunk.user_id == user_id)).all()
    return sorted((round(1 - float(np.dot(e, vector) / np.linalg.norm(e)), 5), id_)
                  for id_, e in rows)[:k]


def recalled(session, user_id, query: str, k: int) -> list[tuple[float, int]]:
    """Recall's k hits as ``exact_top`` spells them. Equal distances (two chunks sharing
    as many words with the query) come in either order: sorted here, as the order of
    distances is checked apart."""
    hits = search_memory(session, user_id, query, k, embedder=HashingEmbedder())
    assert all(a.distance <= b.distance + 1e-6 for a, b in zip(hits, hits[1:], strict=False))
    return sorted((round(h.distance, 5), h.chunk_id) for h in hits)


def ann_findings(session, user, **options):
    settle(session)  # a build queued would keep the user from being judged
    report = verify_memory(session, ann_threshold=THRESHOLD, ann_leave=LEAVE,
                           user_ids=[user.id], repair=False, **options)
    return report, [v for v in report.violations if v.kind == "ann_flag"]


def test_a_crossing_build_writes_every_row_outside_the_index_and_asks_for_indexing(
        db_session, embedder):
    small, large, exactly = make_user(db_session), make_user(db_session), make_user(db_session)
    saved(db_session, small, THRESHOLD - 1)
    saved(db_session, large, THRESHOLD + 10)
    saved(db_session, exactly, THRESHOLD)
    results = {u.id: up(db_session, u, "full", embedder) for u in (small, large, exactly)}
    assert [(r.ann, r.indexing) for r in results.values()] == [
        (False, False), (False, True), (False, True)]
    assert flags(db_session, small.id) == {False: THRESHOLD - 1}
    assert flags(db_session, large.id) == {False: THRESHOLD + 10}
    assert flags(db_session, exactly.id) == {False: THRESHOLD}
    assert (ready(db_session, large.id), ready(db_session, exactly.id)) == (False, False)
    assert index_all(db_session, large) == 5  # 30 rows, 7 a batch
    assert index_all(db_session, exactly) == 3
    assert flags(db_session, large.id) == {True: THRESHOLD + 10}
    assert (ready(db_session, large.id), ready(db_session, exactly.id)) == (True, True)


def test_the_crossing_build_pushes_one_indexing_job_of_the_user_id_alone(
        app, committed, queue, monkeypatch):
    """The runner builds with the app's settings, as a worker's job does; at its commit
    exactly one job goes to the queue, the indexing job with the user id as its only
    argument; run inline, it leaves every row in the index and the user ready."""
    from jobs.builds import index_ann

    monkeypatch.setitem(app.config, "ANN_MIN_CHUNKS", 5)
    session = committed.session
    user = committed.user()
    user_id = user.id
    saved(session, user, 6)
    request = request_build(session, user.id, trigger="admin")
    session.commit()
    queue.empty()  # the build's own job: this test runs the build itself
    outcome = execute_build(db.engine, request.build_id, settings=settings_from(app.config),
                            embedder=HashingEmbedder())
    assert outcome == "succeeded"
    assert flags(session, user_id) == {False: 6}
    jobs = [queue.fetch_job(job_id) for job_id in queue.job_ids]
    assert [(j.func_name, j.args, j.kwargs) for j in jobs] == [
        ("jobs.builds.index_ann", (user_id,), {})]
    assert index_ann(user_id) == "ready"
    assert flags(db.session, user_id) == {True: 6}
    assert ready(db.session, user_id) is True


def test_the_indexing_job_commits_a_batch_at_a_time_and_recall_stays_exact(
        app, committed):
    """21 rows in batches of 7: three transactions, each committed; after the build,
    between batches and after the last, recall returns the exact k nearest in exact
    order (numpy's answer) — the exact scan until the flag, then the index."""
    session = committed.session
    user = committed.user()
    saved(session, user, THRESHOLD + 1)
    session.commit()
    result = run_memory_build(user, "quick", session=session, embedder=HashingEmbedder(),
                              ann_threshold=THRESHOLD)
    session.commit()
    assert (result.ann, result.indexing) == (False, True)
    query, k = "hotel dinner museum coffee", 5
    seen = [(dict(flags(session, user.id)), recalled(session, user.id, query, k))]
    truth = exact_top(session, user.id, query, k)
    commits = []

    def committing(conn):
        commits.append(1)

    event.listen(db.engine, "commit", committing)
    try:
        outcome = index_user_ann(
            session, user.id, settings=EngineSettings(ann_min_chunks=THRESHOLD,
                                                      ann_index_batch=7),
            after_batch=lambda step: seen.append((dict(flags(session, user.id)),
                                                  recalled(session, user.id, query, k))))
    finally:
        event.remove(db.engine, "commit", committing)
    assert (outcome.state, outcome.batches, outcome.rows) == ("ready", 3, 21)
    assert len(commits) == 3
    assert [f for f, _ in seen] == [{False: 21}, {True: 7, False: 14}, {True: 14, False: 7},
                                    {True: 21}]
    assert all(hits == truth for _, hits in seen), (truth, seen)
    assert ready(session, user.id) is True


def test_a_build_between_batches_keeps_the_progress_and_asks_again(db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    up(db_session, user, embedder=embedder)
    assert not index_batch(db_session, user.id, leave=LEAVE, batch=7).done
    before = set(db_session.scalars(select(MemoryChunk.id).where(
        MemoryChunk.user_id == user.id, MemoryChunk.ann)))
    saved(db_session, user, 2, start=500)
    result = up(db_session, user, embedder=embedder)
    assert (result.added, result.flipped, result.ann, result.indexing) == (2, 0, False, True)
    assert before <= ids(db_session, user.id)
    assert flags(db_session, user.id) == {True: 7, False: 16}
    full = up(db_session, user, "full", embedder)  # rows in the index stay where they are
    assert (full.added, full.removed, full.kept, full.indexing) == (0, 0, 23, True)
    assert flags(db_session, user.id) == {True: 7, False: 16}
    assert index_all(db_session, user) == 3
    assert flags(db_session, user.id) == {True: 23}


def test_a_quick_update_crossing_up_writes_nothing_into_the_index_and_down_flips_back(
        db_session, embedder):
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD - 5)
    first = up(db_session, user, embedder=embedder)
    assert (first.ann, first.flipped, first.indexing) == (False, 0, False)
    before = ids(db_session, user.id)

    saved(db_session, user, 10, start=100)  # 15 + 10 = 25: up
    crossing = up(db_session, user, embedder=embedder)
    assert (crossing.added, crossing.kept, crossing.embedded) == (10, 15, 10)
    assert (crossing.ann, crossing.flipped, crossing.indexing) == (False, 0, True)
    assert len(embedder.texts) == 10
    assert flags(db_session, user.id) == {False: 25}
    index_all(db_session, user)
    assert flags(db_session, user.id) == {True: 25}

    for memory in memories[:10]:  # 25 - 10 = 15, below the leave mark: down
        memory.status = "deleted"
    db_session.flush()
    down = up(db_session, user, embedder=embedder)
    assert (down.removed, down.embedded, down.ann, down.flipped) == (10, 0, False, 15)
    assert flags(db_session, user.id) == {False: 15}
    assert ready(db_session, user.id) is False
    # The rows kept all along are the very rows of the first build, flipped in place.
    assert len(before & ids(db_session, user.id)) == 5


def test_a_quick_update_of_a_ready_user_writes_new_rows_flagged_and_flips_nothing(
        db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    up(db_session, user, embedder=embedder)
    index_all(db_session, user)
    saved(db_session, user, 3, start=500)
    result = up(db_session, user, embedder=embedder)
    assert (result.added, result.flipped, result.ann, result.indexing) == (3, 0, True, False)
    assert flags(db_session, user.id) == {True: THRESHOLD + 4}


def test_a_ready_user_adding_more_than_a_batch_goes_back_to_the_indexing_job(
        db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    up(db_session, user, embedder=embedder)
    index_all(db_session, user)
    saved(db_session, user, 8, start=500)
    result = run_memory_build(user, "quick", session=db_session, embedder=embedder,
                              ann_threshold=THRESHOLD, ann_batch=7)
    assert (result.added, result.ann, result.indexing) == (8, False, True)
    assert flags(db_session, user.id) == {True: THRESHOLD + 1, False: 8}
    assert ready(db_session, user.id) is False
    assert index_all(db_session, user) == 2
    assert ready(db_session, user.id) is True


def test_a_no_op_quick_update_of_a_user_in_the_index_writes_nothing(db_session, embedder,
                                                                    count_queries):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD + 1)
    up(db_session, user, embedder=embedder)
    index_all(db_session, user)
    with count_queries() as q:
        result = up(db_session, user, embedder=embedder)
    assert (result.added, result.removed, result.embedded, result.flipped) == (0, 0, 0, 0)
    assert (result.ann, result.indexing) == (True, False)
    assert not [s for s in q.statements
                if s.lstrip().upper().startswith(("INSERT", "DELETE", "UPDATE", "COPY"))]


def test_a_full_build_of_a_user_in_the_index_keeps_unchanged_rows_in_place(db_session,
                                                                          embedder):
    """Replacing them would re-insert every row into the HNSW graph for the same content;
    only the changed memory's row is replaced."""
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD + 10)
    up(db_session, user, "full", embedder)
    index_all(db_session, user)
    before = ids(db_session, user.id)
    memories[0].content = "an edited memory"
    db_session.flush()
    result = up(db_session, user, "full", embedder)
    assert (result.added, result.removed, result.kept, result.embedded) == (1, 1, 29, 1)
    assert (result.ann, result.flipped) == (True, 0)
    assert len(before & ids(db_session, user.id)) == 29
    assert flags(db_session, user.id) == {True: 30}


def test_a_full_build_crossing_up_replaces_the_rows_outside_the_index(db_session, embedder):
    user = make_user(db_session)
    saved(db_session, user, THRESHOLD - 1)
    up(db_session, user, "full", embedder)
    saved(db_session, user, 2, start=700)
    result = up(db_session, user, "full", embedder)
    assert (result.added, result.reused, result.embedded) == (21, 19, 2)
    assert (result.ann, result.indexing) == (False, True)
    assert flags(db_session, user.id) == {False: THRESHOLD + 1}


def test_a_full_build_crossing_down_replaces_every_row_unflagged_reusing_embeddings(
        db_session, embedder):
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD + 5)
    up(db_session, user, "full", embedder)
    index_all(db_session, user)
    before = ids(db_session, user.id)
    for memory in memories[:10]:
        memory.status = "deleted"
    db_session.flush()
    result = up(db_session, user, "full", embedder)
    assert (result.removed, result.added, result.reused, result.embedded) == (25, 15, 15, 0)
    assert (result.ann, result.indexing) == (False, False)
    assert embedder.texts == []
    assert ids(db_session, user.id).isdisjoint(before)  # every row replaced
    assert flags(db_session, user.id) == {False: 15}
    assert ready(db_session, user.id) is False


def test_hysteresis_and_the_truth_check_in_each_state(db_session, embedder):
    """Threshold 20, leave mark 16: ready at 21; down to 19 stays in; below 16 leaves;
    back up to 18 stays out; the truth check agrees each time, and it finds none for a
    user part way in (and asks for the indexing job), one for a wrong flag."""
    user = make_user(db_session)
    memories = saved(db_session, user, THRESHOLD + 1)
    up(db_session, user, embedder=embedder)
    report, found = ann_findings(db_session, user)
    assert (found, report.users_indexing) == ([], 1)  # entering, no row in yet
    index_batch(db_session, user.id, leave=LEAVE, batch=7)
    report, found = ann_findings(db_session, user)
    assert (found, report.users_indexing) == ([], 1)  # part way in
    index_all(db_session, user)
    assert ann_findings(db_session, user)[1] == []

    def delete(few):
        for memory in few:
            memory.status = "deleted"
        db_session.flush()
        return up(db_session, user, embedder=embedder)

    stays = delete(memories[:2])  # 19: below the threshold, above the leave mark
    assert (stays.ann, stays.flipped, stays.indexing) == (True, 0, False)
    assert flags(db_session, user.id) == {True: 19}
    assert ann_findings(db_session, user)[1] == []

    leaves = delete(memories[2:6])  # 15: below the leave mark
    assert (leaves.ann, leaves.flipped, leaves.indexing) == (False, 15, False)
    assert flags(db_session, user.id) == {False: 15}
    assert ann_findings(db_session, user)[1] == []

    saved(db_session, user, 3, start=300)  # 18: between the marks, out it stays
    back = up(db_session, user, embedder=embedder)
    assert (back.ann, back.flipped, back.indexing) == (False, 0, False)
    assert flags(db_session, user.id) == {False: 18}
    report, found = ann_findings(db_session, user)
    assert (found, report.users_indexing) == ([], 0)

    # Wrong: ready with rows outside the index; then rows in the index below the mark.
    db_session.execute(update(MemoryState).where(MemoryState.user_id == user.id)
                       .values(ann_ready=True))
    assert [(v.kind, v.count) for v in ann_findings(db_session, user)[1]] == [("ann_flag", 18)]
    delete(memories[6:9])  # 15: the build takes the user out again
    one = db_session.scalars(select(MemoryChunk.id).where(MemoryChunk.user_id == user.id)
                             .limit(1)).one()
    db_session.execute(update(MemoryChunk).where(MemoryChunk.id == one).values(ann=True))
    assert [(v.kind, v.count) for v in ann_findings(db_session, user)[1]] == [("ann_flag", 1)]


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
    assert (result.ann, result.indexing) == (False, True)
    index_all(db_session, user)
    assert flags(db_session, user.id) == {True: THRESHOLD}


def test_an_indexing_job_past_its_budget_asks_for_its_continuation(app, committed, queue,
                                                                   monkeypatch):
    """It stops after the batch that ran past the budget (0 s: the first) and asks for a
    job of its own id-and-rows-left at that batch's commit; the continuation finishes."""
    from jobs.builds import index_ann

    monkeypatch.setitem(app.config, "ANN_MIN_CHUNKS", THRESHOLD)

    session = committed.session
    user = committed.user()
    user_id = user.id
    saved(session, user, THRESHOLD + 1)
    session.commit()
    run_memory_build(user, "quick", session=session, embedder=HashingEmbedder(),
                     ann_threshold=THRESHOLD)
    session.commit()
    queue.empty()
    settings = EngineSettings(ann_min_chunks=THRESHOLD, ann_index_batch=7)
    outcome = index_user_ann(session, user_id, settings=settings, budget_seconds=0)
    assert (outcome.state, outcome.batches, outcome.continued) == ("indexing", 1, True)
    assert [(queue.fetch_job(j).func_name, queue.fetch_job(j).args, j)
            for j in queue.job_ids] == [
        ("jobs.builds.index_ann", (user_id,), f"ann-index-{user_id}-14")]
    assert flags(session, user_id) == {True: 7, False: 14}
    assert index_ann(user_id) == "ready"
    assert flags(db.session, user_id) == {True: 21}


def test_the_truth_check_asks_again_for_the_indexing_of_a_user_entering(committed, queue):
    """A job lost with Redis: the user stays on the exact scan (right, slower) until the
    truth check, repairing, asks for it again — not a finding, no rebuild."""
    session = committed.session
    user = committed.user()
    user_id = user.id
    saved(session, user, THRESHOLD + 1)
    run_memory_build(user, "quick", session=session, embedder=HashingEmbedder(),
                     ann_threshold=THRESHOLD)
    settle(session)
    session.commit()
    queue.empty()
    report = verify_memory(session, ann_threshold=THRESHOLD, user_ids=[user_id])
    session.commit()
    assert (report.violations, report.users_indexing, report.repairs_requested) == ([], 1, 0)
    assert [queue.fetch_job(j).args for j in queue.job_ids] == [(user_id,)]
