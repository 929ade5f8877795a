"""``run_memory_build`` and its dry run: extract, chunk, key, then a quick diff (only what
changed since the last build's note, ``MemoryState``) or a full swap, written by COPY in
the caller's transaction — a failed build leaves the previous chunks as they were. A
build moves no rows into the HNSW index beyond a few new ones of a user already in it
(``memory.ann``). docs/architecture/builds.md says why."""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pgvector.psycopg import register_vector
from sqlalchemy import (
    Integer,
    Text,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.memory.ann import plan_for_build, request_indexing
from dashboard.memory.chunking import chunk_text, content_hash
from dashboard.memory.embedders import Embedder
from dashboard.memory.locks import lock_user
from dashboard.memory.models import CHAT_PART, DeletedPart, MemoryChunk, MemoryState
from dashboard.memory.settings import (
    DEFAULT_ANN_INDEX_BATCH,
    DEFAULT_ANN_MIN_CHUNKS,
    ann_leave_mark,
)
from dashboard.plans.services import Resolution, get_plan_for_user, resolve_sources
from dashboard.sources import Parts, Record, extract, get_source, source_keys

ChunkKey = tuple[str, str, int, str]  # (source_key, source_id, chunk_index, content_hash)


@dataclass
class BuildResult:
    mode: str
    added: int = 0
    removed: int = 0
    kept: int = 0
    embedded: int = 0
    reused: int = 0
    # Whether recall takes the HNSW index after the build (the note's ``ann_ready``), how
    # many kept rows it moved out of the index (leaving it), and whether it asked for the
    # indexing job (entering: its rows are moved in by that job, not by the build).
    ann: bool = False
    flipped: int = 0
    indexing: bool = False
    inputs_read_at: datetime | None = None
    snapshot: str | None = None
    resolution: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)


class Fresh(dict[ChunkKey, str]):
    """Chunk key -> text, and each record's time (``ages``, by source and record id)."""

    def __init__(self) -> None:
        super().__init__()
        self.ages: dict[tuple[str, str], datetime | None] = {}


Cutoffs = dict[str, datetime]  # per source: records made before it are not remembered


def fresh_chunks(records: list[Record], cutoffs: Cutoffs | None = None) -> Fresh:
    """The records' chunks by key, leaving out records older than their source's
    retention cutoff (the plan keeps only the last N days)."""
    chunks = Fresh()
    for record in records:
        cutoff = cutoffs.get(record.source_key) if cutoffs else None
        if cutoff is not None and record.at is not None and record.at < cutoff:
            continue
        chunks.ages[(record.source_key, record.source_id)] = record.at
        for index, piece in enumerate(chunk_text(record.text)):
            chunks[(record.source_key, record.source_id, index, content_hash(piece))] = piece
    return chunks


def resolve_for_build(session: Session, user: Any) -> Resolution:
    return resolve_sources(get_plan_for_user(user, session))


def _key(row: Any) -> ChunkKey:
    return (row.source_key, row.source_id, row.chunk_index, row.content_hash)


@dataclass(frozen=True)
class QuickDiff:
    """What a quick update does: stored rows to delete, fresh keys to insert, keys kept.
    A chunk embedded by another model is stale even if its key is fresh."""

    stale: list[Any]
    new_keys: list[ChunkKey]
    kept: list[ChunkKey]


def quick_diff(fresh: dict[ChunkKey, str], stored: list[Any], model: str) -> QuickDiff:
    valid = {_key(r) for r in stored if r.embedding_model == model}
    stale = [r for r in stored if r.embedding_model != model or _key(r) not in fresh]
    new_keys = [key for key in fresh if key not in valid]
    kept = [key for key in fresh if key in valid]
    return QuickDiff(stale, new_keys, kept)


def _stored(session: Session, user_id: int, source_keys: list[str] | None = None):
    query = select(MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
                   MemoryChunk.chunk_index, MemoryChunk.content_hash,
                   MemoryChunk.embedding_model).where(MemoryChunk.user_id == user_id)
    if source_keys is not None:
        query = query.where(MemoryChunk.source_key.in_(source_keys))
    return session.execute(query).all()


# -- what a quick update would do (the build applies it, the dry run counts it) -------------

