"""Saved memories as a memory source: each one with status ``active``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.saved_memories.models import Memory
from dashboard.sources import SAVED, Record, Source, Watch, by_user


def extract_many_saved(session: Session, user_ids: list[int]) -> dict[int, list[Record]]:
    rows = session.execute(
        select(Memory.owner_id, Memory.id, Memory.content, Memory.created_at)
        .where(Memory.owner_id.in_(user_ids), Memory.status == "active")
        .order_by(Memory.owner_id, Memory.created_at, Memory.id)
    )
    return by_user(rows, lambda r: Record(SAVED, str(r.id), r.content, r.created_at))


SAVED_SOURCE = Source(
    SAVED, "Saved memories", True, "each memory saved through /v1/memories with status active",
    extract_many_saved, (Watch(Memory, "owner_id", frozenset({"content", "status"})),))
