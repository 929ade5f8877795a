"""``run_memory_build``: the replace semantics of §6, inside the caller's transaction.

quick: delete every stored chunk whose key is not in the fresh extraction (or that was
       embedded by another model), embed and insert only new keys, keep the rest.
full:  delete every chunk of the user, insert the fresh extraction, reusing the stored
       embedding of any chunk whose key and model are unchanged (embedding dominates cost).

The caller commits: the whole swap is one transaction, so a failed build leaves the
previous chunks exactly as they were."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, Text, delete, exists, func, or_, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dashboard.memory.chunking import chunk_text, content_hash
from dashboard.memory.embedders import Embedder
from dashboard.memory.models import MemoryChunk, MemoryState
from dashboard.orbitpilot.models import Conversation
from dashboard.plans.services import Resolution, get_plan_for_user, resolve_sources
from dashboard.sources import CHAT_HISTORY, SOURCE_KEYS, Record, extract, extract_chat_pairs

# Namespace of the per-user advisory lock (the other half is the user id).
BUILD_LOCK_NAMESPACE = 6_101
DELETE_BATCH = 1000

ChunkKey = tuple[str, str, int, str]  # (source_key, source_id, chunk_index, content_hash)


@dataclass
class BuildResult:
    mode: str
    added: int = 0
    removed: int = 0
    kept: int = 0
    embedded: int = 0
    reused: int = 0
    inputs_read_at: datetime | None = None
    snapshot: str | None = None
    resolution: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)


def fresh_chunks(records: list[Record]) -> dict[ChunkKey, str]:
    chunks: dict[ChunkKey, str] = {}
    for record in records:
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


def lock_user(session: Session, user_id: int) -> None:
    """Serialise one user's builds (transaction-scoped; re-entrant for the same session)."""
    session.execute(select(func.pg_advisory_xact_lock(BUILD_LOCK_NAMESPACE, user_id)))


def run_memory_build(
    user: Any,
    mode: str,
    *,
    session: Session,
    embedder: Embedder,
    build_id: int | None = None,
) -> BuildResult:
    if mode not in ("quick", "full"):
        raise ValueError(f"mode must be 'quick' or 'full', not {mode!r}")
    started = time.perf_counter()
    result = BuildResult(mode=mode)
    lock_user(session, user.id)

    # Taken before anything is read: a change stamped later may not be in this build, nor
    # one by a transaction this snapshot does not see (the dry run re-reads those).
    result.inputs_read_at, result.snapshot = session.execute(select(
        func.clock_timestamp(), func.pg_current_snapshot().cast(Text))).one()
    resolution = resolve_for_build(session, user)
    result.resolution = resolution.to_dict()
    fresh = fresh_chunks(extract(session, user.id, resolution.included_keys))
    stored = _stored(session, user.id)
    result.timings["extract_ms"] = _ms(started)

    per_source: dict[str, dict[str, int]] = defaultdict(lambda: {"added": 0, "removed": 0,
                                                                  "kept": 0})
    reusable: dict[ChunkKey, Any] = {}
    if mode == "quick":
        diff = quick_diff(fresh, stored, embedder.name)
        stale, new_keys = diff.stale, diff.new_keys
        for key in diff.kept:
            per_source[key[0]]["kept"] += 1
        result.kept = len(diff.kept)
    else:
        same_model = {_key(r): r.id for r in stored if r.embedding_model == embedder.name}
        reuse_ids = {same_model[key]: key for key in fresh if key in same_model}
        if reuse_ids:
            for id_, embedding in session.execute(
                select(MemoryChunk.id, MemoryChunk.embedding)
                .where(MemoryChunk.id.in_(list(reuse_ids)))
            ):
                reusable[reuse_ids[id_]] = embedding
        stale, new_keys = list(stored), list(fresh)
    remove_ids = [r.id for r in stale]

    for r in stale:
        per_source[r.source_key]["removed"] += 1
    for key in new_keys:
        per_source[key[0]]["added"] += 1

    to_embed = [key for key in new_keys if key not in reusable]
    embed_started = time.perf_counter()
    vectors = embedder.embed([fresh[key] for key in to_embed]) if to_embed else []
    result.timings["embed_ms"] = _ms(embed_started)
    embeddings = dict(zip(to_embed, vectors, strict=True))
    embeddings.update(reusable)

    write_started = time.perf_counter()
    if mode == "full":
        session.execute(delete(MemoryChunk).where(MemoryChunk.user_id == user.id))
    else:
        for start in range(0, len(remove_ids), DELETE_BATCH):
            batch = remove_ids[start:start + DELETE_BATCH]
            session.execute(delete(MemoryChunk).where(MemoryChunk.id.in_(batch)))
    if new_keys:
        _copy_chunks(session, (
            (user.id, key[0], key[1], key[2], key[3], fresh[key], embeddings[key],
             embedder.name, build_id)
            for key in new_keys
        ))
    result.timings["write_ms"] = _ms(write_started)

    result.added = len(new_keys)
    result.removed = len(remove_ids)
    result.embedded = len(to_embed)
    result.reused = len(reusable)
    result.per_source = dict(per_source)
    _record_state(session, user.id, result, resolution.included_keys, embedder.name,
                  build_id)
    result.timings["total_ms"] = _ms(started)
    return result