@dataclass
class StoredSummary:
    """The user's stored chunks in one grouped read: per source, how many; whether any
    was embedded by another model; how many are in the HNSW index."""

    counts: dict[str, int]
    foreign_model: bool
    ann_rows: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def stored_summary(session: Session, user_id: int, model: str, *,
                   exact: bool = True) -> StoredSummary:
    """``exact``: every row's model and flag counted (a build, which sets them right).
    Otherwise (the dry run) the counts per source come from the index alone and the model
    from one row — each build leaves every row of a user with the same one (the ``ann``
    count read with it is a guess, which the dry run never uses) — so
    the read costs index entries, not table rows (1/10 the time at 100,000 chunks)."""
    if not exact:
        one = select(MemoryChunk.embedding_model, MemoryChunk.ann).where(
            MemoryChunk.user_id == user_id).limit(1).subquery()
        rows = session.execute(
            select(MemoryChunk.source_key, func.count(),
                   select(one.c.embedding_model).scalar_subquery(),
                   select(one.c.ann).scalar_subquery())
            .where(MemoryChunk.user_id == user_id).group_by(MemoryChunk.source_key)).all()
        counts = {key: count for key, count, _, _ in rows}
        first_model, first_ann = (rows[0][2], rows[0][3]) if rows else (model, False)
        return StoredSummary(counts, first_model != model,
                             sum(counts.values()) if first_ann else 0)
    counts: dict[str, int] = defaultdict(int)
    foreign, ann_rows = False, 0
    for key, row_model, count, ann in session.execute(
        select(MemoryChunk.source_key, MemoryChunk.embedding_model, func.count(),
               func.count().filter(MemoryChunk.ann))
        .where(MemoryChunk.user_id == user_id)
        .group_by(MemoryChunk.source_key, MemoryChunk.embedding_model)
    ):
        counts[key] += count
        foreign |= row_model != model
        ann_rows += ann
    return StoredSummary(dict(counts), foreign, ann_rows)


@dataclass
class Comparison:
    """A user's stored chunks against what their sources hold now.

    ``dropped``: sources whose every stored chunk goes (not included any more, or gone
    from the registry); ``stale_ids``: other stored rows to delete; ``new``: fresh keys
    to insert, with their text; ``counts``: per source, [added, removed, kept]."""

    dropped: list[str] = field(default_factory=list)
    stale_ids: list[int] = field(default_factory=list)
    new: dict[ChunkKey, str] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    incremental: bool = False
    ages: dict[tuple[str, str], datetime | None] = field(default_factory=dict)

    def record_at(self, key: ChunkKey) -> datetime | None:
        return self.ages.get((key[0], key[1]))

    def total(self, column: int) -> int:
        return sum(c[column] for c in self.counts.values())

    def add_diff(self, fresh: Fresh, diff: QuickDiff) -> None:
        self.ages.update(fresh.ages)
        for key in diff.new_keys:
            self.new[key] = fresh[key]
            self.counts[key[0]][0] += 1
        for row in diff.stale:
            self.stale_ids.append(row.id)
            self.counts[row.source_key][1] += 1
        for key in diff.kept:
            self.counts[key[0]][2] += 1


def compare_everything(session: Session, user_id: int, included: tuple[str, ...], model: str,
                       source_keys: list[str] | None = None, cutoffs: Cutoffs | None = None,
                       ) -> Comparison:
    """Extract, chunk and key every included source (or ``source_keys`` of them) and
    diff against the stored chunks of those sources."""
    comparison = Comparison()
    fresh = fresh_chunks(extract(session, user_id, included), cutoffs)
    comparison.add_diff(fresh, quick_diff(fresh, _stored(session, user_id, source_keys),
                                          model))
    return comparison


def read_note(session: Session, user_id: int) -> tuple[MemoryState | None, bool]:
    """The user's note, and whether it is from another transaction history (one
    statement): a build reads it once, for the comparison, the index and its own note."""
    return tuple(session.execute(
        select(MemoryState, _FROM_ANOTHER_HISTORY).where(MemoryState.user_id == user_id)
    ).first() or (None, False))


