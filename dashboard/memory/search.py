"""Retrieval: the top k chunks of one owner, or of several at once (a person and their
teams), by cosine distance fused with full-text rank. An owner whose note says
``ann_ready`` (every row in the partial HNSW index) gets the index with iterative scans,
topped up exactly if it comes back short; every other owner — below ANN_MIN_CHUNKS, or
with the indexing job still moving rows in — an exact scan (min(k, owned) rows, zero
vectors aside, in exact order), all such owners in one statement. A query holding names,
codes or identifiers (``memory.lexical``) also ranks the chunks holding them (the
``lexemes`` GIN index) in the same statement, the two lists fused by reciprocal rank; a
chunk holding one survives the recall cut. docs/architecture/retrieval.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    String,
    cast,
    column,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    values,
)
from sqlalchemy.orm import Session

from dashboard.memory.embedders import (
    Embedder,
    QueryVector,
    RecallCut,
    embed_query,
    embedder_for_model,
)
from dashboard.memory.lexical import lexical_terms, names_a_code, tsquery_text
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


SEMANTIC, LEXICAL, BOTH = "semantic", "lexical", "both"
# How sure recall is that a hit is about the query: within the embedder's sure distance
# (or holding the query's identifier) it is ``relevant``; between that and the cut it is
# shown, labelled ``possibly_related``, rather than hidden.
RELEVANT, POSSIBLY_RELATED = "relevant", "possibly_related"


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    source_key: str
    source_id: str
    chunk_index: int
    content: str
    distance: float
    owner_id: int = 0  # whose memory it is: the person's, or a team's
    # How it matched: ``semantic`` (near the query, within the cut), ``lexical`` (it holds
    # a name, code or identifier of the query: kept even beyond the cut) or ``both``.
    match: str = SEMANTIC
    relevance: str = RELEVANT


# Reciprocal rank fusion (Cormack, Clarke & Büttcher, 2009): a chunk scores the sum of
# 1 / (RRF_K + rank) over the lists it is in (rank 1 first; a list it is not in adds
# nothing). 60 is the paper's constant: the top of either list counts, neither dominates.
RRF_K = 60
# How deep each list is read when there are two to fuse: a chunk the vectors rank below
# k still adds its share to one the words found.
FUSION_DEPTH = 20


@dataclass(frozen=True)
class _Found:
    """A hit as one statement found it: whether it was in the vector list, its full-text
    rank (None: no term of the query in it) and its fused score."""

    hit: Hit
    vector: bool
    lexical: float | None
    score: float


def _columns():
    return (MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
            MemoryChunk.chunk_index, MemoryChunk.content)


def _owned(owner_ids: int | Sequence[int] | object):
    return MemoryChunk.user_id == owner_ids if isinstance(owner_ids, int) \
        else MemoryChunk.user_id.in_(owner_ids)


def _top_exact(owner_ids: Sequence[int] | object, vector: np.ndarray, k: int, model: str):
    """The exact top k (id, distance) of the owners' rows (btree on user_id), each distance
    computed once, before any row is read whole: carrying every row's content through the
    sort took twice as long at 50,000 chunks. MATERIALIZED: whatever indexes come, the
    planner cannot make it anything else."""
    distance = MemoryChunk.embedding.cosine_distance(vector).label("distance")
    return (select(MemoryChunk.id, distance)
            .where(_owned(owner_ids), MemoryChunk.embedding_model == model)
            .order_by(distance, MemoryChunk.id).limit(k)
            .cte("top").prefix_with("MATERIALIZED"))


def _top_lexical(owner_ids: Sequence[int] | object, tsquery: str, depth: int, model: str):
    """The owners' rows holding a term of the query (the GIN index on ``lexemes``), best
    full-text rank first: (id, lexical). The model's rows only, as the vector list's."""
    query = func.to_tsquery(literal_column("'simple'::regconfig"), literal(tsquery, String))
    rank = func.ts_rank(MemoryChunk.lexemes, query).label("lexical")
    return (select(MemoryChunk.id, rank)
            .where(_owned(owner_ids), MemoryChunk.embedding_model == model,
                   MemoryChunk.lexemes.op("@@")(query))
            .order_by(rank.desc(), MemoryChunk.id).limit(depth)
            .cte("lexical").prefix_with("MATERIALIZED"))


def _vector_rows(top):
    """The top list's rows whole, in the shape every search reads (vector list only)."""
    return (select(*_columns(), top.c.distance, MemoryChunk.user_id,
                   literal(True, Boolean).label("vector"),
                   cast(null(), Float).label("lexical"), literal(0.0, Float).label("score"))
            .join(top, top.c.id == MemoryChunk.id))