def _record_state(session: Session, user_id: int, result: BuildResult,
                  included: tuple[str, ...], model: str, build_id: int | None) -> None:
    """Note what the chunks now reflect. A build that changed nothing leaves an existing
    note alone (it still holds: nothing read since then differs), so it writes nothing."""
    values = {"inputs_read_at": result.inputs_read_at, "snapshot": result.snapshot,
              "included_keys": list(included), "embedding_model": model,
              "build_id": build_id}
    if not (result.added or result.removed):
        state = session.get(MemoryState, user_id)
        if state is not None and (state.included_keys, state.embedding_model) == \
                (list(included), model):
            return
    session.execute(pg_insert(MemoryState).values(user_id=user_id, **values)
                    .on_conflict_do_update(index_elements=[MemoryState.user_id], set_=values))


@dataclass(frozen=True)
class SourcePreview:
    source_key: str
    to_add: int
    to_remove: int
    unchanged: int


def preview_memory_build(user: Any, *, session: Session, embedder_name: str,
                         resolution: Resolution | None = None) -> dict[str, SourcePreview]:
    """What the next quick update would add and remove per source, writing nothing.

    It starts from what the stored chunks reflect (``MemoryState``, written by the build
    that stored them): a source no longer included loses all its chunks, and a source
    included then and now is re-read — chat history only for the conversations written
    by a transaction that build could not see (still running when it read its inputs, or
    later), the other sources whole. Without a state, or with chunks of another
    embedding model, it compares everything, as the build will.
    ``resolution``: the user's, when the caller has it already (a page that resolved the
    plan for this request). Each source's stored chunks are ``to_remove + unchanged``."""
    resolution = resolution or resolve_for_build(session, user)
    included = resolution.included_keys
    state = session.get(MemoryState, user.id)
    stored_counts: dict[str, int] = defaultdict(int)
    foreign_model = False
    for key, model, count in session.execute(
        select(MemoryChunk.source_key, MemoryChunk.embedding_model, func.count())
        .where(MemoryChunk.user_id == user.id)
        .group_by(MemoryChunk.source_key, MemoryChunk.embedding_model)
    ):
        stored_counts[key] += count
        foreign_model |= model != embedder_name
    if state is None or foreign_model or state.embedding_model != embedder_name:
        return _preview_everything(session, user.id, included, embedder_name)

    # Every source not included now loses its chunks, as does a source the registry no
    # longer has (its chunks stay until a build removes them).
    keys = (*SOURCE_KEYS, *sorted(set(stored_counts) - set(SOURCE_KEYS)))
    preview = {key: SourcePreview(key, 0, stored_counts[key], 0) for key in keys
               if key not in included}
    whole = [key for key in included
             if not (key == CHAT_HISTORY and key in state.included_keys)]
    if whole:
        preview.update(_preview_everything(session, user.id, tuple(whole), embedder_name,
                                           keys=whole))
    if CHAT_HISTORY in included and CHAT_HISTORY in state.included_keys:
        preview[CHAT_HISTORY] = _preview_changed_chat(session, user.id, state.snapshot,
                                                      stored_counts[CHAT_HISTORY])
    return {key: preview[key] for key in keys}