def compare_for_quick(session: Session, user_id: int, included: tuple[str, ...], model: str,
                      summary: StoredSummary, cutoffs: Cutoffs | None = None,
                      note: tuple[MemoryState | None, bool] | None = None) -> Comparison:
    """What a quick update changes. It starts from what the stored chunks reflect
    (``MemoryState``, written by the build that stored them): a source no longer included
    loses all its chunks, and a source included then and now is re-read — chat history
    only for the conversations written by a transaction that build could not see (still
    running when it read its inputs, or later), the other sources whole. Without a state,
    or with chunks of another embedding model, it compares everything."""
    state, another_history = note if note is not None else read_note(session, user_id)
    if state is None or summary.foreign_model or state.embedding_model != model \
            or another_history:
        return compare_everything(session, user_id, included, model, cutoffs=cutoffs)

    comparison = Comparison(incremental=True)
    for key, count in summary.counts.items():
        if key not in included:  # not included now, or no longer in the registry
            comparison.dropped.append(key)
            comparison.counts[key][1] += count
    # Re-read in parts: a source in parts that the stored chunks already reflect.
    in_parts = {key: parts for key in included
                if key in state.included_keys and (parts := get_source(key).parts)}
    whole = [key for key in included if key not in in_parts]
    if whole:
        fresh = fresh_chunks(extract(session, user_id, tuple(whole)), cutoffs)
        comparison.add_diff(fresh, quick_diff(fresh, _stored(session, user_id, whole), model))
    for key, parts in in_parts.items():
        _compare_changed_parts(session, user_id, key, parts, state.snapshot,
                               summary.counts.get(key, 0), comparison,
                               (cutoffs or {}).get(key))
    return comparison


# Whether the note's snapshot is ahead of the server's transaction counter: the database
# was restored from a dump or moved by logical replication, which start the counter again
# lower. Every later stamp would then look older than the note, and seen. Read with the
# note, in the same statement.
_FROM_ANOTHER_HISTORY = text(
    "pg_snapshot_xmax(CAST(memory_states.snapshot AS pg_snapshot)) > "
    "pg_snapshot_xmax(pg_current_snapshot())")


def with_own_transaction(snapshot: str, own: str | None) -> str:
    """``snapshot`` with this transaction listed as in progress. PostgreSQL's snapshot
    never lists its own transaction, which then counts as visible as soon as a later one
    has finished: what this transaction writes after a build (a test, a script building
    inside its own transaction) would look seen by that build."""
    if own is None:
        return snapshot
    xmin, xmax, running = snapshot.split(":")
    mine = int(own)
    ids = sorted({int(x) for x in running.split(",") if x} | {mine})
    return f"{min(int(xmin), mine)}:{max(int(xmax), mine + 1)}:{','.join(map(str, ids))}"


# A part (a conversation) the last build may not have seen whole: last written by a
# transaction its snapshot does not see. (The last writer's stamp is enough: a writer waits
# for the one before it, so if the last is visible to the snapshot, every earlier one is.)
# The xmin bound lets the index on (owner, stamp) skip what is certainly visible. A build's
# recorded snapshot lists its own transaction (``with_own_transaction``); a part the
# current transaction wrote is read again as well, for a dry run inside it.
_UNSEEN = (
    "({stamp} >= pg_snapshot_xmin(CAST(:snapshot AS pg_snapshot))"
    "::text::bigint AND NOT pg_visible_in_snapshot({stamp}::text::xid8, "
    "CAST(:snapshot AS pg_snapshot)) OR {stamp} = "
    "pg_current_xact_id_if_assigned()::text::bigint)")


def _unseen_stamp(column: Any, snapshot: str) -> Any:
    return text(_UNSEEN.format(stamp=f"{column.table.name}.{column.name}")).bindparams(
        snapshot=snapshot)


def _unseen(parts: Parts, snapshot: str) -> Any:
    return _unseen_stamp(getattr(parts.model, parts.stamp).expression, snapshot)


# The part a chunk of a source in parts belongs to, spelled as the partial index on chat
# chunks is, with literals: the index is usable whatever plan a prepared statement gets.
_PART = literal_column(CHAT_PART.replace("source_id", "memory_chunks.source_id"), Integer)