def _fused_rows(top, lexical, vector: np.ndarray, k: int, cut: float | None):
    """The two lists fused by reciprocal rank, k rows read whole: those the cut keeps (in
    the words' list, or near enough) first, by score. A row the words found and the
    vectors did not gets its distance computed here (k rows at most)."""
    # Ties share a rank (rank(), not row_number()): chunks the words rank equally (each
    # holds the query's one identifier once) are not set apart by their ids.
    by_vector = select(top.c.id, top.c.distance, func.rank().over(
        order_by=top.c.distance).label("rank")).subquery("by_vector")
    by_words = select(lexical.c.id, lexical.c.lexical, func.rank().over(
        order_by=lexical.c.lexical.desc()).label("rank")).subquery("by_words")
    score = (func.coalesce(literal(1.0, Float) / (RRF_K + by_vector.c.rank), 0.0)
             + func.coalesce(literal(1.0, Float) / (RRF_K + by_words.c.rank), 0.0))
    chunk_id = func.coalesce(by_vector.c.id, by_words.c.id)
    first = () if cut is None else (  # what the cut keeps
        or_(by_words.c.id.isnot(None), by_vector.c.distance <= cut).desc(),)
    fused = (select(chunk_id.label("id"), by_vector.c.distance, by_words.c.lexical,
                    score.label("score"))
             .select_from(by_vector.join(by_words, by_vector.c.id == by_words.c.id,
                                         full=True))
             .order_by(*first, score.desc(), by_words.c.id.is_(None),
                       by_vector.c.distance.asc().nulls_last(), chunk_id)
             .limit(k).cte("fused"))
    distance = func.coalesce(fused.c.distance, MemoryChunk.embedding.cosine_distance(vector))
    return (select(*_columns(), distance.label("distance"), MemoryChunk.user_id,
                   fused.c.distance.isnot(None).label("vector"), fused.c.lexical,
                   fused.c.score)
            .join(fused, fused.c.id == MemoryChunk.id))


def _found(row, cut: float | None) -> _Found:
    vector, lexical, score = row[7], row[8], row[9]
    near = vector if cut is None else row[5] <= cut  # NaN is never near
    match = (BOTH if near else LEXICAL) if lexical is not None else SEMANTIC
    return _Found(Hit(*row[:6], owner_id=row[6], match=match), bool(vector), lexical,
                  float(score))


def _rank(found: _Found) -> tuple:
    """Best first: by score; on a tie, a chunk holding a term of the query before one
    that is only near (the first of the words' list ties with the first of the vectors'
    when it is not in theirs: the code named is the more specific evidence)."""
    return (-found.score, found.lexical is None, not found.vector, found.hit.distance,
            found.hit.chunk_id)


def _ordered(found: list[_Found], cut: float | None) -> list[_Found]:
    """One statement's hits in its fused order (by distance alone without words), what
    the cut keeps: a chunk holding a term of the query, or one near enough. Distances
    are finite."""
    kept = [f for f in found if f.lexical is not None or cut is None
            or f.hit.distance <= cut]
    kept.sort(key=_rank)
    # A zero-vector chunk's cosine distance is NaN, which PostgreSQL sorts after every
    # number (and the HNSW index leaves out): dropping it after the LIMIT drops only it.
    return [f for f in kept if math.isfinite(f.hit.distance)]


def _exact(session: Session, owner_ids: int | Sequence[int], vector: np.ndarray, k: int,
           model: str, tsquery: str | None = None,
           cut: float | None = None) -> list[_Found]:
    if tsquery is None:
        top = _top_exact(owner_ids, vector, k, model)
        rows = session.execute(_vector_rows(top)).all()
    else:
        depth = max(k, FUSION_DEPTH)
        top = _top_exact(owner_ids, vector, depth, model)
        lexical = _top_lexical(owner_ids, tsquery, depth, model)
        rows = session.execute(_fused_rows(top, lexical, vector, k, cut)).all()
    return _ordered([_found(row, cut) for row in rows], cut)


# hnsw.ef_search of the approximate path (at least k): the candidate list each scan keeps.
# Measured with the index's m=16, ef_construction=64 on one user's 200,000 vectors shaped
# like sentence embeddings (a 32-dimensional subspace plus noise): recall@10 0.92 at 100,
# 0.98 at 200, 0.996 at 400 — see docs/architecture/retrieval.md (and why random vectors differ).
HNSW_EF_SEARCH = 200


