"""Reading what is remembered: recall over the owners' chunks, the export of everything
remembered about an owner, and the Memory Status of one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.memory import (
    RELEVANT,
    Embedder,
    MemoryChunk,
    MemoryStatus,
    RecallCut,
    memory_status,
    search_memory,
)
from dashboard.plans.services import UserPlans, resolve_build_sources
from dashboard.saved_memories.models import Memory
from dashboard.saved_memories.rules import Scopes, check_content, check_scope, parse_memory_id
from dashboard.sources import SAVED

MAX_RECALL_K = 50
NO_MATCH = ("No memory matches this closely enough: nothing saved or remembered is about "
            "it, as far as a search can tell.")
NOT_SURE = ("Nothing saved or remembered is clearly about this; the results are only possibly "
            "related.")


@dataclass(frozen=True)
class Recalled:
    content: str
    distance: float
    source_key: str  # the memory source
    source: str  # who it came from: chatgpt, codex, … for saved memories; else the source key
    memory_id: str | None
    source_id: str
    chunk_index: int
    owner_id: int = 0  # whose memory: the caller's own, or a team's account
    # How it matched: "semantic", "lexical" (it holds a name or code of the query, kept
    # even beyond the cut) or "both" (``memory.search``).
    match: str = "semantic"
    # How sure recall is: "relevant", or "possibly_related" (shown rather than hidden).
    relevance: str = RELEVANT


def recall_notice(hits: Sequence[Recalled]) -> str | None:
    """The sentence beside a search's results: none found, or none recall is sure of."""
    if not hits:
        return NO_MATCH
    return None if any(h.relevance == RELEVANT for h in hits) else NOT_SURE


def recall(session: Session, owner_ids: int | Sequence[int], query: str, k: int, *,
           embedder: Embedder, max_distance: RecallCut = None,
           scopes: Scopes = None) -> list[Recalled]:
    """Top-k over the owners' chunks (every source; a person's and their teams' in one
    search), each naming where it came from; a query with nothing to search on is refused
    (``NothingToSearch``, field "query")."""
    check_scope(scopes, "search")
    query = check_content(query, "query")
    owners = [owner_ids] if isinstance(owner_ids, int) else list(owner_ids)
    hits = search_memory(session, owners, query, max(1, min(int(k), MAX_RECALL_K)),
                         embedder=embedder, max_distance=max_distance)
    saved_ids = [parse_memory_id(h.source_id) for h in hits if h.source_key == SAVED]
    origins: dict[str, str] = {}
    if saved_ids:
        origins = {str(id_): source for id_, source in session.execute(
            select(Memory.id, Memory.source).where(
                Memory.id.in_([i for i in saved_ids if i is not None]),
                Memory.owner_id.in_(owners), Memory.status == "active"))}
    out = []
    for hit in hits:
        if hit.source_key == SAVED:
            if hit.source_id not in origins:
                continue  # forgotten in a transaction this one already sees
            out.append(Recalled(hit.content, hit.distance, hit.source_key,
                                origins[hit.source_id], hit.source_id, hit.source_id,
                                hit.chunk_index, hit.owner_id, hit.match,
                                hit.relevance))
        else:
            out.append(Recalled(hit.content, hit.distance, hit.source_key, hit.source_key,
                                None, hit.source_id, hit.chunk_index, hit.owner_id,
                                hit.match, hit.relevance))
    return out


def memory_dict(memory: Memory) -> dict[str, Any]:
    return {
        "id": str(memory.id),
        "content": memory.content,
        "metadata": memory.metadata_ or {},
        "source": memory.source,
        "client_name": memory.client_name,
        "status": memory.status,
        "version": memory.version,
        "created_at": memory.created_at.isoformat(),
        "updated_at": memory.updated_at.isoformat() if memory.updated_at else None,
        "deleted_at": memory.deleted_at.isoformat() if memory.deleted_at else None,
        "redacted_at": memory.redacted_at.isoformat() if memory.redacted_at else None,
    }


def export_memories(session: Session, owner_id: int, *, scopes: Scopes = None
                    ) -> dict[str, Any]:
    """Everything remembered about the owner: the saved memories (every status; redacted
    ones as they are now) and every memory chunk the last builds stored, by source."""
    check_scope(scopes, "export")
    memories = session.scalars(select(Memory).where(Memory.owner_id == owner_id)
                               .order_by(Memory.created_at, Memory.id))
    chunks = session.execute(
        select(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index,
               MemoryChunk.content, MemoryChunk.created_at)
        .where(MemoryChunk.user_id == owner_id)
        .order_by(MemoryChunk.source_key, MemoryChunk.source_id, MemoryChunk.chunk_index))
    return {
        "owner_id": owner_id,
        "exported_at": datetime.now(UTC).isoformat(),
        "memories": [memory_dict(m) for m in memories],
        "chunks": [{"source_key": key, "source_id": sid, "chunk_index": index,
                    "content": content, "created_at": created.isoformat()}
                   for key, sid, index, content, created in chunks],
    }


def status_of(session: Session, user: Any, *, embedder_name: str,
              scopes: Scopes = None) -> MemoryStatus:
    """The Memory Status page's truth for ``user``, for a caller holding memory:read."""
    check_scope(scopes, "status")
    return memory_status(session, user, resolution=resolve_build_sources(user, UserPlans(session)),
                         embedder_name=embedder_name)
