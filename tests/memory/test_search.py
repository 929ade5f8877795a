"""search_memory (§6): top-k by cosine distance within one user's chunks."""

import os

import numpy as np
import pytest
from sqlalchemy import insert

from dashboard.memory.embedders import HashingEmbedder, minilm_available
from dashboard.memory.models import MemoryChunk
from dashboard.memory.pipeline import run_memory_build
from dashboard.memory.search import search_memory
from dashboard.xmemo.models import Memory
from tests.factories import make_user

LEXICAL = [
    "The quarterly tax filing is due on the fifteenth of April.",
    "Ada's sourdough starter needs feeding twice a day with rye flour.",
    "Standup happens at 9:30 every weekday in the blue room.",
    "The Lisbon trip in May: pack light layers and walking shoes.",
    "Renew the car insurance before the end of the month.",
]


def memories_user(db_session, texts):
    user = make_user(db_session)
    db_session.add_all([Memory(owner_id=user.id, content=t) for t in texts])
    db_session.flush()
    return user


def test_lexical_fixture_ranks_the_relevant_chunk_first(db_session):
    embedder = HashingEmbedder()
    user = memories_user(db_session, LEXICAL)
    run_memory_build(user, "quick", session=db_session, embedder=embedder)
    hits = search_memory(db_session, user.id, "when is standup?", 3, embedder=embedder)
    assert hits[0].content.startswith("Standup happens")
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert search_memory(db_session, user.id, "sourdough rye", 1,
                         embedder=embedder)[0].content.startswith("Ada's sourdough")


def _random_chunks(session, user_id, count, rng, offset=0):
    vectors = rng.standard_normal((count, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    session.execute(insert(MemoryChunk), [
        {"user_id": user_id, "source_key": "xmemo.saved", "source_id": str(offset + i),
         "chunk_index": 0, "content_hash": f"{offset + i:064d}", "content": f"c{offset + i}",
         "embedding": vectors[i], "embedding_model": "random"}
        for i in range(count)
    ])


class RandomQuery:
    """An embedder whose query vector is random: the chunks' own model name, so they match."""

    name, dimensions = "random", 384

    def __init__(self, rng) -> None:
        self.rng = rng

    def embed(self, texts):
        vector = self.rng.standard_normal((1, 384)).astype(np.float32)
        return vector / np.linalg.norm(vector)


def user_among_a_crowd(db_session, rng, *, chunks: int):
    """A user with ``chunks`` random chunks (contents c10000…) beside one with 3,000."""
    crowd = make_user(db_session)
    _random_chunks(db_session, crowd.id, 3000, rng)
    user = make_user(db_session)
    _random_chunks(db_session, user.id, chunks, rng, offset=10_000)
    db_session.flush()
    return user


@pytest.mark.parametrize("exact_max", [50_000, 0], ids=["exact", "hnsw-iterative"])
def test_small_user_among_many_always_gets_k_rows_matching_exact_order(db_session, exact_max):
    rng = np.random.default_rng(7)
    small = user_among_a_crowd(db_session, rng, chunks=10)
    hits = search_memory(db_session, small.id, "anything", 10, embedder=RandomQuery(rng),
                         exact_max_chunks=exact_max)
    assert len(hits) == 10
    assert {h.content for h in hits} == {f"c{10_000 + i}" for i in range(10)}
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)


def test_a_user_above_the_exact_threshold_takes_the_hnsw_path_and_gets_k_rows(db_session):
    """EXPLAIN of the very statement search_memory ran shows the HNSW index."""
    from sqlalchemy import event, text

    from dashboard.extensions import db

    rng = np.random.default_rng(11)
    big = user_among_a_crowd(db_session, rng, chunks=200)

    ran: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if "<=>" in statement or "set_config" in statement:
            ran.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        hits = search_memory(db_session, big.id, "anything", 10, embedder=RandomQuery(rng),
                             exact_max_chunks=100)
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert len(hits) == 10
    assert {h.content for h in hits} <= {f"c{10_000 + i}" for i in range(200)}
    (settings, settings_parameters), (statement, parameters) = ran  # HNSW alone: no top-up
    # Its settings stayed inside search_memory: the caller's transaction is as it was.
    assert db_session.execute(text("SHOW enable_sort")).scalar() == "on"
    # Replayed as it ran (settings, then the query), the plan is the HNSW index's.
    cursor = db_session.connection().connection.driver_connection.cursor()
    with db_session.begin_nested() as replay:
        cursor.execute(settings, settings_parameters)
        plan = "\n".join(row[0] for row in cursor.execute("EXPLAIN " + statement, parameters))
        replay.rollback()
    assert "Index Scan using ix_memory_chunks_embedding_hnsw" in plan, plan
    assert "Sort" not in plan, plan


def test_k_is_clamped_and_other_users_are_never_returned(db_session):
    embedder = HashingEmbedder()
    mine = memories_user(db_session, LEXICAL[:2])
    theirs = memories_user(db_session, ["standup standup standup"])
    for user in (mine, theirs):
        run_memory_build(user, "quick", session=db_session, embedder=embedder)
    hits = search_memory(db_session, mine.id, "standup", 1000, embedder=embedder)
    assert len(hits) == 2
    assert all(h.content in LEXICAL for h in hits)


requires_ml = pytest.mark.skipif(
    not minilm_available() and os.environ.get("CI", "").lower() not in {"1", "true"},
    reason="the ml extra (all-MiniLM-L6-v2) is not installed",
)


@requires_ml
def test_semantic_fixture_with_minilm(db_session):
    from dashboard.memory.embedders import get_embedder

    embedder = get_embedder("minilm")  # in CI a missing ml extra fails here, never skips
    user = memories_user(db_session, [
        "I adopted a puppy named Rex last spring.",
        "The quarterly tax filing is due in April.",
        "My favourite city for a weekend away is Lisbon.",
        "I am allergic to peanuts.",
    ])
    result = run_memory_build(user, "quick", session=db_session, embedder=embedder)
    assert result.embedded == 4
    hits = search_memory(db_session, user.id, "my dog", 2, embedder=embedder)
    assert hits[0].content.startswith("I adopted a puppy")
    hits = search_memory(db_session, user.id, "food I must avoid", 1, embedder=embedder)
    assert hits[0].content == "I am allergic to peanuts."
