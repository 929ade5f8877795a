"""Retrieval: the top k chunks of one user by cosine distance. A user whose note says
``ann_ready`` (every row in the partial HNSW index) gets the index with iterative scans,
topped up exactly if it comes back short; any other user — below ANN_MIN_CHUNKS, or with
the indexing job still moving rows in — an exact scan (min(k, owned) rows, zero vectors
aside, in exact order). docs/architecture/retrieval.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from dashboard.memory.embedders import Embedder, RecallCut, embedder_for_model, match_distance
from dashboard.memory.models import MemoryChunk, MemoryState
from dashboard.refusals import Refusal

NOTHING_TO_SEARCH = ("There is nothing to search on in this query: it holds no words, only "
                     "punctuation or very common words such as \u201cthe\u201d. Add a word "
                     "or two.")


class NothingToSearch(Refusal):
    """The query embeds to no direction at all (the zero vector): nothing is near it, and
    every cosine distance to it would be NaN."""

    def __init__(self) -> None:
        super().__init__(NOTHING_TO_SEARCH, "query")


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    source_key: str
    source_id: str
    chunk_index: int
    content: str
    distance: float


def _columns():
    return (MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
            MemoryChunk.chunk_index, MemoryChunk.content)


def _exact(session: Session, user_id: int, vector: np.ndarray, k: int,
           model: str) -> list[Hit]:
    # The user's rows (btree on user_id), each distance computed once, the top k kept
    # (a top-N sort of ids and distances), then only those k rows read whole: carrying
    # every row's content through the sort took twice as long at 50,000 chunks.
    # MATERIALIZED: whatever indexes come, the planner cannot make it anything else.
    distance = MemoryChunk.embedding.cosine_distance(vector).label("distance")
    top = (
        select(MemoryChunk.id, distance)
        .where(MemoryChunk.user_id == user_id, MemoryChunk.embedding_model == model)
        .order_by(distance, MemoryChunk.id).limit(k)
        .cte("top").prefix_with("MATERIALIZED")
    )
    rows = session.execute(
        select(*_columns(), top.c.distance)
        .join(top, top.c.id == MemoryChunk.id)
        .order_by(top.c.distance, top.c.id)
    ).all()
    return [Hit(*row) for row in rows]


# hnsw.ef_search of the approximate path (at least k): the candidate list each scan keeps.
# Measured with the index's m=16, ef_construction=64 on one user's 200,000 vectors shaped
# like sentence embeddings (a 32-dimensional subspace plus noise): recall@10 0.92 at 100,
# 0.98 at 200, 0.996 at 400 — see docs/ARCHITECTURE.md (and why random vectors differ).
HNSW_EF_SEARCH = 200


def _hnsw(session: Session, user_id: int, vector: np.ndarray, k: int,
          model: str) -> list[Hit]:
    # Iterative scans keep going until k rows of this user pass the filter; sorts and
    # bitmap scans are priced out, so the planner cannot swap in "read all of the user's
    # rows and sort" on a path that exists for users too big for exactly that. The
    # settings are SET LOCAL inside a savepoint that is rolled back afterwards, so they
    # never reach the caller's later statements.
    savepoint = session.begin_nested()
    try:
        session.execute(text(
            "SELECT set_config('hnsw.iterative_scan', 'strict_order', true), "
            "set_config('hnsw.ef_search', :ef, true), set_config('enable_sort', 'off', true), "
            "set_config('enable_bitmapscan', 'off', true)"),
            {"ef": str(max(HNSW_EF_SEARCH, k))})
        distance = MemoryChunk.embedding.cosine_distance(vector)
        rows = session.execute(
            select(*_columns(), distance.label("distance"))
            # "AND ann" lets the planner use the partial index (its predicate).
            .where(MemoryChunk.user_id == user_id, MemoryChunk.ann,
                   MemoryChunk.embedding_model == model)
            .order_by(distance).limit(k)
        ).all()
    finally:
        savepoint.rollback()
    return [Hit(*row) for row in rows]


def search_memory(session: Session, user_id: int, query: str, k: int, *,
                  embedder: Embedder, max_distance: RecallCut = None) -> list[Hit]:
    """The k chunks of ``user_id`` nearest to ``query``, nearest first, none farther than
    ``max_distance`` (farther is no match: strangers are not presented as memories;
    ``OWN_CUT``: the cut of the embedder the search uses).

    A query the embedder gives no direction (the zero vector: only punctuation or stop
    words for the hashing one) is refused with ``NothingToSearch``; a chunk it gives none
    is near nothing, and never a hit. Every distance returned is finite."""
    k = max(1, min(int(k), 100))
    # One statement: the note's flag tells the path (set only once every row is in the
    # index: until then the exact scan, which is right whatever the rows' flags), one
    # row the model (each build gives every row the same). No count of anyone's rows.
    ready = select(MemoryState.ann_ready).where(MemoryState.user_id == user_id) \
        .scalar_subquery()
    first = session.execute(select(func.coalesce(ready, False), MemoryChunk.embedding_model)
                            .where(MemoryChunk.user_id == user_id).limit(1)).first()
    ann, model = first if first is not None else (False, embedder.name)
    if model != embedder.name:
        # A model change under way: until this user's rebuild is done, their memory is in
        # the old model's vectors, and only a query in that model can be compared with it.
        previous = embedder_for_model(model)
        if previous is None:
            return []
        embedder = previous
    max_distance = match_distance(embedder, max_distance)  # OWN_CUT: this embedder's
    vector = embedder.embed([query])[0]
    if not vector.any() or not np.isfinite(vector).all():
        raise NothingToSearch()
    if not ann:
        return _near(_exact(session, user_id, vector, k, embedder.name), max_distance)
    hits = _hnsw(session, user_id, vector, k, embedder.name)  # ready: every row is ``ann``
    if len(hits) < k:
        hits = _exact(session, user_id, vector, k, embedder.name)
    return _near(hits, max_distance)


def _near(hits: list[Hit], max_distance: float | None) -> list[Hit]:
    hits = _finite(hits)
    return hits if max_distance is None else [h for h in hits if h.distance <= max_distance]


def _finite(hits: list[Hit]) -> list[Hit]:
    # A zero-vector chunk's cosine distance is NaN, which PostgreSQL sorts after every
    # number (and the HNSW index leaves out): dropping it after the LIMIT drops only it.
    return [hit for hit in hits if math.isfinite(hit.distance)]