def _hnsw(session: Session, user_id: int, vector: np.ndarray, k: int, model: str,
          tsquery: str | None = None, cut: float | None = None) -> list[_Found] | None:
    """The HNSW path, fused with the words' list when there is one; None when the index
    came back with fewer than k rows (the caller tops up exactly)."""
    # Iterative scans keep going until k rows of this user pass the filter; sorts are
    # priced out, so the planner cannot swap in "read all of the user's rows and sort" on
    # a path that exists for users too big for exactly that, and so are bitmap scans —
    # unless the words are looked up too, which only the GIN index's bitmap scan does
    # well (sorting the vector list would still be priced out). The settings are SET
    # LOCAL inside a savepoint that is rolled back afterwards, so they never reach the
    # caller's later statements.
    depth = k if tsquery is None else max(k, FUSION_DEPTH)
    savepoint = session.begin_nested()
    try:
        session.execute(text(
            "SELECT set_config('hnsw.iterative_scan', 'strict_order', true), "
            "set_config('hnsw.ef_search', :ef, true), set_config('enable_sort', 'off', true), "
            "set_config('enable_bitmapscan', :bitmaps, true)"),
            {"ef": str(max(HNSW_EF_SEARCH, depth)),
             "bitmaps": "off" if tsquery is None else "on"})
        distance = MemoryChunk.embedding.cosine_distance(vector).label("distance")
        # "AND ann" lets the planner use the partial index (its predicate).
        mine = (MemoryChunk.user_id == user_id, MemoryChunk.ann,
                MemoryChunk.embedding_model == model)
        if tsquery is None:  # the rows read whole straight off the index
            rows = session.execute(
                select(*_columns(), distance, MemoryChunk.user_id,
                       literal(True, Boolean), cast(null(), Float), literal(0.0, Float))
                .where(*mine).order_by(distance).limit(k)).all()
            short = len(rows) < k
        else:
            top = (select(MemoryChunk.id, distance).where(*mine).order_by(distance)
                   .limit(depth).cte("top").prefix_with("MATERIALIZED"))
            pool = select(func.count()).select_from(top).scalar_subquery()
            rows = session.execute(
                _fused_rows(top, _top_lexical(user_id, tsquery, depth, model), vector, k,
                            cut).add_columns(pool.label("pool"))).all()
            short = not rows or rows[0].pool < k
    finally:
        savepoint.rollback()
    return None if short else _ordered([_found(row, cut) for row in rows], cut)


def search_memory(session: Session, owner_ids: int | Sequence[int], query: str, k: int, *,
                  embedder: Embedder, max_distance: RecallCut = None,
                  hybrid: bool = True) -> list[Hit]:
    """The k chunks of ``owner_ids`` (one owner, or a person and their teams) that best
    match ``query``, best first: nearest by cosine distance, fused by reciprocal rank
    with the chunks holding the query's names, codes and identifiers (``hybrid``; off:
    the vectors alone). None is farther than ``max_distance`` (``OWN_CUT``: the cut of
    the embedder used; farther is no match) unless it holds such a term (its ``match``
    says so). One statement in the common case, however many owners; an owner on the
    HNSW path or still in an old model (a model change under way) costs a search of its
    own, merged in by the same fusion (retrieval.md). A query the embedder gives no
    direction is refused (``NothingToSearch``); distances are finite."""
    k = max(1, min(int(k), 100))
    owners = [owner_ids] if isinstance(owner_ids, int) else list(dict.fromkeys(owner_ids))
    asked = embed_query(embedder, query, max_distance)
    vector = asked.vector
    if not vector.any() or not np.isfinite(vector).all():
        raise NothingToSearch()
    terms = lexical_terms(query) if hybrid else []
    tsquery = tsquery_text(terms) if terms else None
    plain, special = _search_plain(session, owners, vector, k, embedder.name, tsquery,
                                   asked.match_distance)
    codes = names_a_code(terms)
    lists = [_labelled(plain, asked, codes)]
    for owner, ann, model in special:
        lists.append(_search_owner(session, owner, ann, model, query, asked, k, embedder,
                                   max_distance, tsquery, codes))
    return [found.hit for found in _merged(lists)[:k]]


def _labelled(found: list[_Found], asked: QueryVector, codes: bool) -> list[_Found]:
    """Each hit's relevance: ``relevant`` when it holds a term of a query that names a
    code (``names_a_code``) or is within the sure distance, and covers the query
    (``covers``: one pass over those hits' texts; the code proves the subject, not the
    thing asked); ``possibly_related`` otherwise, a chunk holding only a name of the query
    too (no sure distance: sure of whatever the cut keeps)."""
    sure = asked.relevant([f.hit.distance for f in found], [f.hit.content for f in found],
                          [codes and f.lexical is not None for f in found])
    return [f if yes else replace(f, hit=replace(f.hit, relevance=POSSIBLY_RELATED))
            for f, yes in zip(found, sure, strict=True)]