def _preview_everything(session: Session, user_id: int, included: tuple[str, ...],
                        embedder_name: str, keys: list[str] | None = None,
                        ) -> dict[str, SourcePreview]:
    """The build's own comparison (extract, chunk, key, ``quick_diff``), for ``keys``
    (default: every source)."""
    stored = _stored(session, user_id, keys)
    diff = quick_diff(fresh_chunks(extract(session, user_id, included)), stored,
                      embedder_name)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for key in diff.new_keys:
        counts[key[0]][0] += 1
    for row in diff.stale:
        counts[row.source_key][1] += 1
    for key in diff.kept:
        counts[key[0]][2] += 1
    keys = keys or [*SOURCE_KEYS, *sorted(set(counts) - set(SOURCE_KEYS))]
    return {key: SourcePreview(key, *counts[key]) for key in keys}


# A conversation the last build may not have seen whole: last written by a transaction its
# snapshot does not see. (The last writer's stamp is enough: a writer waits for the one
# before it, so if the last is visible to the snapshot, every earlier one is.) The xmin
# bound lets the index on (user_id, changed_xid) skip what is certainly visible.
_UNSEEN = text(
    "conversations.changed_xid >= pg_snapshot_xmin(CAST(:snapshot AS pg_snapshot))"
    "::text::bigint AND NOT pg_visible_in_snapshot(conversations.changed_xid::text::xid8, "
    "CAST(:snapshot AS pg_snapshot))")


def _preview_changed_chat(session: Session, user_id: int, snapshot: str,
                          stored_total: int) -> SourcePreview:
    """Chat history re-read for the conversations written by a transaction the last build
    could not see; the chunks of a conversation that no longer exists are removals; every
    other stored chunk is kept, as nothing it was made from has changed. Two statements
    whatever changed: the changed pairs, and the stored chunks of changed or deleted
    conversations (one pass over the user's chat chunks)."""
    changed = select(Conversation.id).where(
        Conversation.user_id == user_id, _UNSEEN.bindparams(snapshot=snapshot))
    conversation_of = func.split_part(MemoryChunk.source_id, ":", 1).cast(Integer)
    exists_still = exists().where(Conversation.id == conversation_of,
                                  Conversation.user_id == user_id)
    fresh = fresh_chunks(extract_chat_pairs(session, user_id, changed))
    stored, gone = set(), 0
    for row in session.execute(
        select(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index,
               MemoryChunk.content_hash, exists_still.label("exists_still"))
        .where(MemoryChunk.user_id == user_id, MemoryChunk.source_key == CHAT_HISTORY,
               or_(conversation_of.in_(changed), ~exists_still))
    ):
        if row.exists_still:
            stored.add(_key(row))
        else:
            gone += 1
    added = sum(key not in stored for key in fresh)
    removed = sum(key not in fresh for key in stored)
    return SourcePreview(CHAT_HISTORY, added, removed + gone, stored_total - removed - gone)


_COPY_COLUMNS = ("user_id", "source_key", "source_id", "chunk_index", "content_hash", "content",
                 "embedding", "embedding_model", "build_id")
_COPY_TYPES = ("int4", "varchar", "varchar", "int4", "varchar", "text", "vector", "varchar",
               "int8")


def _copy_chunks(session: Session, rows: Iterable[tuple[Any, ...]]) -> None:
    """Binary COPY on the build's own connection (same transaction): ~15x faster than
    INSERT for vectors. What remains of a big write is the HNSW index's upkeep."""
    from pgvector.psycopg import register_vector

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