def _compare_changed_parts(session: Session, user_id: int, source_key: str, parts: Parts,
                           snapshot: str, stored_total: int, comparison: Comparison,
                           cutoff: datetime | None = None) -> None:
    """A source re-read for the parts (chat history: conversations) written by a
    transaction the last build could not see; the chunks of parts deleted since (their
    tombstones) are removals, and so are chunks older than ``cutoff`` (the plan's
    retention window); every other stored chunk is kept, as nothing it was made from has
    changed. What it reads grows with what changed: with nothing changed, two small
    reads (changed parts, tombstones) and no chunk at all."""
    part_id = parts.model.id  # type: ignore[attr-defined]
    owner = getattr(parts.model, parts.owner)
    # Read once, as a list: each statement of a build sees the database as of its own
    # start, so a query of changed parts run twice can answer differently — a part
    # written between the two would have its stored chunks compared with no fresh
    # records, and all removed. One written after this read is left alone: its writer is
    # not visible in this build's snapshot, so the next build re-reads it.
    changed = list(session.scalars(select(part_id).where(owner == user_id,
                                                         _unseen(parts, snapshot))))
    tombstoned = set(session.scalars(select(DeletedPart.part_id).where(
        DeletedPart.user_id == user_id, DeletedPart.source_key == source_key,
        _unseen_stamp(DeletedPart.__table__.c.xid, snapshot))))
    counts = comparison.counts[source_key]
    if not changed and not tombstoned and cutoff is None:
        counts[2] += stored_total
        return
    part_of = _PART
    aged = MemoryChunk.record_at < cutoff if cutoff is not None else literal(False)
    # A part deleted between the read above and the chunks' read below: ``exists_still``
    # is evaluated with the chunks, so its chunks go and nothing of it goes back in.
    exists_still = part_of.in_(select(part_id).where(owner == user_id))
    fresh = fresh_chunks(parts.extract(session, user_id, changed), {source_key: cutoff}
                         if cutoff else None) if changed else Fresh()
    comparison.ages.update(fresh.ages)
    stored: dict[ChunkKey, int] = {}
    gone: set[str] = {str(part) for part in tombstoned}
    wanted = [*changed, *tombstoned]
    for row in session.execute(
        select(MemoryChunk.id, MemoryChunk.source_key, MemoryChunk.source_id,
               MemoryChunk.chunk_index, MemoryChunk.content_hash,
               exists_still.label("exists_still"), func.coalesce(aged, False).label("aged"))
        .where(MemoryChunk.user_id == user_id,
               # A literal (a registry key, never input): the partial index's predicate.
               MemoryChunk.source_key == literal_column(f"'{source_key}'"),
               or_(part_of.in_(wanted), aged) if wanted else aged)
    ):
        part = row.source_id.partition(":")[0]
        if row.aged or part in gone or not row.exists_still:
            comparison.stale_ids.append(row.id)
            counts[1] += 1
            if not row.exists_still:
                gone.add(part)
        else:
            stored[_key(row)] = row.id
    if gone:  # deleted after its records were read: nothing of it goes back in
        fresh = {key: piece for key, piece in fresh.items()
                 if key[1].partition(":")[0] not in gone}
    for key, id_ in stored.items():
        if key not in fresh:
            comparison.stale_ids.append(id_)
            counts[1] += 1
    for key, piece in fresh.items():
        if key not in stored:
            comparison.new[key] = piece
            counts[0] += 1
    counts[2] += stored_total - counts[1]


# -- the build ---------------------------------------------------------------------------------