def _merged(lists: list[list[_Found]]) -> list[_Found]:
    """Several statements' hits (an owner on the HNSW path, or in an old model, beside the
    rest) fused again over their union: ranks by distance among the vector lists' hits,
    by full-text rank among the words'. One list is already in its order."""
    lists = [found for found in lists if found]
    if len(lists) < 2:
        return lists[0] if lists else []
    union = [found for each in lists for found in each]
    score = dict.fromkeys((f.hit.chunk_id for f in union), 0.0)
    by_vector = sorted((f for f in union if f.vector),
                       key=lambda f: (f.hit.distance, f.hit.chunk_id))
    by_words = sorted((f for f in union if f.lexical is not None),
                      key=lambda f: (-f.lexical, f.hit.chunk_id))
    for ranked, key in ((by_vector, lambda f: f.hit.distance), (by_words, lambda f: f.lexical)):
        rank, previous = 0, None
        for position, found in enumerate(ranked, 1):
            if position == 1 or key(found) != previous:  # a tie shares the rank (as SQL's)
                rank, previous = position, key(found)
            score[found.hit.chunk_id] += 1.0 / (RRF_K + rank)
    return sorted((replace(f, score=score[f.hit.chunk_id]) for f in union), key=_rank)


def _search_plain(session: Session, owners: list[int], vector: np.ndarray, k: int,
                  model: str, tsquery: str | None, cut: float | None,
                  ) -> tuple[list[_Found], list[tuple[int, bool, str]]]:
    """One statement: the top k over every owner that is not ``ann_ready`` and whose rows
    are in ``model`` (or who has none) — the exact vector list, fused with the words'
    when there are terms — and, as rows without a chunk, the others: (owner, ann_ready,
    their model)."""
    wanted = values(column("owner_id", Integer), name="wanted").data([(o,) for o in owners])
    ready = select(MemoryState.ann_ready).where(MemoryState.user_id == wanted.c.owner_id) \
        .scalar_subquery()
    rows_model = select(MemoryChunk.embedding_model).where(
        MemoryChunk.user_id == wanted.c.owner_id).limit(1).scalar_subquery()
    paths = (select(wanted.c.owner_id, func.coalesce(ready, False).label("ann"),
                    func.coalesce(rows_model, model).label("model"))
             .cte("paths").prefix_with("MATERIALIZED"))
    plain = select(paths.c.owner_id).where(~paths.c.ann, paths.c.model == model) \
        .scalar_subquery()
    if tsquery is None:
        found = _vector_rows(_top_exact(plain, vector, k, model))
    else:
        depth = max(k, FUSION_DEPTH)
        found = _fused_rows(_top_exact(plain, vector, depth, model),
                            _top_lexical(plain, tsquery, depth, model), vector, k, cut)
    found = found.add_columns(literal(False, Boolean).label("ann"),
                              literal(None, String).label("model"))
    others = (select(literal(None, Integer), literal(None, String), literal(None, String),
                     literal(None, Integer), literal(None, String), literal(None, Float),
                     paths.c.owner_id, null(), literal(None, Float), literal(None, Float),
                     paths.c.ann, paths.c.model)
              .where(paths.c.ann | (paths.c.model != model)))
    hits, special = [], []
    for row in session.execute(found.union_all(others)):
        if row[0] is None:
            special.append((row[6], row[10], row[11]))
        else:
            hits.append(_found(row, cut))
    return _ordered(hits, cut), special


def _search_owner(session: Session, owner: int, ann: bool, model: str, query: str,
                  asked: QueryVector, k: int, embedder: Embedder, max_distance: RecallCut,
                  tsquery: str | None, codes: bool) -> list[_Found]:
    """One owner the plain statement left out: the HNSW path, or an old model's (whose
    distances its own cut judges)."""
    if model != embedder.name:
        previous = embedder_for_model(model)
        if previous is None:
            return []
        asked = embed_query(previous, query, max_distance)
        if not asked.vector.any() or not np.isfinite(asked.vector).all():
            return []
    vector, cut = asked.vector, asked.match_distance
    found = _hnsw(session, owner, vector, k, model, tsquery, cut) if ann else None
    if found is None:  # not ready, or short: topped up exactly
        found = _exact(session, owner, vector, k, model, tsquery, cut)
    return _labelled(found, asked, codes)
