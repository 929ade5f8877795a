"""What the chat recalls for a message: the nearest chunks of the person's memory and
of their teams', each naming whose it is."""

from __future__ import annotations

from sqlalchemy.orm import Session

from dashboard.access import Reach
from dashboard.demotions import demote, demoted_for, widened
from dashboard.memory import Embedder, NothingToSearch, RecallCut, search_memory
from dashboard.orbitpilot.responder import DEFAULT_MEMORY_K, MemoryHit
from dashboard.sources import get_source, source_keys


def memory_hits(session: Session, reach: Reach | int, query: str, *, embedder: Embedder,
                k: int = DEFAULT_MEMORY_K, max_distance: RecallCut = None
                ) -> tuple[MemoryHit, ...]:
    """The chunks nearest the message, of the person's own memory and of every team they
    reach (a user id alone: their own), in one search (each naming whose it is); none
    when it has nothing to search on ("!!!"): the reply still comes, drawing on no
    memory. An item the person marked "not relevant" under a reply ranks last, unsure
    (``demotions``: one query more)."""
    if isinstance(reach, int):
        reach = Reach.personal(reach)
    demoted = demoted_for(session, reach.user_id)
    try:
        hits = search_memory(session, reach.owner_ids, query, widened(k, demoted),
                             embedder=embedder, max_distance=max_distance)
    except NothingToSearch:
        return ()
    hits = demote(hits, demoted, k)
    out = []
    for h in hits:
        seat = reach.seat_of(h.owner_id)
        out.append(MemoryHit(
            h.source_key, get_source(h.source_key).label if h.source_key in source_keys()
            else h.source_key, h.source_id, h.content, float(h.distance), h.chunk_id,
            owner_id=h.owner_id or reach.user_id, team=seat.name if seat else None,
            relevance=h.relevance))
    return tuple(out)