def run_memory_build(
    user: Any,
    mode: str,
    *,
    session: Session,
    embedder: Embedder,
    build_id: int | None = None,
    ann_threshold: int = DEFAULT_ANN_MIN_CHUNKS,
    ann_leave: int | None = None,
    ann_batch: int = DEFAULT_ANN_INDEX_BATCH,
) -> BuildResult:
    """Build ``user``'s memory in the caller's transaction; ``ann_threshold`` is the
    ANN_MIN_CHUNKS setting, ``ann_leave`` the mark below which a user leaves the HNSW
    index (default: ANN_LEAVE_FRACTION's default of the threshold), ``ann_batch``
    ANN_INDEX_BATCH. The caller commits (which pushes an indexing job it asked for)."""
    if mode not in ("quick", "full"):
        raise ValueError(f"mode must be 'quick' or 'full', not {mode!r}")
    leave = ann_leave_mark(ann_threshold) if ann_leave is None else ann_leave
    with _gc_paused():
        return _run_memory_build(user, mode, session, embedder, build_id,
                                 (ann_threshold, leave, ann_batch))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a build runs: it makes tens of thousands of
    short-lived, acyclic objects (freed by reference counting anyway), and a full
    collection they trigger walks the whole heap (measured: ~90 ms of a 900 ms build)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run_memory_build(user: Any, mode: str, session: Session, embedder: Embedder,
                      build_id: int | None, marks: tuple[int, int, int]) -> BuildResult:
    threshold, leave, batch = marks
    started = time.perf_counter()
    result = BuildResult(mode=mode)
    lock_user(session, user.id)

    # Taken before anything is read: a change stamped later may not be in this build, nor
    # one by a transaction this snapshot does not see (the dry run re-reads those).
    result.inputs_read_at, snapshot, own = session.execute(select(
        func.clock_timestamp(), func.pg_current_snapshot().cast(Text),
        func.pg_current_xact_id_if_assigned().cast(Text))).one()
    result.snapshot = with_own_transaction(snapshot, own)
    resolution = resolve_for_build(session, user)
    result.resolution = resolution.to_dict()
    included = resolution.included_keys
    cutoffs = resolution.cutoffs(result.inputs_read_at)
    summary = stored_summary(session, user.id, embedder.name)
    # Read under the lock: the indexing job changes ``ann_ready`` only holding it too.
    note = read_note(session, user.id)
    state = note[0]
    ready = bool(state is not None and state.ann_ready)

    replace: list[Any] | None = None  # full, replaced: every stored row (id, key, model)
    if mode == "quick":
        comparison = compare_for_quick(session, user.id, included, embedder.name, summary,
                                       cutoffs, note)
    else:
        fresh = fresh_chunks(extract(session, user.id, included), cutoffs)
        stored = _stored(session, user.id)
        if summary.ann_rows and len(fresh) >= leave:
            # Rows in the HNSW index that stay there: unchanged ones are kept in place.
            comparison = Comparison()
            comparison.add_diff(fresh, quick_diff(fresh, stored, embedder.name))
        else:
            replace = stored
            comparison = Comparison(new=fresh, ages=fresh.ages)
            for row in stored:
                comparison.counts[row.source_key][1] += 1
            for key in fresh:
                comparison.counts[key[0]][0] += 1
    result.timings["extract_ms"] = _ms(started)

    result.added, result.removed = comparison.total(0), comparison.total(1)
    result.kept = comparison.total(2)
    ann = plan_for_build(ready=ready, rows=summary.total, ann_rows=summary.ann_rows,
                         rows_after=summary.total - result.removed + result.added,
                         adding=result.added, threshold=threshold, leave=leave, batch=batch)
    result.ann, result.indexing = ann.ready, ann.index
    reuse_ids: list[int] = []
    if replace is not None:
        reusable = {_key(r): r.id for r in replace if r.embedding_model == embedder.name}
        reuse_ids = [reusable[key] for key in comparison.new if key in reusable]
        to_embed = [key for key in comparison.new if key not in reusable]
    else:
        to_embed = list(comparison.new)
    embed_started = time.perf_counter()
    vectors = embedder.embed([comparison.new[key] for key in to_embed]) if to_embed else []
    result.timings["embed_ms"] = _ms(embed_started)

    write_started = time.perf_counter()
    if replace is not None:  # no row is in the index after this: none goes in
        _replace_all(session, user.id, reuse_ids, build_id, False)
    else:
        _delete_stale(session, user.id, comparison)
        if ann.unflag:  # leaving: out of a partial index is a plain update
            result.flipped = session.execute(
                update(MemoryChunk).where(MemoryChunk.user_id == user.id, MemoryChunk.ann)
                .values(ann=False)).rowcount
    if to_embed:
        _copy_chunks(session, (
            (user.id, key[0], key[1], key[2], key[3], comparison.new[key], vector,
             embedder.name, build_id, ann.new_ann, comparison.record_at(key))
            for key, vector in zip(to_embed, vectors, strict=True)
        ))
    result.timings["write_ms"] = _ms(write_started)

    result.embedded = len(to_embed)
    result.reused = len(reuse_ids)
    result.per_source = {key: {"added": a, "removed": r, "kept": k}
                         for key, (a, r, k) in comparison.counts.items() if a or r or k}
    _record_state(session, user.id, result, included, embedder.name, build_id, state)
    if ann.index:
        request_indexing(session, user.id)
    result.timings["total_ms"] = _ms(started)
    return result


def _delete_stale(session: Session, user_id: int, comparison: Comparison) -> None:
    if comparison.dropped:
        session.execute(delete(MemoryChunk).where(
            MemoryChunk.user_id == user_id, MemoryChunk.source_key.in_(comparison.dropped)))
    if comparison.stale_ids:
        session.execute(delete(MemoryChunk).where(
            MemoryChunk.user_id == user_id,
            MemoryChunk.id == func.any(bindparam("ids", comparison.stale_ids,
                                                 type_=ARRAY(MemoryChunk.id.type)))))


