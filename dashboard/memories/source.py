"""Saved memories as a memory source: each one with status ``active``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.memories.models import Memory
from dashboard.sources import SAVED, Record, Source, Watch


def extract_saved_memories(session: Session, user_id: int) -> list[Record]:
    rows = session.execute(
        select(Memory.id, Memory.content)
        .where(Memory.owner_id == user_id, Memory.status == "active")
        .order_by(Memory.created_at, Memory.id)
    ).all()
    return [Record(SAVED, str(id_), content) for id_, content in rows]


SAVED_SOURCE = Source(
    SAVED, "Saved memories", True, "each memory saved through /v1/memories with status active",
    extract_saved_memories, (Watch(Memory, "owner_id", frozenset({"content", "status"})),))
