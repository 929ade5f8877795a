"""Retrieval: the top k chunks of one owner, or of several at once (a person and their
teams), by cosine distance. An owner whose note says ``ann_ready`` (every row in the
partial HNSW index) gets the index with iterative scans, topped up exactly if it comes
back short; every other owner — below ANN_MIN_CHUNKS, or with the indexing job still
moving rows in — an exact scan (min(k, owned) rows, zero vectors aside, in exact order),
all such owners in one statement. docs/architecture/retrieval.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Boolean, Integer, String, column, func, literal, select, text, values
from sqlalchemy.orm import Session

from dashboard.memory.embedders import (
    Embedder,
    RecallCut,
    embedder_for_model,
    match_distance,
)
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
    owner_id: int = 0  # whose memory it is: the person's, or a team's


def _columns():
    return (MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
            MemoryChunk.chunk_index, MemoryChunk.content)


def _hit(row) -> Hit:
    return Hit(*row[:6], owner_id=row[6])


def _top_exact(owner_ids: Sequence[int] | object, vector: np.ndarray, k: int, model: str):
    """The exact top k (id, distance) of the owners' rows (btree on user_id), each distance
    computed once, before any row is read whole: carrying every row's content through the
    sort took twice as long at 50,000 chunks. MATERIALIZED: whatever indexes come, the
    planner cannot make it anything else."""
    distance = MemoryChunk.embedding.cosine_distance(vector).label("distance")
    owners = MemoryChunk.user_id.in_(owner_ids) if not isinstance(owner_ids, int) \
        else MemoryChunk.user_id == owner_ids
    return (select(MemoryChunk.id, distance)
            .where(owners, MemoryChunk.embedding_model == model)
            .order_by(distance, MemoryChunk.id).limit(k)
            .cte("top").prefix_with("MATERIALIZED"))


def _exact(session: Session, owner_ids: int | Sequence[int], vector: np.ndarray, k: int,
           model: str) -> list[Hit]:
    top = _top_exact(owner_ids, vector, k, model)
    rows = session.execute(
        select(*_columns(), top.c.distance, MemoryChunk.user_id)
        .join(top, top.c.id == MemoryChunk.id)
        .order_by(top.c.distance, top.c.id)
    ).all()
    return [_hit(row) for row in rows]


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
            select(*_columns(), distance.label("distance"), MemoryChunk.user_id)
            # "AND ann" lets the planner use the partial index (its predicate).
            .where(MemoryChunk.user_id == user_id, MemoryChunk.ann,
                   MemoryChunk.embedding_model == model)
            .order_by(distance).limit(k)
        ).all()
    finally:
        savepoint.rollback()
    return [_hit(row) for row in rows]


def search_memory(session: Session, owner_ids: int | Sequence[int], query: str, k: int, *,
                  embedder: Embedder, max_distance: RecallCut = None) -> list[Hit]:
    """The k chunks of ``owner_ids`` (one owner, or a person and their teams) nearest to
    ``query``, nearest first, none farther than ``max_distance`` (``OWN_CUT``: the cut of
    the embedder used; farther is no match). One statement in the common case, however
    many owners; an owner on the HNSW path or still in an old model (a model change under
    way) costs a search of its own, merged in by distance (retrieval.md). A query the
    embedder gives no direction is refused (``NothingToSearch``); distances are finite."""
    k = max(1, min(int(k), 100))
    owners = [owner_ids] if isinstance(owner_ids, int) else list(dict.fromkeys(owner_ids))
    vector = embedder.embed([query])[0]
    if not vector.any() or not np.isfinite(vector).all():
        raise NothingToSearch()
    plain, special = _search_plain(session, owners, vector, k, embedder.name)
    hits = _near(plain, match_distance(embedder, max_distance))
    for owner, ann, model in special:
        hits += _search_owner(session, owner, ann, model, query, vector, k, embedder,
                              max_distance)
    hits.sort(key=lambda h: (h.distance, h.chunk_id))
    return hits[:k]


def _search_plain(session: Session, owners: list[int], vector: np.ndarray, k: int,
                  model: str) -> tuple[list[Hit], list[tuple[int, bool, str]]]:
    """One statement: the exact top k over every owner that is not ``ann_ready`` and whose
    rows are in ``model`` (or who has none), and, as rows without a chunk, the others:
    (owner, ann_ready, their model)."""
    wanted = values(column("owner_id", Integer), name="wanted").data([(o,) for o in owners])
    ready = select(MemoryState.ann_ready).where(MemoryState.user_id == wanted.c.owner_id) \
        .scalar_subquery()
    rows_model = select(MemoryChunk.embedding_model).where(
        MemoryChunk.user_id == wanted.c.owner_id).limit(1).scalar_subquery()
    paths = (select(wanted.c.owner_id, func.coalesce(ready, False).label("ann"),
                    func.coalesce(rows_model, model).label("model"))
             .cte("paths").prefix_with("MATERIALIZED"))
    plain = select(paths.c.owner_id).where(~paths.c.ann, paths.c.model == model)
    top = _top_exact(plain.scalar_subquery(), vector, k, model)
    found = (select(*_columns(), top.c.distance, MemoryChunk.user_id,
                    literal(False, Boolean).label("ann"), literal(None, String).label("model"))
             .join(top, top.c.id == MemoryChunk.id))
    others = (select(literal(None, Integer), literal(None, String), literal(None, String),
                     literal(None, Integer), literal(None, String),
                     literal(None, MemoryChunk.embedding.cosine_distance(vector).type),
                     paths.c.owner_id, paths.c.ann, paths.c.model)
              .where(paths.c.ann | (paths.c.model != model)))
    hits, special = [], []
    for row in session.execute(found.union_all(others)):
        if row[0] is None:
            special.append((row[6], row[7], row[8]))
        else:
            hits.append(_hit(row))
    return hits, special


def _search_owner(session: Session, owner: int, ann: bool, model: str, query: str,
                  vector: np.ndarray, k: int, embedder: Embedder,
                  max_distance: RecallCut) -> list[Hit]:
    """One owner the plain statement left out: the HNSW path, or an old model's (whose
    distances its own cut judges)."""
    if model != embedder.name:
        previous = embedder_for_model(model)
        if previous is None:
            return []
        vector = previous.embed([query])[0]
        if not vector.any() or not np.isfinite(vector).all():
            return []
        embedder = previous
    return _near(_one_owner(session, owner, ann, vector, k, model),
                 match_distance(embedder, max_distance))


def _one_owner(session: Session, owner: int, ann: bool, vector: np.ndarray, k: int,
               model: str) -> list[Hit]:
    if not ann:
        return _exact(session, owner, vector, k, model)
    hits = _hnsw(session, owner, vector, k, model)  # ready: every row is ``ann``
    return hits if len(hits) >= k else _exact(session, owner, vector, k, model)


def _near(hits: list[Hit], max_distance: float | None) -> list[Hit]:
    hits = _finite(hits)
    return hits if max_distance is None else [h for h in hits if h.distance <= max_distance]


def _finite(hits: list[Hit]) -> list[Hit]:
    # A zero-vector chunk's cosine distance is NaN, which PostgreSQL sorts after every
    # number (and the HNSW index leaves out): dropping it after the LIMIT drops only it.
    return [hit for hit in hits if math.isfinite(hit.distance)]