# Delete every row of the user; the rows whose embedding is reused come back as new rows
# (new ids, this build's id) without their vectors ever leaving the server. A row's copy
# is made from the RETURNING of its own deletion, so its key is free by then.
_REPLACE = text(f"""
WITH old AS (
    DELETE FROM {MemoryChunk.__tablename__} WHERE user_id = :user_id
    RETURNING id, source_key, source_id, chunk_index, content_hash, content, embedding,
              embedding_model, record_at
)
INSERT INTO {MemoryChunk.__tablename__} (user_id, source_key, source_id, chunk_index,
    content_hash, content, embedding, embedding_model, build_id, ann, record_at)
SELECT :user_id, source_key, source_id, chunk_index, content_hash, content, embedding,
       embedding_model, :build_id, :ann, record_at
FROM old WHERE id = ANY(:reuse_ids)
""")


def _replace_all(session: Session, user_id: int, reuse_ids: list[int], build_id: int | None,
                 ann: bool) -> None:
    session.execute(_REPLACE.bindparams(
        bindparam("reuse_ids", type_=ARRAY(MemoryChunk.id.type))),
        {"user_id": user_id, "reuse_ids": reuse_ids, "build_id": build_id, "ann": ann})


def _record_state(session: Session, user_id: int, result: BuildResult,
                  included: tuple[str, ...], model: str, build_id: int | None,
                  state: MemoryState | None) -> None:
    """Note what the chunks now reflect (``state``: the note the build started from). A
    build that changed nothing leaves an existing note alone (it still holds: nothing
    read since then differs), so it writes nothing."""
    values = {"inputs_read_at": result.inputs_read_at, "snapshot": result.snapshot,
              "included_keys": list(included), "embedding_model": model,
              "build_id": build_id, "ann_ready": result.ann}
    unchanged = not (result.added or result.removed)
    if unchanged and state is not None and \
            (state.included_keys, state.embedding_model) == (list(included), model):
        if state.ann_ready != result.ann:  # a changed setting, or rows that disagreed
            session.execute(update(MemoryState).where(MemoryState.user_id == user_id)
                            .values(ann_ready=result.ann))
        return
    session.execute(pg_insert(MemoryState).values(user_id=user_id, **values)
                    .on_conflict_do_update(index_elements=[MemoryState.user_id], set_=values))


# -- the dry run -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourcePreview:
    source_key: str
    to_add: int
    to_remove: int
    unchanged: int


def preview_memory_build(user: Any, *, session: Session, embedder_name: str,
                         resolution: Resolution | None = None) -> dict[str, SourcePreview]:
    """What the next quick update would add and remove per source, writing nothing: the
    very comparison the build makes (``compare_for_quick``), counted.
    ``resolution``: the user's, when the caller has it already (a page that resolved the
    plan for this request). Each source's stored chunks are ``to_remove + unchanged``."""
    resolution = resolution or resolve_for_build(session, user)
    summary = stored_summary(session, user.id, embedder_name, exact=False)
    comparison = compare_for_quick(session, user.id, resolution.included_keys, embedder_name,
                                   summary, resolution.cutoffs(datetime.now(UTC)))
    return _as_preview(comparison)


def _as_preview(comparison: Comparison, keys: list[str] | None = None,
                ) -> dict[str, SourcePreview]:
    """Every registry source (and any other source with chunks), in registry order."""
    counts = comparison.counts
    keys = keys or [*source_keys(), *sorted(set(counts) - set(source_keys()))]
    return {key: SourcePreview(key, *counts.get(key, (0, 0, 0))) for key in keys}


_COPY_COLUMNS = ("user_id", "source_key", "source_id", "chunk_index", "content_hash", "content",
                 "embedding", "embedding_model", "build_id", "ann", "record_at")
_COPY_TYPES = ("int4", "varchar", "varchar", "int4", "varchar", "text", "vector", "varchar",
               "int8", "bool", "timestamptz")


def _copy_chunks(session: Session, rows: Iterable[tuple[Any, ...]]) -> None:
    """Binary COPY on the build's own connection (same transaction). Rows not ``ann`` are
    outside the partial HNSW index: they cost what COPY costs."""
    raw = session.connection().connection.driver_connection
    if raw.adapters.types.get("vector") is None:
        register_vector(raw)
    with raw.cursor() as cursor, cursor.copy(
        f"COPY {MemoryChunk.__tablename__} ({', '.join(_COPY_COLUMNS)}) "
        "FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(list(_COPY_TYPES))
        for row in rows:
            copy.write_row(row)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)
